"""A small bar chart as inline SVG, laid out here so the template only draws it.

No script and no CDN: the page works offline and under a strict
Content-Security-Policy.  Colours come from the stylesheet (classes), not from
``style`` attributes, which that policy forbids.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Optional, Sequence

WIDTH, HEIGHT, GAP = 600, 120, 2


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    value: int
    label: str


@dataclass(frozen=True)
class Chart:
    bars: list[Bar]
    peak: int
    total: int
    width: int = WIDTH
    height: int = HEIGHT


def bars(values: Sequence[int], end: Optional[datetime] = None, width: int = WIDTH, height: int = HEIGHT) -> Chart:
    """One bar per minute, the oldest first; ``end`` (naive UTC) is the end of the last minute,
    for the labels (``22:07: 41 jobs``)."""
    count = len(values)
    peak = max(values, default=0)
    slot = width / count if count else width
    laid = []
    for index, value in enumerate(values):
        high = 0.0 if value <= 0 else max(1.0, (height - 14) * value / peak)  # a non-zero minute stays visible
        label = f"{value} jobs"
        if end is not None:
            minute = end - timedelta(minutes=count - index)
            label = f"{minute:%H:%M}: {label}"
        laid.append(Bar(round(index * slot + GAP / 2, 1), round(height - high, 1), round(max(slot - GAP, 1), 1),
                        round(high, 1), int(value), label))
    return Chart(laid, peak, int(sum(values)), width, height)

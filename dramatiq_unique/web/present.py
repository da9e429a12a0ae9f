"""How the pages show values: Jinja filters (times, durations, user data cut short; autoescaping makes
any markup in it text), and the layouts of the inline SVG charts (no script: a strict CSP holds)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from dramatiq_unique.ops import words
from dramatiq_unique.ops.detail import moment
from dramatiq_unique.ops.words import MAX_DETAIL
from dramatiq_unique.storage.models import utcnow

if TYPE_CHECKING:
    from dramatiq_unique.ops.views import JobView

#: Characters of a value shown in a table cell.
MAX_CELL = 120
#: The overview's chart, px.
WIDTH, HEIGHT, GAP = 600, 120, 2
#: Width of the attempts timeline, px; attempts beyond the last :data:`MAX_ATTEMPTS` are not drawn.
TIMELINE_WIDTH, MAX_ATTEMPTS = 600, 50


def cell(value: Any) -> str:
    return words.one_line(value, MAX_CELL)


def detail(value: Any) -> str:
    """A value as indented JSON (a str as it is), cut to :data:`MAX_DETAIL` characters."""
    if value is None:
        return ""
    return words.cut(value if isinstance(value, str) else words.as_json(value, indent=2), MAX_DETAIL)


def ago(value: Optional[datetime], now: Optional[datetime] = None) -> str:
    """How long ago (or, for a time ahead, in how long): ``12 s ago``, ``in 3 min``."""
    if not isinstance(value, datetime):
        return ""
    seconds = ((now or utcnow()) - value).total_seconds()
    text = words.duration(abs(seconds) * 1000)
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def status_class(status: Any) -> str:
    """A CSS class per status (only letters: a strange status cannot break the attribute)."""
    text = str(getattr(status, "value", status) or "")
    return "st-" + ("".join(c for c in text if c.isalpha()) or "none")


FILTERS: dict[str, Callable[..., Any]] = {
    "cell": cell, "first_line": words.first_line, "detail": detail, "when": words.when, "ago": ago,
    "duration": lambda ms: "" if ms is None else words.duration(ms), "status_class": status_class,
}


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
        label = f"{value} jobs" if end is None else f"{end - timedelta(minutes=count - index):%H:%M}: {value} jobs"
        laid.append(Bar(round(index * slot + GAP / 2, 1), round(height - high, 1), round(max(slot - GAP, 1), 1),
                        round(high, 1), int(value), label))
    return Chart(laid, peak, int(sum(values)), width, height)


@dataclass(frozen=True)
class Span:
    """One attempt drawn on the timeline."""

    attempt: int
    x: float
    width: float
    y: int
    css: str
    label: str


def timeline(job: "JobView", now: Optional[datetime] = None) -> list[Span]:
    """The job's attempts laid out on one time axis, from its creation to its end (or now): for
    each, the time it waited (``a-wait``) and the time it ran (coloured by its outcome)."""
    timed = [(a, moment(a.started_at), moment(a.finished_at)) for a in job.history]
    attempts = [(a, began, ended) for a, began, ended in timed if began is not None][-MAX_ATTEMPTS:]
    if not attempts:
        return []
    start = min(job.created_at or attempts[0][1], attempts[0][1])
    ends = [ended for _, _, ended in attempts if ended is not None]
    open_end = now or utcnow()
    end = max([*ends, job.finished_at or start, *([open_end] if len(ends) < len(attempts) else [])])
    total = max((end - start).total_seconds(), 0.001)
    spans = []
    waited_from = start
    for row, (attempt, began, ended) in enumerate(attempts):
        # What the attempt waited for (since the job was created, or since the attempt before ended).
        waited = max((began - waited_from).total_seconds(), 0.0)
        if waited > 0:
            spans.append(Span(attempt.attempt, round(TIMELINE_WIDTH * (waited_from - start).total_seconds() / total, 1),
                              round(max(TIMELINE_WIDTH * waited / total, 1.0), 1), row * 18, "a-wait",
                              f"attempt {attempt.attempt}: waited {waited * 1000:.0f} ms"))
        waited_from = ended or end
        length = max(((ended or end) - began).total_seconds(), 0.0)
        status = attempt.status or "other"
        css = "a-" + (status if status in ("succeeded", "failed", "retrying", "running") else "other")
        label = f"attempt {attempt.attempt}: {status}, {length * 1000:.0f} ms"
        spans.append(Span(attempt.attempt, round(TIMELINE_WIDTH * (began - start).total_seconds() / total, 1),
                          round(max(TIMELINE_WIDTH * length / total, 2.0), 1), row * 18, css, label))
    return spans

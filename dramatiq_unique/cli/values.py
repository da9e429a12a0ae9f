"""Command-line words as values: times ago, limits."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Optional, Union

from dramatiq_unique.durable.dead import since_of

_AGO = re.compile(r"^(\d+)\s*(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
#: What ``limit`` takes besides a number.
HALT, DEFAULT = "halt", "default"


def since(text: Optional[str]) -> Optional[datetime]:
    """``15m``, ``2h``, ``1d`` (that long ago) or an ISO time (``2026-11-24T21:00``, UTC unless it says);
    the job table's time (naive UTC).  ValueError for anything else."""
    if text is None:
        return None
    text = text.strip()
    ago = _AGO.match(text)
    if ago:
        try:
            return since_of(timedelta(seconds=int(ago.group(1)) * _UNITS[ago.group(2)]))
        except OverflowError:
            raise ValueError(f"--since {text} reaches before the year 1") from None
    try:
        return since_of(datetime.fromisoformat(text))
    except ValueError:
        raise ValueError(f"--since takes 15m, 2h, 1d or an ISO time, not {text!r}") from None


def limit(text: str) -> Union[int, None]:
    """``N`` (a whole number, 0 or more), ``halt`` (0) or ``default`` (None: the declared limit)."""
    word = text.strip().lower()
    if word == HALT:
        return 0
    if word == DEFAULT:
        return None
    if not word.isdigit():
        raise ValueError(f"a limit is a whole number, 'halt' or 'default', not {text!r}")
    return int(word)

"""Jinja filters: times, durations and user data, shown short and escaped.

Job arguments, results and errors are user data of any size: the lists show
them cut to a line, the job page to :data:`MAX_DETAIL` characters, and Jinja's
autoescaping (on for every template) turns any markup in them into text.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Callable, Optional

from dramatiq_unique.storage.models import utcnow

#: Characters of a value shown in a table cell.
MAX_CELL = 120
#: Characters of a value (arguments, result, error) shown on a job's page.
MAX_DETAIL = 20_000
#: Statuses of jobs that still wait (a cancel applies to them).
WAITING = frozenset({"pending", "queued", "retrying"})


def cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def as_json(value: Any, indent: Optional[int] = None) -> str:
    try:
        return json.dumps(value, indent=indent, sort_keys=True, default=repr, ensure_ascii=False)
    except (TypeError, ValueError):  # a cycle, a key JSON cannot write: the repr says enough
        return repr(value)


def cell(value: Any, most: int = MAX_CELL) -> str:
    """A value on one line, cut to ``most`` characters."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else as_json(value)
    return cut(" ".join(text.split()), most)


def first_line(value: Any) -> str:
    """The first line of an error (``RuntimeError: boom``), cut to a cell: its traceback is on the job's page."""
    text = "" if value is None else str(value)
    return cell(text.strip().splitlines()[0] if text.strip() else "")


def detail(value: Any) -> str:
    """A value as indented JSON (a str as it is), cut to :data:`MAX_DETAIL` characters."""
    if value is None:
        return ""
    return cut(value if isinstance(value, str) else as_json(value, indent=2), MAX_DETAIL)


def when(value: Optional[datetime]) -> str:
    """A naive UTC time as ``2026-11-24 22:10:05``."""
    return value.strftime("%Y-%m-%d %H:%M:%S") if isinstance(value, datetime) else ("" if value is None else str(value))


def ago(value: Optional[datetime], now: Optional[datetime] = None) -> str:
    """How long ago (or, for a time ahead, in how long): ``12 s ago``, ``in 3 min``."""
    if not isinstance(value, datetime):
        return ""
    seconds = ((now or utcnow()) - value).total_seconds()
    text = duration(abs(seconds) * 1000)
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def duration(ms: Optional[float]) -> str:
    """Milliseconds in the unit that reads best: ``350 ms``, ``4.2 s``, ``3 min``, ``2 h``, ``5 d``."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"  # pragma: no cover


def status_class(status: Any) -> str:
    """A CSS class per status (only letters: a strange status cannot break the attribute)."""
    text = str(getattr(status, "value", status) or "")
    return "st-" + ("".join(c for c in text if c.isalpha()) or "none")


FILTERS: dict[str, Callable[..., Any]] = {
    "cell": cell, "first_line": first_line, "detail": detail, "when": when, "ago": ago, "duration": duration,
    "status_class": status_class,
}

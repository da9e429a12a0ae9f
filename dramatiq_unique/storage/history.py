"""A job's attempts, kept in its row's ``history`` column (schema version 2).

``history`` is a JSON list, oldest first, of one entry per finished attempt::

    {"attempt": 3, "started_at": "2026-11-24T22:10:01.250", "finished_at": "2026-11-24T22:10:02.004",
     "status": "retrying", "error": "ValueError: boom", "worker": "host:1234:5678"}

``status`` is what the attempt came to: ``succeeded``, ``failed``, ``retrying`` (an error, and another
attempt follows), or ``lost`` (the re-drive found it gone); ``error`` is the first line of the error
(``Type: message``, at most :data:`MAX_ERROR` characters; the full traceback of the last attempt stays in
``last_error``).  Times are naive UTC, as every time of the row.

The entry is appended by the statement that writes the attempt's outcome, in SQL (queries.sql:
update_fenced_with_history, or history_append in peewee's writes), so it costs no read and no statement
of its own; only the last :data:`MAX_ENTRIES` are kept, so a job retried for ever cannot grow its row
without bound.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

import peewee as pw

from dramatiq_unique.storage import queries
from dramatiq_unique.storage.models import dumps

#: Entries kept per row: the oldest goes when another is appended past it.
MAX_ENTRIES = 20
#: Longest ``error`` of an entry, in characters.
MAX_ERROR = 500


def _iso(value: Any) -> Optional[str]:
    return value.isoformat(timespec="milliseconds") if isinstance(value, datetime) else value


def entry(*, attempt: int, started_at: Any, finished_at: Any, status: str, error: Optional[str],
          worker: Optional[str]) -> dict[str, Any]:
    """One attempt, as the history keeps it (see the module docstring)."""
    first = error.split("\n", 1)[0][:MAX_ERROR] if error else None
    return {"attempt": attempt, "started_at": _iso(started_at), "finished_at": _iso(finished_at),
            "status": status, "error": first, "worker": worker}


def values(item: dict[str, Any], keep: int = MAX_ENTRIES) -> dict[str, Any]:
    """The parameters of queries.sql's history_append and update_fenced_with_history."""
    return {"entry": dumps(item), "keep": max(1, int(keep))}


def append(model: type[pw.Model], item: dict[str, Any], keep: int = MAX_ENTRIES) -> pw.Node:
    """The new value of ``history`` with ``item`` appended, for a peewee UPDATE (the re-drive's writes)."""
    return queries.fragment(model, "history_append", values(item, keep))

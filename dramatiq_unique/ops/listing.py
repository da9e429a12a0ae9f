"""The jobs list: every job table of every store, newest first, in keyset pages on ``id`` (the cursor
carries ``"<id>.<source>"``).  A filter no index serves reads id spans, bounded in number and time, so
a page may come back short with a cursor to go on from."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime
from typing import Any, Optional

import peewee as pw

from dramatiq_unique.durable import lookup
from dramatiq_unique.durable.scope import NO_APP
from dramatiq_unique.guard import guarded
from dramatiq_unique.ops import keys
from dramatiq_unique.ops.views import JobRow, Page
from dramatiq_unique.ops.words import first_line, row_key
from dramatiq_unique.storage.models import JobModel, JobStatus
from dramatiq_unique.storage.stores import base_of
from dramatiq_unique.suite import Suite

#: Rows a page holds unless told otherwise, and at most.
DEFAULT_LIMIT = 50
MAX_LIMIT = 1_000
#: Ids one filtered read covers, and reads one page makes at most.
SPAN = 100_000
MAX_SPANS = 10
#: Rows read at a time when a key is matched in Python.
BATCH = 500
#: ms a filtered page goes on reading spans for.
BUDGET_MS = 50
#: A cursor that is past every row (the first page).
TOP = (2**63 - 1, 0)


@dataclasses.dataclass(frozen=True)
class Filters:
    statuses: tuple[str, ...] = ()
    actor: Optional[str] = None
    key: Optional[str] = None
    since: Optional[datetime] = None
    #: The unique keys ``key`` hashes back to, when it does (the index is used).
    unique_keys: Optional[tuple[str, ...]] = None


def parse_cursor(cursor: Optional[str]) -> tuple[int, int]:
    """``"<id>.<source>"`` as ``(id, source)``; ValueError for anything else."""
    if cursor is None or cursor == "":
        return TOP
    head, _, tail = str(cursor).partition(".")
    try:
        ident, source = int(head), int(tail or "0")
    except ValueError:
        raise ValueError(f"not a cursor: {cursor!r} (pass on the cursor a page returned)") from None
    if not 0 <= ident <= TOP[0] or not -1 <= source <= TOP[0]:
        raise ValueError(f"not a cursor: {cursor!r}")
    return ident, source


def parse_statuses(status: Optional[str]) -> tuple[str, ...]:
    known = {s.value for s in JobStatus}
    statuses = tuple(s.strip() for s in (status or "").split(",") if s.strip())
    for s in statuses:
        if s not in known:
            raise ValueError(f"no status {s!r}: one of {', '.join(sorted(known))}")
    return statuses


def _where(suite: "Suite", table: type[JobModel], f: Filters) -> Any:
    cond = table.app.in_((suite.app, NO_APP))
    if f.statuses:
        cond &= table.status.in_(f.statuses)
    if f.actor:
        cond &= table.actor_name == f.actor
    if f.since is not None:
        cond &= table.created_at >= f.since
    if f.unique_keys is not None:
        # No actor can have these words as its key: no row (peewee's IN () would not say so on every dialect).
        cond &= table.unique_key.in_(f.unique_keys) if f.unique_keys else pw.SQL("1 = 0")
    elif f.key:
        cond &= keys.sieve(suite, table, f.key, f.actor)
    return cond


def jobs(
    suite: "Suite", *, status: Optional[str] = None, actor: Optional[str] = None,
    key: Optional[str] = None, since: Optional[datetime] = None, limit: int = DEFAULT_LIMIT,
    cursor: Optional[str] = None,
) -> Page:
    """A page of this app's jobs, newest first: ``status`` one or several (comma-separated), ``key`` in
    words (``customer=42``), ``since`` naive UTC, ``cursor`` the page before's.  ValueError for a bad
    status, key, limit or cursor."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be a whole number from 1 to {MAX_LIMIT}, not {limit!r}")
    key = None if key is None else key.strip()
    if key == "":
        raise ValueError("an empty key")
    f = Filters(parse_statuses(status), actor or None, key, since, keys.derived(suite, actor, key) if key else None)
    position = parse_cursor(cursor)

    answered, down = lookup.each_store(suite, "listing jobs", lambda index, found: [(index, t) for t in found])
    sources = [(source, store, table) for source, (store, table) in enumerate(t for ts in answered for t in ts)]
    with guarded("listing jobs"):
        rows, next_cursor = _read(suite, sources, f, position, limit)
    return Page(rows, next_cursor, [str(e) for e in down])


def _read(
    suite: "Suite", sources: list[tuple[int, int, type[JobModel]]], f: Filters, position: tuple[int, int], limit: int,
) -> tuple[list[JobRow], Optional[str]]:
    found: list[tuple[int, int, JobModel, int]] = []  # (id, source, row, store)
    upper = position
    matching = bool(f.key) and f.unique_keys is None  # rows are matched in Python, after the SQL sieve
    match = (lambda row: keys.matches(suite, row, f.key or "")) if matching else None
    span = SPAN // 5 if matching else SPAN  # every sieved row of a span may come to Python
    # A filter without an index behind it reads id spans; without one, a page is one read (floor None).
    scanning = f.unique_keys is None and bool(f.statuses or f.actor or f.key or f.since)
    floor = None
    began = time.monotonic()
    for _ in range(MAX_SPANS):
        if scanning:
            top = upper[0] if upper != TOP else _edge(sources, pw.fn.MAX, max) + 1
            floor = max(top - span, 0)
        for source, store, table in sources:
            # The rows after ``upper`` in the order (id desc, source desc).
            cond = _where(suite, table, f) & (table.id <= upper[0] if source < upper[1] else table.id < upper[0])
            if floor is not None:
                cond &= table.id >= floor
            found += [(row.id, source, row, store) for row in _take(table, cond, limit + 1, match)]
        found.sort(key=lambda item: (item[0], item[1]), reverse=True)
        if len(found) > limit or floor is None:
            break
        if floor <= _edge(sources, pw.fn.MIN, min) or _older(sources, floor, f.since):
            return [job_row(suite, *item[2:]) for item in found], None
        upper = (floor, -1)
        if (time.monotonic() - began) * 1000 >= BUDGET_MS:
            break
    page = found[:limit]
    rows = [job_row(suite, row, store) for _, _, row, store in page]
    if len(found) > limit:
        return rows, f"{page[-1][0]}.{page[-1][1]}"
    return rows, None if floor is None else f"{upper[0]}.{upper[1]}"


def _take(table: type[JobModel], cond: Any, need: int, match: Any) -> list[JobModel]:
    """The first ``need`` rows of ``table`` under ``cond`` (id desc) that ``match`` (None: all)."""
    if match is None:
        return list(table.select().where(cond).order_by(table.id.desc()).limit(need))
    got: list[JobModel] = []
    below: Optional[int] = None
    while len(got) < need:
        query = table.select().where(cond if below is None else cond & (table.id < below))
        batch = list(query.order_by(table.id.desc()).limit(BATCH))
        got += [row for row in batch if match(row)]
        if len(batch) < BATCH:
            break
        below = batch[-1].id
    return got[:need]


def _edge(sources: list[tuple[int, int, type[JobModel]]], of: Any, pick: Any) -> int:
    """The highest (``pw.fn.MAX``, ``max``) or lowest id of the tables."""
    return pick((t.select(of(t.id)).scalar() or 0 for _, _, t in sources), default=0)


def _older(sources: list[tuple[int, int, type[JobModel]]], floor: int, since: Optional[datetime]) -> bool:
    """Whether every row below ``floor`` was created before ``since`` (ids grow with time):
    the newest row under it, in each table, is older."""
    if since is None:
        return False
    for _, _, t in sources:
        below = t.select(t.created_at).where(t.id < floor).order_by(t.id.desc()).limit(1).scalar()
        if below is not None and below >= since:
            return False
    return True


def job_row(suite: "Suite", row: JobModel, store: int) -> JobRow:
    shared = base_of(type(row)) is JobModel and store == 0
    return JobRow(id=row.id, ref=str(row.id) if shared else row.message_id, message_id=row.message_id,
                  actor=row.actor_name, queue=row.queue_name, status=str(row.status),
                  key=row_key(suite.actor_config(row.actor_name), row), attempts=row.attempts,
                  created_at=row.created_at, started_at=row.started_at, finished_at=row.finished_at,
                  table=type(row)._meta.table_name, store=store, error=first_line(row.last_error))

"""Precompiled statements for the hot paths: a send, an attempt's start, its outcome.

Building a query with peewee costs more Python time than the database
round trip it makes (about 150 us per statement, measured in
tests/benchmarks/bench_throughput.py), and every tracked job makes three
of them.  The SQL text (``queries.sql``, :mod:`dramatiq_unique.storage.queries`;
built here for the statements whose columns vary by call) is rendered once per
model and column set, in the database's own parameter style; values still go through each field's
``db_value`` and rows through ``python_value``, so the results are the
same as peewee's.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from dramatiq_unique.storage import fencing, history, prepared, queries
from dramatiq_unique.storage.models import FINISHED, JobModel, JobStatus, is_postgres


def _params(model: type[JobModel], values: dict[str, Any]) -> list[Any]:
    fields = model._meta.fields
    return [fields[name].db_value(value) for name, value in values.items()]


def to_model(model: type[JobModel], row: Sequence[Any], names: Optional[Sequence[str]] = None) -> JobModel:
    """A model instance from a row of ``names`` (all columns, in ``sorted_fields`` order, by default)."""
    fields = model._meta.sorted_fields if names is None else [model._meta.fields[n] for n in names]
    # Filled as peewee fills a row it selected, without Model.__init__'s setattr per field.
    job = model.__new__(model)
    job.__data__ = {f.name: f.python_value(v) for f, v in zip(fields, row, strict=False)}
    job._dirty = set()  # type: ignore[attr-defined]
    job.__rel__ = {}
    return job


#: The columns an attempt's start reads back: what the middlewares use while it runs and
#: the statement does not already know.  The rest (arguments, options, extra columns) is
#: read when current_job() asks.
START_COLUMNS = ("message_id", "actor_name", "attempts", "unique_key", "fencing_token", "checkpoints")
#: Set on a model instance that holds only START_COLUMNS.
PARTIAL = "_dramatiq_unique_partial"


def _with_defaults(model: type[JobModel], values: dict[str, Any]) -> dict[str, Any]:
    # peewee fills field defaults in Python, not in the schema: so must we.
    out = dict(values)
    for name, default in model._meta.defaults.items():
        name = name.name if hasattr(name, "name") else name
        if name not in out and name != "id":
            out[name] = default() if callable(default) else default
    return out


def _present(model: type[JobModel], values: dict[str, Any]) -> dict[str, Any]:
    # NULLs are left to the columns (all nullable ones default to NULL): fewer parameters to send.
    return {name: value for name, value in _with_defaults(model, values).items() if value is not None}


def _insert_sql(model: type[JobModel], names: tuple[str, ...]) -> str:
    """``INSERT INTO jobs (names) VALUES (marks)``; built here, not in queries.sql: its columns vary by call."""
    db = model._meta.database
    cols = ", ".join(queries.quote(db, model._meta.fields[n].column_name) for n in names)
    return f"INSERT INTO {queries.jobs_table(model)} ({cols}) VALUES ({', '.join([db.param] * len(names))})"


def insert(model: type[JobModel], values: dict[str, Any]) -> int:
    """INSERT one row (field defaults filled in); returns its id."""
    values = _present(model, values)
    names = tuple(values)
    # Kept per column set (those present).
    sql = queries.kept(("insert", model, names, queries.dialect_key(model)),
                       lambda: f"{_insert_sql(model, names)} RETURNING id")
    return prepared.execute(model._meta.database, sql, _params(model, values)).fetchone()[0]


def insert_or_holder(model: type[JobModel], values: dict[str, Any]) -> tuple[Optional[int], Optional[JobModel]]:
    """INSERT one row holding ``values["unique_hold"]``: ``(its id, None)``, or ``(None, the HOLDER_COLUMNS of
    the row of its app that holds the key)``, or ``(None, None)`` when the holder committed after this
    statement began (the caller looks it up).  PostgreSQL: one round trip (the ``holder_unless_inserted``
    block); SQLite, which has no round trip to save: :func:`insert`, raising IntegrityError on the clash.

    Another unique column's clash (the message id, an idempotency hold) raises IntegrityError, as from
    :func:`insert`: only the hold is the conflict's arbiter."""
    if not is_postgres(model._meta.database):
        return insert(model, values), None
    values = _present(model, values)
    names = tuple(values)
    tail = queries.render(model, "holder_unless_inserted")

    def build() -> str:
        db = model._meta.database
        arbiter = f"{queries.quote(db, 'app')}, {queries.quote(db, 'unique_hold')}"
        insert_sql = f"{_insert_sql(model, names)} ON CONFLICT ({arbiter}) DO NOTHING RETURNING id"
        return f"WITH inserted AS ({insert_sql}) {tail.sql}"

    sql = queries.kept(("insert_or_holder", model, names, queries.dialect_key(model)), build)
    params = _params(model, values) + tail.params({"app": values.get("app", ""), "hold": values["unique_hold"]})
    row = prepared.execute(model._meta.database, sql, params).fetchone()
    if row is None:
        return None, None
    if row[1] is None:  # the inserted branch: no message id
        return row[0], None
    return None, to_model(model, row, HOLDER_COLUMNS)


#: Parameters one multi-row INSERT may carry (SQLite allows 32766 since 3.32; PostgreSQL 65535).
MAX_PARAMS = 32_000


def insert_many(model: type[JobModel], rows: list[dict[str, Any]]) -> dict[str, int]:
    """INSERT ``rows`` (field defaults filled in) with ``ON CONFLICT DO NOTHING``, in as few statements as
    the parameter limit allows: ``{message id: row id}`` of the rows inserted; a row whose hold (or
    idempotency key) another job holds is left out, for the caller to look its holder up."""
    if not rows:
        return {}
    filled = [_with_defaults(model, row) for row in rows]
    names = tuple(sorted({name for row in filled for name, value in row.items() if value is not None}))
    db = model._meta.database
    cols = ", ".join(queries.quote(db, model._meta.fields[n].column_name) for n in names)
    mark = "(" + ", ".join([db.param] * len(names)) + ")"
    fields = [model._meta.fields[n] for n in names]
    per = max(1, MAX_PARAMS // len(names))
    out: dict[str, int] = {}
    for start in range(0, len(filled), per):
        chunk = filled[start:start + per]
        sql = (f"INSERT INTO {queries.jobs_table(model)} ({cols}) VALUES {', '.join([mark] * len(chunk))} "
               "ON CONFLICT DO NOTHING RETURNING id, message_id")
        params = [f.db_value(row.get(f.name)) for row in chunk for f in fields]
        out.update((message_id, row_id) for row_id, message_id in db.execute_sql(sql, params).fetchall())
    return out


def holders(model: type[JobModel], holds: list[str], app: str = "") -> dict[str, JobModel]:
    """:func:`holder` for many holds in one query: ``{hold: HOLDER_COLUMNS of its row}``."""
    if not holds:
        return {}
    columns = [getattr(model, name) for name in HOLDER_COLUMNS] + [model.unique_hold]
    query = model.select(*columns).where((model.app == app) & model.unique_hold.in_(holds))
    return {str(row.unique_hold): row for row in query}


#: What :func:`holder` reads of the job that holds a key.
HOLDER_COLUMNS = ("id", "message_id", "revision", "status", "created_at")


def holder(model: type[JobModel], hold: str, app: str = "") -> Optional[JobModel]:
    """The HOLDER_COLUMNS of the row of ``app`` holding ``hold``, if any: one small query, which a burst
    of duplicate sends makes often (:mod:`dramatiq_unique.unique.recent`).  Holds are unique per app."""
    statement = queries.render(model, "holder")
    row = prepared.execute(model._meta.database, statement.sql, statement.params({"app": app, "hold": hold})).fetchone()
    return None if row is None else to_model(model, row, HOLDER_COLUMNS)


def start(
    model: type[JobModel],
    job_id: int,
    *,
    revision: int,
    started_at: Any,
    lease_until: Any,
    worker: str,
    release_hold: bool,
    fencing_token: Optional[int],
    fence_key: Optional[str] = None,
    live_after: Any = None,
    woken_by: Optional[str] = None,
) -> Optional[JobModel]:
    """Mark an attempt running and return the row; None if it finished, was replaced, or
    another attempt of it is running.

    Another attempt runs while the row is ``running`` and its ``lease_until`` is after
    ``live_after`` (None: now); this delivery is then a duplicate (a dead-worker requeue,
    a broker redelivery, a stale copy) and must not run beside it.  A row whose lease
    ran out is a crashed attempt's, which the new one replaces.  ``woken_by`` is a LIKE
    pattern of the ``worker`` that a waker's claim writes on a row it starts ahead of its
    delivery (``<worker id>:woken``, :mod:`dramatiq_unique.parking.prestart`): such a row is the
    woken delivery's own, which its worker thread may start again (the start then
    writes its own ``worker``, so only once).  Any process's: a woken message that could
    not be delivered locally goes through the broker, to any worker.

    With ``fence_key`` (an execution lock was taken), the attempt draws the
    key's next fencing token (:mod:`dramatiq_unique.storage.fencing`).  On
    PostgreSQL the draw, the fencing-out of older attempts and the start
    are one statement, so one synchronous commit; SQLite draws first.
    """
    db = model._meta.database
    merged = fence_key is not None and is_postgres(db)
    now_or_after = started_at if live_after is None else live_after
    if fence_key is not None and not merged:
        # SQLite draws in a statement of its own: look first, so that a refused start (a
        # duplicate delivery) draws no token.  A race past this look costs only a gap in the
        # key's counter; the start below still refuses, and revokes nothing of this job.
        if not startable(model, job_id, revision, now_or_after, woken_by):
            return None
        fencing_token = fencing.draw(model, fence_key, job_id)
    if merged:
        statement = queries.render(model, "start_attempt_fenced", token="drawn_token")
    else:
        statement = queries.render(model, "start_attempt", token="given_or_next_token")
    fields = model._meta.fields
    values = {
        "key": fence_key, "token": fencing_token, "running": JobStatus.RUNNING.value,
        "started_at": fields["started_at"].db_value(started_at),
        "lease_until": fields["lease_until"].db_value(lease_until), "worker": worker,
        "release_hold": 1 if release_hold else 0, "id": job_id, "revision": revision,
        "succeeded": FINISHED[0], "failed": FINISHED[1], "live_after": fields["lease_until"].db_value(now_or_after),
        "woken_by": woken_by or "",
    }
    row = prepared.execute(db, statement.sql, statement.params(values)).fetchone()
    if row is None:
        return None
    job = to_model(model, row, START_COLUMNS)
    job.__data__.update(
        id=job_id, revision=revision, status=JobStatus.RUNNING.value, started_at=started_at,
        lease_until=lease_until, worker=worker,
    )
    setattr(job, PARTIAL, True)
    return job


def startable(model: type[JobModel], job_id: int, revision: int, live_after: Any, woken_by: Optional[str]) -> bool:
    """Whether :func:`start` would take the row now (same conditions, read only)."""
    statement = queries.render(model, "startable")
    values = {
        "id": job_id, "revision": revision, "succeeded": FINISHED[0], "failed": FINISHED[1],
        "running": JobStatus.RUNNING.value, "live_after": model._meta.fields["lease_until"].db_value(live_after),
        "woken_by": woken_by or "",
    }
    return prepared.execute(model._meta.database, statement.sql, statement.params(values)).fetchone() is not None


def update_fenced(
    model: type[JobModel], job_id: int, fencing_token: int, values: dict[str, Any], *,
    attempt: Optional[dict[str, Any]] = None,
) -> int:
    """UPDATE one row only if its fencing token is still ``fencing_token``; returns the row count.

    ``attempt``: an entry appended to the row's ``history`` in the same statement (storage/history.py).
    """
    names = tuple(values)
    appended = attempt is not None
    # Rendered out here: kept() must not be entered again from build() (its lock is not re-entrant).
    append = queries.render(model, "history_append") if appended else None

    def build() -> str:
        db = model._meta.database
        q, p = (lambda name: queries.quote(db, name)), db.param
        sets = ", ".join(f"{q(model._meta.fields[n].column_name)} = {p}" for n in names)
        if append is not None:
            sets += f", {q('history')} = {append.sql}"
        return f"UPDATE {queries.jobs_table(model)} SET {sets} WHERE {q('id')} = {p} AND {q('fencing_token')} = {p}"

    # Built here: its columns vary by call (those given); kept per column set.
    sql = queries.kept(("update_fenced", model, names, appended, queries.dialect_key(model)), build)
    params = _params(model, values)
    if append is not None and attempt is not None:
        params += append.params(history.values(attempt))
    cursor = prepared.execute(model._meta.database, sql, [*params, job_id, fencing_token])
    return cursor.rowcount


#: Broker ids recorded per statement (SQLite allows at most 32,766 parameters).
REFS_PER_STATEMENT = 1_000


def record_refs(model: type[JobModel], refs: dict[int, str]) -> None:
    """Record the broker's ids of sent rows, a statement per thousand; a ref set meanwhile is newer: kept.

    Written by hand: peewee takes longer to build a 500-branch CASE than the
    database takes to run it.  A CTE of VALUES works on PostgreSQL and SQLite.
    """
    items = list(refs.items())
    for first in range(0, len(items), REFS_PER_STATEMENT):
        batch = items[first:first + REFS_PER_STATEMENT]
        statement = queries.build(model, "record_refs", ref_rows=("ref_row", len(batch)))  # not kept: one per length
        prepared.execute(model._meta.database, statement.sql, [value for pair in batch for value in pair])

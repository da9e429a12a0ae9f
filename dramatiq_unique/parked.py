"""The rows of parked jobs: what parking and the deck ask of the job table.

A row is parked when ``status = "pending"`` and ``parked_on`` names its
group (:mod:`dramatiq_unique.parking`).  A parked row may be *reserved* by
a worker process for its deck (:mod:`dramatiq_unique.ondeck`): ``worker``
then reads ``<host>:<pid>:deck`` and ``lease_until`` says when the
reservation ends; other wakers skip it until then.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Optional

import peewee as pw

from . import prepared, sql, sql_parking
from .context import MARKER
from .enqueue import row_fields
from .models import JobModel, JobStatus, after_ms, is_postgres, utcnow

if TYPE_CHECKING:
    from .config import ActorConfig
    from .gates import GroupInfo


def due(model: type[JobModel], group: str, now: Any) -> Any:
    """The rows of ``group`` a waker may claim now."""
    # A parked row that "replace" gave a later due time waits for its own message.
    return (
        (model.parked_on == group)
        & (model.status == JobStatus.PENDING.value)
        & (model.process_after.is_null() | (model.process_after <= now))
        & (model.lease_until.is_null() | (model.lease_until <= now))  # not reserved
    )


def waiting_in(info: "GroupInfo", group: str) -> Optional[float]:
    """ms until a row parked on ``group`` may be claimed: 0 if one may be now, else until the
    first reservation runs out (:mod:`~dramatiq_unique.ondeck`); None if none waits.

    One query, one clock: asked as two ("any due?", then "reserved until?"), a reservation
    that ran out between them looked neither due nor reserved, and its row was stranded.
    """
    model, now = info.model, utcnow()
    free = model.lease_until.is_null() | (model.lease_until <= now)
    free_rows, until = model.select(
        pw.fn.COUNT(pw.Case(None, [(free, 1)], None)), pw.fn.MIN(pw.Case(None, [(free, None)], model.lease_until)),
    ).where(
        (model.parked_on == group) & (model.status == JobStatus.PENDING.value)
        & (model.process_after.is_null() | (model.process_after <= now))
    ).tuples().get()
    if free_rows:
        return 0.0
    if until is None:
        return None
    if isinstance(until, str):  # SQLite hands back text for an aggregate
        until = model.lease_until.python_value(until)
    return max((until - now).total_seconds() * 1000, 0)


def unclaim(model: type[JobModel], row: JobModel, group: str) -> None:
    """Put a claimed row that was not delivered back in its group's queue."""
    model.update(status=JobStatus.PENDING.value, parked_on=group).where(
        (model.id == row.id) & (model.status == JobStatus.QUEUED.value) & model.parked_on.is_null()
    ).execute()


def job_row(config: "ActorConfig", message: Any, unique_key: Optional[str] = None) -> tuple[int, int]:
    """The message's job row id and revision; a message sent without the suite gets a row."""
    marker = message.options.get(MARKER) or {}
    if "id" in marker:
        return int(marker["id"]), int(marker.get("rev", 0))
    fields = row_fields(config, message, None)
    fields["unique_key"] = unique_key
    model = config.model
    try:
        job_id = model.insert(fields).execute()
    except pw.IntegrityError:  # the same message, delivered again
        job_id = model.get(model.message_id == message.message_id).id
    message.options[MARKER] = {**marker, "id": job_id, "rev": 0}
    return int(job_id), 0


# -- reservations (ondeck.py) ---------------------------------------------------------


#: The columns a reservation reads back: what the woken message and its attempt's start need;
#: current_job() reads the rest when asked (``sql.PARTIAL``).
DECK_COLUMNS = (
    "id", "message_id", "actor_name", "queue_name", "args", "kwargs", "options", "status", "revision",
    "attempts", "unique_key", "fencing_token", "checkpoints", "broker_ref", "created_at", "process_after",
)


def as_started(row: JobModel, lease_ms: float, worker: str) -> JobModel:
    """The row as :func:`start_reserved` will make it."""
    now = utcnow()
    started = sql.to_model(type(row), (), ())
    started.__data__ = {
        **row.__data__, "status": JobStatus.RUNNING.value, "attempts": row.attempts + 1,
        "fencing_token": row.fencing_token + 1, "started_at": now, "lease_until": after_ms(lease_ms, now),
        "worker": worker, "parked_on": None,
    }
    setattr(started, sql.PARTIAL, True)
    return started


def reserve(info: "GroupInfo", group: str, marker: str, lease_ms: float) -> Optional[JobModel]:
    """Reserve the first due, unreserved row parked on ``group`` for this process, for
    ``lease_ms``; None if there is none."""
    model = info.model
    db = model._meta.database
    now = utcnow()

    def build() -> str:
        table, _, p = sql._names(model)
        q = sql._quoter(model)
        columns = [model._meta.fields[n].column_name for n in DECK_COLUMNS]
        free = f"({q('lease_until')} IS NULL OR {q('lease_until')} <= {p})"
        waiting = f"{q('parked_on')} = {p} AND {q('status')} = {p} AND {free}"  # SQLite checks the head again
        sets = f"SET {q('worker')} = {p}, {q('lease_until')} = {p}, {q('broker_ref')} = {p} "
        head = sql_parking.queue_head(model, info.order_by)
        if is_postgres(db):
            return (
                f"{sql_parking.no_flush_wait(db)}UPDATE {table} {sets}FROM ({head} FOR UPDATE SKIP LOCKED) AS head "
                f"WHERE {table}.{q('id')} = head.{q('id')} RETURNING {', '.join(f'{table}.{q(c)}' for c in columns)}"
            )
        return f"UPDATE {table} {sets}WHERE {q('id')} = ({head}) AND {waiting} RETURNING {', '.join(map(q, columns))}"

    key = ("reserve", model, info.order_by, sql_parking.no_flush_wait(db), sql._dialect(model))
    statement = sql._compiled(key, build)
    fields = model._meta.fields
    when = fields["lease_until"].db_value(now)
    params = [marker, fields["lease_until"].db_value(after_ms(lease_ms, now)), str(uuid.uuid4()),
              group, JobStatus.PENDING.value, when, when]
    if not is_postgres(db):
        params += [group, JobStatus.PENDING.value, when]
    found = prepared.execute(db, statement, params).fetchone()
    return None if found is None else sql.to_model(model, found, DECK_COLUMNS)


def start_reserved(
    model: type[JobModel], row: JobModel, started: JobModel, marker: str,
    next_rows: Optional[tuple["GroupInfo", str, int]] = None,
) -> tuple[bool, list[JobModel]]:
    """Write the start of a reserved row as ``started`` shows it, and (``next_rows``: group
    info, group, how many) reserve the group's next rows; returns whether the row was
    started (False: it had changed) and the rows reserved.  On PostgreSQL one statement."""
    db = model._meta.database
    info, group, count = next_rows if next_rows is not None else (None, "", 0)
    if count and info is not None and is_postgres(db):
        return _start_and_reserve(model, row, started, marker, info, group, count)

    def build() -> str:
        table, _, p = sql._names(model)
        q = sql._quoter(model)
        return f"UPDATE {table} SET {_start_sets(q, p)} WHERE {_start_where(q, p)}"

    # Compiled once per table: this runs right after the woken job was put on the work
    # queue, and the less Python it takes first, the sooner that job's thread gets going.
    statement = sql._compiled(("start_reserved", model, sql._dialect(model)), build)
    ok = bool(prepared.execute(db, statement, _start_params(model, row, started, marker)).rowcount)
    rows = []
    for _ in range(count if info is not None else 0):
        found = reserve(info, group, marker, info.ttl_ms)
        if found is None:
            break
        rows.append(found)
    return ok, rows


def _start_sets(q: Any, p: str) -> str:
    return (
        f"{q('status')} = {p}, {q('attempts')} = {q('attempts')} + 1, "
        f"{q('fencing_token')} = {q('fencing_token')} + 1, {q('started_at')} = {p}, {q('lease_until')} = {p}, "
        f"{q('worker')} = {p}, {q('parked_on')} = NULL, {q('enqueued_at')} = {p}, {q('missing_since')} = NULL"
    )


def _start_where(q: Any, p: str) -> str:
    return (
        f"{q('id')} = {p} AND {q('status')} = {p} AND {q('worker')} = {p} "
        f"AND {q('fencing_token')} = {p} AND {q('revision')} = {p}"
    )


def _start_params(model: type[JobModel], row: JobModel, started: JobModel, marker: str) -> list:
    fields = model._meta.fields
    when = fields["started_at"].db_value(started.started_at)
    return [
        JobStatus.RUNNING.value, when, fields["lease_until"].db_value(started.lease_until), started.worker, when,
        row.id, JobStatus.PENDING.value, marker, row.fencing_token, row.revision,
    ]


def _start_and_reserve(
    model: type[JobModel], row: JobModel, started: JobModel, marker: str, info: "GroupInfo", group: str, count: int,
) -> tuple[bool, list[JobModel]]:
    """PostgreSQL: the start and the next reservations in one statement (one commit, one round trip)."""
    db = model._meta.database

    def build() -> str:
        table, _, p = sql._names(model)
        q = sql._quoter(model)
        columns = [model._meta.fields[n].column_name for n in DECK_COLUMNS]
        head = f"{sql_parking.queue_head(model, info.order_by, limit=p)} FOR UPDATE SKIP LOCKED"
        return (
            f"WITH started AS (UPDATE {table} SET {_start_sets(q, p)} WHERE {_start_where(q, p)} RETURNING 1), "
            f"reserved AS (UPDATE {table} SET {q('worker')} = {p}, {q('lease_until')} = {p}, "
            f"{q('broker_ref')} = gen_random_uuid()::text FROM ({head}) AS head WHERE {table}.{q('id')} = head.{q('id')} "
            f"RETURNING {', '.join(f'{table}.{q(c)}' for c in columns)}) "
            f"SELECT (SELECT count(*) FROM started), reserved.* FROM (SELECT 1) AS one LEFT JOIN reserved ON true"
        )

    statement = sql._compiled(("start_and_reserve", model, info.order_by), build)
    fields = model._meta.fields
    now = utcnow()
    when = fields["lease_until"].db_value(now)
    params = _start_params(model, row, started, marker) + [
        marker, fields["lease_until"].db_value(after_ms(info.ttl_ms, now)),
        group, JobStatus.PENDING.value, when, when, count,
    ]
    found = prepared.execute(db, statement, params).fetchall()
    ok = bool(found and found[0][0])
    rows = [sql.to_model(model, r[1:], DECK_COLUMNS) for r in found if r[1] is not None]
    return ok, rows

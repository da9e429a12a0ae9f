"""The statements on job rows: a send's insert, an attempt's start and outcome, the parking moves.

Each function runs its named statement of ``queries.sql`` through
:mod:`dramatiq_unique.storage.queries`, which renders it for the model's
table and prepares it on PostgreSQL: on the hot paths peewee's query
builder costs more Python time than the round trip it makes
(docs/discussions/benchmarks.md).  Values still go through each field's
``db_value`` and rows through ``python_value``, so the results are the
same as peewee's.  Writes off the hot paths (a replace, an undone claim, a
revoked attempt's outcome) are peewee queries.

Every write that records an attempt's outcome is conditional on the
attempt's ``fencing_token``: a worker whose lease ran out and whose job
was started again cannot overwrite what the newer attempt wrote.  The
parking moves on the critical path of every hand-over commit without
waiting for the WAL flush (:func:`no_flush_wait` says why that is safe).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any, Literal, Optional, Sequence, Union

import peewee as pw

from dramatiq_unique.errors import DatabaseUnavailable
from dramatiq_unique.observe import events
from dramatiq_unique.storage import conflicts, fencing, history, queries
from dramatiq_unique.storage.models import (
    FINISHED,
    WAITING,
    JobModel,
    JobStatus,
    after_ms,
    dumps,
    is_postgres,
    utcnow,
)

logger = logging.getLogger(__name__)

#: How many times a unique insert retries when the holder it collided with vanished.
MAX_INSERT_ROUNDS = 20
QUEUED = JobStatus.QUEUED.value


def db_errors(action: str):
    """Turn the database's operational errors into :class:`DatabaseUnavailable`."""
    return _DbErrors(action)


class _DbErrors:
    def __init__(self, action: str) -> None:
        self.action = action

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        if exc is not None and isinstance(exc, (pw.OperationalError, pw.InterfaceError)):
            raise DatabaseUnavailable(f"{self.action}: {exc}") from exc
        return False


def get(model: type[JobModel], **where: Any) -> Optional[JobModel]:
    query = model.select()
    for name, value in where.items():
        query = query.where(getattr(model, name) == value)
    return query.first()


def to_model(model: type[JobModel], row: Sequence[Any], names: Optional[Sequence[str]] = None) -> JobModel:
    """A model instance from a row of ``names`` (all columns, in ``sorted_fields`` order, by default)."""
    fields = model._meta.sorted_fields if names is None else [model._meta.fields[n] for n in names]
    # Filled as peewee fills a row it selected, without Model.__init__'s setattr per field.
    job = model.__new__(model)
    job.__data__ = {f.name: f.python_value(v) for f, v in zip(fields, row, strict=False)}
    job._dirty = set()  # type: ignore[attr-defined]
    job.__rel__ = {}
    return job


def _with_defaults(model: type[JobModel], values: dict[str, Any]) -> dict[str, Any]:
    # peewee fills field defaults in Python, not in the schema: so must we.
    out = dict(values)
    for name, default in model._meta.defaults.items():
        name = name.name if hasattr(name, "name") else name
        if name not in out and name != "id":
            out[name] = default() if callable(default) else default
    return out


def _written(model: type[JobModel], values: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The columns ``values`` (by field name) write, and their parameters by column (``db_value``)."""
    fields = model._meta.fields
    params = {}
    for name, value in values.items():
        f = fields[name]
        params[f.column_name] = f.db_value(value)
    return tuple(params), params


def _present(model: type[JobModel], values: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
    # NULLs are left to the columns (all nullable ones default to NULL): fewer parameters to send.
    return _written(model, {name: v for name, v in _with_defaults(model, values).items() if v is not None})


# -- a send's row ---------------------------------------------------------------------


def insert(model: type[JobModel], values: dict[str, Any]) -> int:
    """INSERT one row (field defaults filled in); returns its id.  Raises IntegrityError on a
    message_id or hold clash."""
    written, params = _present(model, values)
    return queries.run(model, "insert", params, written=written).fetchone()[0]


def adopt(model: type[JobModel], fields: dict[str, Any]) -> tuple[int, int]:
    """A row for a message sent without the suite (before set-up, by another producer):
    ``(id, revision)`` of the row inserted, or of the row an earlier delivery of the same
    message inserted (the message id is unique)."""
    try:
        return insert(model, fields), 0
    except pw.IntegrityError:
        row = get(model, message_id=fields["message_id"])
        if row is None:
            raise  # not the message id: another unique column clashed
        return row.id, row.revision


def insert_or_holder(model: type[JobModel], values: dict[str, Any]) -> tuple[Optional[int], Optional[JobModel]]:
    """INSERT one row holding ``values["unique_hold"]``: ``(its id, None)``, or ``(None, the HOLDER_COLUMNS of
    the row of its app that holds the key)``, or ``(None, None)`` when the holder committed after this
    statement began (the caller looks it up).  PostgreSQL: one round trip (``insert_or_holder``); SQLite,
    which has no round trip to save: :func:`insert`, raising IntegrityError on the clash.

    Another unique column's clash (the message id, an idempotency hold) raises IntegrityError, as from
    :func:`insert`: only the hold is the conflict's arbiter."""
    if not is_postgres(model._meta.database):
        return insert(model, values), None
    written, params = _present(model, values)
    params.setdefault("app", "")
    row = queries.run(model, "insert_or_holder", params, written=written).fetchone()
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
    names = sorted({name for row in filled for name, value in row.items() if value is not None})
    fields = [model._meta.fields[n] for n in names]
    written = tuple(f.column_name for f in fields)
    per = max(1, MAX_PARAMS // len(names))
    db = model._meta.database
    out: dict[str, int] = {}
    for start in range(0, len(filled), per):
        chunk = filled[start:start + per]
        sql = queries.rows_statement(model, "insert_many", written, len(chunk))
        params = [f.db_value(row.get(f.name)) for row in chunk for f in fields]
        out.update((message_id, row_id) for row_id, message_id in db.execute_sql(sql, params).fetchall())
    return out


#: What :func:`read_holder` reads of the job that holds a key.
HOLDER_COLUMNS = ("id", "message_id", "revision", "status", "created_at")


def read_holder(model: type[JobModel], hold: str, app: str = "") -> Optional[JobModel]:
    """The HOLDER_COLUMNS of the row of ``app`` holding ``hold``, if any: one small query, which a burst
    of duplicate sends makes often (:mod:`dramatiq_unique.unique.recent`).  Holds are unique per app."""
    row = queries.run(model, "holder", {"app": app, "hold": hold}).fetchone()
    return None if row is None else to_model(model, row, HOLDER_COLUMNS)


def holders(model: type[JobModel], holds: list[str], app: str = "") -> dict[str, JobModel]:
    """:func:`read_holder` for many holds in one query: ``{hold: HOLDER_COLUMNS of its row}``."""
    if not holds:
        return {}
    columns = [getattr(model, name) for name in HOLDER_COLUMNS] + [model.unique_hold]
    query = model.select(*columns).where((model.app == app) & model.unique_hold.in_(holds))
    return {str(row.unique_hold): row for row in query}


class IdempotencyHeld(Exception):
    """Internal: another job already holds the row's idempotency key."""

    def __init__(self, job: JobModel) -> None:
        super().__init__(job.message_id)
        self.job = job


def check_idempotency(model: type[JobModel], fields: dict[str, Any]) -> None:
    """After an insert clashed: raise IdempotencyHeld if the idempotency key was the cause."""
    hold = fields.get("idempotency_hold")
    if hold:
        holder = get(model, app=fields.get("app", ""), idempotency_hold=hold)  # keys are per app
        if holder is not None and holder.message_id != fields["message_id"]:
            raise IdempotencyHeld(holder)


def insert_holding(
    model: type[JobModel], fields: dict[str, Any], hold: str, window_ms: Optional[float], *, full: bool = True
) -> tuple[Optional[int], Optional[JobModel]]:
    """Insert a row holding ``hold``: ``(row id, None)``, or ``(None, holder)`` on a conflict.

    The unique index on ``unique_hold`` decides between racing senders.
    A holder older than ``window_ms`` no longer counts: its hold is
    cleared and the insert tried again.  ``full=False``: the holder may
    carry only :data:`HOLDER_COLUMNS` (a skipped send needs no more).

    An actor whose keys were found held often lately inserts with one
    statement that reads the holder on the clash (:mod:`dramatiq_unique.storage.conflicts`
    says when, and what each way costs); the others insert plainly and read
    the holder after the unique index refused the row.
    """
    db = model._meta.database
    row = {**fields, "unique_hold": hold}
    actor_name = fields["actor_name"]
    inserting = insert_or_holder if conflicts.expect_holder(actor_name) else _plain
    for _ in range(MAX_INSERT_ROUNDS):
        try:
            if db.in_transaction():
                # A savepoint: a clash must not abort the caller's transaction.
                with db.atomic():
                    row_id, found = inserting(model, row)
            else:  # in autocommit a failed INSERT leaves nothing to roll back
                row_id, found = inserting(model, row)
            conflicts.record(actor_name, held=row_id is None)
            if row_id is not None:
                return row_id, None
            # The hold was the arbiter, so an idempotency key's clash went unchecked: it wins, as below.
            check_idempotency(model, fields)
            if found is None:  # it committed after the statement began: read it now
                found = read_holder(model, hold, fields.get("app", ""))
                if found is None:
                    continue  # and released its hold already
        except pw.IntegrityError:
            conflicts.record(actor_name, held=True)
            check_idempotency(model, fields)
            found = read_holder(model, hold, fields.get("app", ""))
            if found is None:
                if get(model, message_id=fields["message_id"]) is not None:
                    raise  # not the hold: this message already has a row
                continue  # it released its hold meanwhile
        if found.message_id == fields["message_id"]:
            return None, found
        if _outlived(found, window_ms):
            model.update(unique_hold=None).where(
                (model.id == found.id) & (model.unique_hold == hold)
            ).execute()
            continue
        return None, (get(model, id=found.id) or found) if full else found
    raise DatabaseUnavailable(f"could not settle the unique hold {hold!r}")


def _plain(model: type[JobModel], row: dict[str, Any]) -> tuple[Optional[int], Optional[JobModel]]:
    return insert(model, row), None  # a clash raises IntegrityError


def holder(model: type[JobModel], hold: str, window_ms: Optional[float], app: str = "") -> Optional[JobModel]:
    """The job of ``app`` holding ``hold`` (:data:`HOLDER_COLUMNS` of it), if one does and, with
    ``window_ms``, was sent less than that long ago."""
    job = read_holder(model, hold, app)
    return None if job is None or _outlived(job, window_ms) else job


def _outlived(job: JobModel, window_ms: Optional[float]) -> bool:
    """Whether a holder was sent longer than ``window_ms`` ago (never, without a window)."""
    return window_ms is not None and job.created_at <= after_ms(-window_ms)


def replace(
    model: type[JobModel], holder: JobModel, hold: str, args: list, kwargs: dict, process_after: datetime,
    *, held: Optional[dict[str, Any]] = None,
) -> Optional[JobModel]:
    """Give a waiting holder new arguments and due time (and ``held``: outbox.Block.stamp's writes for a
    replace held until the caller's commit); None if it is no longer waiting."""
    updated = (
        model.update(args=args, kwargs=kwargs, process_after=process_after, revision=model.revision + 1, **(held or {}))
        .where((model.id == holder.id) & (model.unique_hold == hold) & model.status.in_(WAITING))
        .returning(model)
        .execute()
    )
    rows = list(updated)
    return rows[0] if rows else None


def unclaim_sends(
    model: type[JobModel], ids: list[int], status: str, *, ref: Union[str, list[str], None] = None,
    options: Optional[dict] = None,
) -> None:
    """Hand rows claimed for a send whose publish failed back to ``status`` (the re-drive
    sends them later).  Only rows still queued without a broker id: a publish that did go
    through recorded one, and a start or a newer claim moved the row on.  ``ref``: rows a
    send wrote with the broker id ``ref`` (or one of a list, durable/outbox.py) before its publish
    failed (durable/deferral.py), whose id goes too; ``options`` replaces theirs.

    Not for a parked row's claim (:func:`unclaim`): that claim writes the woken message's
    broker id before it publishes, and its undo parks the row on its group again.
    """
    fields: dict[str, Any] = {"status": status, "enqueued_at": None}
    if ref is not None:
        fields["broker_ref"] = None
    if options is not None:
        fields["options"] = options
    if ref is None:
        published = model.broker_ref.is_null()
    else:
        published = model.broker_ref.in_(ref) if isinstance(ref, list) else model.broker_ref == ref
    model.update(**fields).where(model.id.in_(ids) & (model.status == QUEUED) & published).execute()


def record_refs(model: type[JobModel], refs: dict[int, str]) -> None:
    """Record the broker's ids of sent rows, in one statement; a ref set meanwhile is newer: kept.

    Written by hand: peewee takes longer to build a 500-branch CASE than the
    database takes to run it.  The pairs go as two arrays (PostgreSQL) or one
    JSON list (SQLite): one statement whatever their number.
    """
    if not refs:
        return
    if is_postgres(model._meta.database):
        params: dict[str, Any] = {"ids": list(refs), "refs": list(refs.values())}
    else:
        params = {"refs": dumps([[row_id, ref] for row_id, ref in refs.items()])}
    queries.run(model, "record_refs", params)


# -- an attempt -----------------------------------------------------------------------

#: ms a running row's lease is still honoured after it ran out by this process's clock,
#: before a new delivery of the job may replace its attempt.  Leases are written with
#: the clock of the process that runs the attempt; a duplicate delivery judges them with
#: its own.  Hosts kept in step by NTP differ by a few ms; this covers a second of skew,
#: at the cost of a crashed attempt's redelivery waiting that much longer.
LEASE_SKEW_MS = 1_000
#: The ``worker`` of a row a waker's claim started ahead of its delivery (parking/waking.py, parking/deck.py
#: write ``<worker id>:woken``), as a LIKE pattern.
WOKEN = "%:woken"
#: The columns an attempt's start reads back: what the middlewares use while it runs and
#: the statement does not already know.  The rest (arguments, options, extra columns) is
#: read when current_job() asks.
START_COLUMNS = ("message_id", "actor_name", "attempts", "unique_key", "fencing_token", "checkpoints")
#: Set on a model instance that holds only some columns (START_COLUMNS, DECK_COLUMNS).
PARTIAL = "_dramatiq_unique_partial"


def start(
    model: type[JobModel],
    job_id: int,
    *,
    revision: int,
    lease_ms: float,
    worker: str,
    release_hold: bool,
    fencing_token: Optional[int] = None,
    fence_key: Optional[str] = None,
    woken_by: Optional[str] = None,
) -> Optional[JobModel]:
    """Mark an attempt running and return the row; None if the job finished or was replaced
    meanwhile, or if another attempt of it is running under a live lease.

    Another attempt runs while the row is ``running`` and its ``lease_until`` is after now,
    less :data:`LEASE_SKEW_MS`; this delivery is then a duplicate (a dead-worker requeue,
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
    now = utcnow()
    lease_until = after_ms(lease_ms, now)
    fields = model._meta.fields
    values = {
        "key": fence_key, "token": fencing_token, "running": JobStatus.RUNNING.value,
        "started_at": fields["started_at"].db_value(now), "lease_until": fields["lease_until"].db_value(lease_until),
        "worker": worker, "release_hold": 1 if release_hold else 0, "id": job_id, "revision": revision,
        "succeeded": FINISHED[0], "failed": FINISHED[1],
        "live_after": fields["lease_until"].db_value(after_ms(-LEASE_SKEW_MS, now)), "woken_by": woken_by or "",
    }
    merged = fence_key is not None and is_postgres(model._meta.database)
    if fence_key is not None and not merged:
        # SQLite draws in a statement of its own: look first, so that a refused start (a
        # duplicate delivery) draws no token.  A race past this look costs only a gap in the
        # key's counter; the start below still refuses, and revokes nothing of this job.
        if queries.run(model, "startable", values).fetchone() is None:
            return None
        values["token"] = fencing.draw(model, fence_key, job_id)
    row = queries.run(model, "start_attempt_fenced" if merged else "start_attempt", values).fetchone()
    if row is None:
        return None
    job = to_model(model, row, START_COLUMNS)
    job.__data__.update(
        id=job_id, revision=revision, status=JobStatus.RUNNING.value, started_at=now,
        lease_until=lease_until, worker=worker,
    )
    setattr(job, PARTIAL, True)
    return job


def update_fenced(
    model: type[JobModel], job_id: int, fencing_token: int, values: dict[str, Any], *,
    attempt: Optional[dict[str, Any]] = None,
) -> int:
    """UPDATE one row only if its fencing token is still ``fencing_token``; returns the row count.

    ``attempt``: an entry appended to the row's ``history`` in the same statement (storage/history.py).
    """
    written, params = _written(model, values)
    params["row_id"], params["attempt_token"] = job_id, fencing_token
    if attempt is None:
        return queries.run(model, "update_fenced", params, written=written).rowcount
    params.update(history.values(attempt))
    return queries.run(model, "update_fenced_with_history", params, written=written).rowcount


def finish(model: type[JobModel], job: JobModel, *, release_hold: bool, **fields: Any) -> bool:
    """Record an attempt's outcome, fenced by the attempt's token, and append it to the row's history
    (storage/history.py); False if a newer attempt owns the row."""
    if release_hold:
        fields["unique_hold"] = None
    count = update_fenced(model, job.id, job.fencing_token, fields, attempt=attempt_of(job, fields))
    if not count:
        events.fenced_out(job, "outcome")
    return bool(count)


def finish_revoked(model: type[JobModel], job: JobModel, *, release_hold: bool, **fields: Any) -> bool:
    """Record the outcome of an attempt whose token another job of its key took, if no newer
    attempt of this job started since; False otherwise.

    Drawing a fencing token takes the key's other running rows off their attempts
    (fencing.py) by moving their token on, to the drawing job's.  Such a row has no
    attempt left to write it: without this, it would stay ``running`` until the
    re-drive reported a job that did finish as lost, and ran it again.  The attempt
    is recognised by what only its own start wrote (``worker``, ``attempts``); a newer
    attempt of the same job rewrites both, and then owns the row.  So must ``running``, not
    parked: a row that a delivery parked (the park cleared ``worker``) or the re-drive sent
    again is no longer this attempt's; written over, it would be in two states at once.
    """
    if release_hold:
        fields["unique_hold"] = None
    other = model.alias()
    taken = other.select(other.id).where(
        (other.unique_key == model.unique_key) & (other.app == model.app) & (other.id != model.id)
        & (other.fencing_token >= model.fencing_token)
    )
    cond = (
        (model.id == job.id) & (model.worker == job.worker) & (model.attempts == job.attempts)
        & (model.fencing_token > job.fencing_token) & model.unique_key.is_null(False)
        & (model.status == JobStatus.RUNNING.value) & model.parked_on.is_null() & pw.fn.EXISTS(taken)
    )
    appended = {model.history: history.append(model, attempt_of(job, fields))}
    return bool(model.update(appended, **fields).where(cond).execute())


def attempt_of(job: JobModel, fields: dict[str, Any], status: Optional[str] = None) -> dict[str, Any]:
    """The history entry of ``job``'s attempt, whose outcome ``fields`` record: ``retrying`` when they
    leave the status as it was (Retries sent the message again)."""
    data = job.__data__
    return history.entry(
        attempt=data.get("attempts") or 0, started_at=data.get("started_at"),
        finished_at=fields.get("finished_at") or utcnow(), status=status or str(fields.get("status") or "retrying"),
        error=fields.get("last_error"), worker=data.get("worker"),
    )


# -- the parking moves ----------------------------------------------------------------
#
# A reservation's lease is written and read by the database's clock (queries.sql's ``now``),
# so processes whose clocks disagree agree on when it ends.  Safety does not rest on any
# clock: a reserved row is started by a compare-and-set on what its reservation read
# (start_reserved), which fails once anyone else has claimed, started, re-parked or replaced it.


def no_flush_wait(db: Any) -> bool:
    """Whether a parking move on ``db`` may commit without waiting for the WAL flush: the
    ``*_no_flush_wait`` statements of queries.sql.

    Only for the parking moves (park, claim, reserve), which sit on the
    critical path of every hand-over.  Safe because a later synchronous commit
    (the woken attempt's start, any job's outcome) flushes the WAL up to
    and past them; and if the server crashes first and loses one, the
    row is back where the re-drive looks: a lost park leaves a queued row
    whose message is gone (re-sent), a lost claim a parked row (woken).
    One statement, so one round trip, prepared as the other hot
    statements are.  Not inside the caller's own transaction, which must keep its
    own commit rules.
    """
    return is_postgres(db) and not db.in_transaction()


def _move(db: Any, name: str) -> str:
    return f"{name}_no_flush_wait" if no_flush_wait(db) else name


def db_now(db: Any) -> str:
    """The database's clock as an SQL expression in the job table's time format (naive UTC).

    Reservations (:mod:`dramatiq_unique.parking.deck`) are written and read by it, so one
    process's wall clock is never compared with a lease another process's clock wrote.
    SQLite's clock is the machine's: its processes share it.
    """
    return queries.expression(db, "now")


def _order(model: type[JobModel], order_by: str) -> str:
    """The column a group's queue is served by: ``process_after`` (first ready), else ``created_at``."""
    return model._meta.fields["process_after" if order_by == "process_after" else "created_at"].column_name


def claim_parked(
    model: type[JobModel], group: str, order_by: str, now: Any, broker_ref: str,
    start: Optional[tuple[Any, str, bool]] = None, *, app: str,
) -> Optional[JobModel]:
    """Claim the next due job of ``app`` parked on ``group`` (status pending to queued) and return
    it; None if none.

    One statement: the head of the group is chosen and claimed together
    (on PostgreSQL skipping a head another waker has locked), so two
    wakers never claim one row.  ``broker_ref`` is the id the woken
    message is delivered under, recorded for the lost-message check.

    ``start`` (lease end, worker, release the unique hold): start the
    attempt in the same statement (see :mod:`dramatiq_unique.parking.prestart`),
    unless the row's own options name a unique option; the returned row
    says ``running`` when it was started.  A start waits for its commit;
    a plain claim does not (:func:`no_flush_wait`).
    """
    db = model._meta.database
    fields = model._meta.fields
    when = fields["enqueued_at"].db_value(now)
    values = {
        "queued": JobStatus.QUEUED.value, "now": when, "broker_ref": broker_ref, "app": app, "group": group,
        "pending": JobStatus.PENDING.value, "due": when,
    }
    if start is None:
        name = _move(db, "claim_parked")
    else:
        lease_until, worker, release_hold = start
        values.update(running=JobStatus.RUNNING.value, started_at=when, worker=worker,
                      lease_until=fields["lease_until"].db_value(lease_until), release_hold=1 if release_hold else 0)
        name = "claim_and_start"
    row = queries.run(model, name, values, order_by=_order(model, order_by)).fetchone()
    return None if row is None else to_model(model, row)


def park(model: type[JobModel], job_id: int, revision: int, group: str, options: dict, now: Any) -> Optional[tuple]:
    """Park a waiting job on ``group`` (status pending, ``parked_on`` set); returns its
    ``(created_at, process_after)`` (its place in the queue), or None if it is not waiting.

    A running row whose lease ran out counts as waiting: it is a crashed or
    stalled attempt of this very job, which is over.  Its fencing token moves on
    and its ``worker`` and lease go (queries.sql says why): should the attempt
    wake, nothing it writes lands on the parked row.
    """
    fields = model._meta.fields
    pending, queued, retrying = WAITING
    values = {
        "pending": pending, "queued": queued, "retrying": retrying, "group": group,
        "options": fields["options"].db_value(options), "id": job_id, "revision": revision,
        "running": JobStatus.RUNNING.value, "now": fields["lease_until"].db_value(now),
    }
    row = queries.run(model, _move(model._meta.database, "park"), values).fetchone()
    if row is None:
        return None
    return fields["created_at"].python_value(row[0]), fields["process_after"].python_value(row[1])


#: The columns a reservation reads back: what the woken message and its attempt's start need;
#: current_job() reads the rest when asked (:data:`PARTIAL`).
DECK_COLUMNS = (
    "id", "message_id", "actor_name", "queue_name", "args", "kwargs", "options", "status", "revision",
    "attempts", "unique_key", "fencing_token", "checkpoints", "broker_ref", "created_at", "process_after",
)


def reserve(
    model: type[JobModel], group: str, order_by: str, marker: str, lease_ms: float, *, app: str,
) -> Optional[JobModel]:
    """Reserve the first due, unreserved row of ``app`` parked on ``group`` for the process
    ``marker`` names, for ``lease_ms`` (by the database's clock); None if there is none.  The
    reservation gets a fresh ``broker_ref``: the id its message will be delivered under, and
    its identity (any claim by another waker writes its own)."""
    values = {
        "marker": marker, "lease_ms": float(lease_ms), "broker_ref": str(uuid.uuid4()), "app": app, "group": group,
        "pending": JobStatus.PENDING.value, "due": model._meta.fields["process_after"].db_value(utcnow()),
    }
    name = _move(model._meta.database, "reserve")
    found = queries.run(model, name, values, order_by=_order(model, order_by)).fetchone()
    return None if found is None else to_model(model, found, DECK_COLUMNS)


def start_reserved(
    model: type[JobModel], row: JobModel, marker: str, worker: str, lease_ms: float,
) -> Optional[JobModel]:
    """Start a row this process reserved (``row`` as its reservation read it), before its
    message is delivered; returns the started row as the database now holds it, or None if
    it is no longer ours as reserved: replaced (revision), claimed or reserved by another
    process (status, ``worker``, ``broker_ref``), started by anyone (``fencing_token``).

    A compare-and-set that reads no clock, so a reservation that ran out while this process
    stalled, or that a process with a faster clock took early, is never started here.  The
    attempt's token is the row's next one, drawn in the same statement: no attempt gets it
    twice.  A synchronous commit (a lost start could hand its token out again).
    """
    fields = model._meta.fields
    now = utcnow()
    lease_until = after_ms(lease_ms, now)
    values = {
        "running": JobStatus.RUNNING.value, "started_at": fields["started_at"].db_value(now),
        "lease_until": fields["lease_until"].db_value(lease_until), "worker": worker, "id": row.id,
        "pending": JobStatus.PENDING.value, "marker": marker, "revision": row.revision,
        "reserved_token": row.fencing_token, "broker_ref": row.broker_ref,
    }
    found = queries.run(model, "start_reserved", values).fetchone()
    if found is None:
        return None
    started = to_model(model, found, DECK_COLUMNS)
    started.__data__.update(started_at=now, lease_until=lease_until, worker=worker, parked_on=None)
    setattr(started, PARTIAL, True)
    return started


def unstart(model: type[JobModel], started: JobModel, group: str) -> bool:
    """Undo :func:`start_reserved` (or a claim's start) whose message was not delivered: the row
    is parked on ``group`` again, unreserved, its attempt not counted.  Its fencing token stays
    drawn (tokens never go back).  False if the attempt no longer owns the row."""
    return bool(
        model.update(
            status=JobStatus.PENDING.value, parked_on=group, attempts=model.attempts - 1, worker=None,
            lease_until=None,
        ).where(
            (model.id == started.id) & (model.status == JobStatus.RUNNING.value)
            & (model.fencing_token == started.fencing_token) & (model.worker == started.worker)
        ).execute()
    )


def unclaim(model: type[JobModel], row: JobModel, group: str) -> None:
    """Put a claimed row that was not delivered back in its group's queue.

    Not :func:`unclaim_sends`: a parked row's claim wrote the woken message's broker id before
    the delivery, so the row is recognised by having left its group (``parked_on`` cleared)
    rather than by a missing broker id, and it goes back to its group, not to the re-drive.
    """
    model.update(status=JobStatus.PENDING.value, parked_on=group).where(
        (model.id == row.id) & (model.status == JobStatus.QUEUED.value) & model.parked_on.is_null()
    ).execute()


# -- finding and removing rows ----------------------------------------------------------


def delete(model: type[JobModel], job_id: int) -> None:
    model.delete().where(model.id == job_id).execute()


def find_job(models: list[type[JobModel]], id_or_message_id: Any, model: Optional[type[JobModel]] = None):
    """A row by numeric id (in ``model``) or by message id (in any table)."""
    if isinstance(id_or_message_id, int) or (isinstance(id_or_message_id, str) and id_or_message_id.isdigit()):
        return get(model or models[0], id=int(id_or_message_id))
    for candidate in [model] if model is not None else models:
        row = get(candidate, message_id=str(id_or_message_id))
        if row is not None:
            return row
    return None

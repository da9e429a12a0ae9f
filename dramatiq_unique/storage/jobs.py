"""The statements on job rows: a send's insert, an attempt's start and outcome (fenced by its
``fencing_token``), the parking moves.  The hot paths run named statements of ``queries.sql`` (no query
builder); the rest are peewee queries."""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime
from typing import Any, Optional, Sequence, Union

import peewee as pw

from dramatiq_unique.observe import events
from dramatiq_unique.storage import queries
from dramatiq_unique.storage.database import is_postgres
from dramatiq_unique.storage.models import FINISHED, WAITING, JobModel, JobStatus, after_ms, dumps, utcnow

#: Parameters one multi-row INSERT may carry (SQLite allows 32766 since 3.32; PostgreSQL 65535).
MAX_PARAMS = 32_000
#: What :func:`read_holder` reads of the job that holds a key.
HOLDER_COLUMNS = ("id", "message_id", "revision", "status", "created_at")


def to_model(
    model: type[JobModel], row: Sequence[Any], names: Optional[Sequence[str]] = None, **started: Any,
) -> JobModel:
    """A model instance from a row of ``names`` (all columns, in ``sorted_fields`` order, by default); with
    ``started``, what an attempt's start wrote besides, the instance marked :data:`PARTIAL`."""
    fields = model._meta.sorted_fields if names is None else [model._meta.fields[n] for n in names]
    # Filled as peewee fills a row it selected, without Model.__init__'s setattr per field.
    job = model.__new__(model)
    job.__data__ = {f.name: f.python_value(v) for f, v in zip(fields, row, strict=False)}
    job._dirty = set()  # type: ignore[attr-defined]
    job.__rel__ = {}
    if started:
        job.__data__.update(started)
        setattr(job, PARTIAL, True)
    return job


def _written(model: type[JobModel], values: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The columns ``values`` (by field name) write, and their parameters by column (``db_value``)."""
    fields = model._meta.fields
    params = {fields[name].column_name: fields[name].db_value(value) for name, value in values.items()}
    return tuple(params), params


def _present(model: type[JobModel], values: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
    # peewee fills field defaults in Python, not in the schema: so must we.  NULLs are left to the columns
    # (all nullable ones default to NULL): fewer parameters to send.
    filled = {**model._meta.get_default_dict(), **values}
    return _written(model, {name: v for name, v in filled.items() if v is not None})


class IdempotencyHeld(Exception):
    """Internal: another job already holds the row's idempotency key."""

    def __init__(self, job: JobModel) -> None:
        super().__init__(job.message_id)
        self.job = job


def adopt(model: type[JobModel], fields: dict[str, Any]) -> tuple[int, int, bool]:
    """INSERT a row: ``(id, revision, True)``, or ``(id, revision, False)`` of the row an earlier send of the
    same message inserted.  IdempotencyHeld if another job holds its idempotency key."""
    try:
        return _insert(model, fields), 0, True
    except pw.IntegrityError:
        check_idempotency(model, fields)
        row = model.get_or_none(message_id=fields["message_id"])
        if row is None:
            raise
        return row.id, row.revision, False


def _insert(model: type[JobModel], values: dict[str, Any]) -> int:
    written, params = _present(model, values)
    return queries.run(model, "insert", params, written=written).fetchone()[0]


def insert_or_holder(
    model: type[JobModel], values: dict[str, Any], read_holder: bool = True,
) -> tuple[Optional[int], Optional[JobModel]]:
    """INSERT a row holding ``values["unique_hold"]``: ``(its id, None)``, ``(None, the holder's HOLDER_COLUMNS)``,
    or ``(None, None)`` when the holder committed after the statement began.  One round trip on PostgreSQL
    with ``read_holder``; else a plain INSERT, which raises IntegrityError on the clash."""
    if not (read_holder and is_postgres(model._meta.database)):
        return _insert(model, values), None
    written, params = _present(model, values)
    params.setdefault("app", "")
    row = queries.run(model, "insert_or_holder", params, written=written).fetchone()
    if row is None:
        return None, None
    if row[1] is None:  # the inserted branch: no message id
        return row[0], None
    return None, to_model(model, row, HOLDER_COLUMNS)


def insert_many(model: type[JobModel], rows: list[dict[str, Any]]) -> dict[str, int]:
    """INSERT ``rows`` with ``ON CONFLICT DO NOTHING``, in as few statements as the parameter limit allows:
    ``{message id: row id}`` of the rows inserted (one whose hold another job holds is left out)."""
    if not rows:
        return {}
    filled = [{**model._meta.get_default_dict(), **row} for row in rows]  # peewee's defaults, filled in Python
    names = sorted({name for row in filled for name, value in row.items() if value is not None})
    fields = [model._meta.fields[n] for n in names]
    written = tuple(f.column_name for f in fields)
    per = max(1, MAX_PARAMS // len(names))
    db = model._meta.database
    out: dict[str, int] = {}
    for chunk in pw.chunked(filled, per):
        sql = queries.render(model, "insert_many", written=written, rows=len(chunk))
        params = [f.db_value(row.get(f.name)) for row in chunk for f in fields]
        out.update((message_id, row_id) for row_id, message_id in db.execute_sql(sql, params).fetchall())
    return out


def read_holder(model: type[JobModel], hold: str, app: str = "") -> Optional[JobModel]:
    """The HOLDER_COLUMNS of the row of ``app`` holding ``hold``, if any (holds are unique per app)."""
    row = queries.run(model, "holder", {"app": app, "hold": hold}).fetchone()
    return None if row is None else to_model(model, row, HOLDER_COLUMNS)


def holders(model: type[JobModel], holds: list[str], app: str = "") -> dict[str, JobModel]:
    """:func:`read_holder` for many holds in one query: ``{hold: HOLDER_COLUMNS of its row}``."""
    if not holds:
        return {}
    columns = [getattr(model, name) for name in HOLDER_COLUMNS] + [model.unique_hold]
    query = model.select(*columns).where((model.app == app) & model.unique_hold.in_(holds))
    return {str(row.unique_hold): row for row in query}


def check_idempotency(model: type[JobModel], fields: dict[str, Any]) -> None:
    """After an insert clashed: raise IdempotencyHeld if the idempotency key was the cause."""
    hold = fields.get("idempotency_hold")
    if hold:
        holder = model.get_or_none(app=fields.get("app", ""), idempotency_hold=hold)  # keys are per app
        if holder is not None and holder.message_id != fields["message_id"]:
            raise IdempotencyHeld(holder)


# Which INSERT a unique send makes: insert_or_holder saves a refused duplicate a round trip but costs every
# new row more server CPU (docs/discussions/benchmarks.md), so each actor keeps a moving share of its
# unique inserts that met a holder (this process's, approximate, updated without a lock).

#: Share of recent clashes above which an actor reads the holder in the insert: the break-even point.
CLASH_THRESHOLD = 0.15
#: Weight of the newest insert in the share: about the last 20 count.
CLASH_WEIGHT = 0.05

_share: dict[str, float] = {}


def expect_holder(actor_name: str) -> bool:
    """Whether a unique insert of ``actor_name`` should read the holder in the same statement."""
    return _share.get(actor_name, 0.0) > CLASH_THRESHOLD


def record_clash(actor_name: str, held: bool) -> None:
    """A unique insert of ``actor_name`` met a holder (``held``) or inserted its row."""
    share = _share.get(actor_name, 0.0)
    _share[actor_name] = share + CLASH_WEIGHT * ((1.0 if held else 0.0) - share)


def insert_holding(
    model: type[JobModel], fields: dict[str, Any], hold: str, window_ms: Optional[float], *, full: bool = True
) -> tuple[Optional[int], Optional[JobModel]]:
    """Try once to insert a row holding ``hold`` (the unique index decides between racing senders):
    ``(row id, None)``, ``(None, holder)``, or ``(None, None)`` when the key came free meanwhile (try again).
    A holder older than ``window_ms`` no longer counts: its hold is cleared.  ``full=False``: the holder
    may carry only HOLDER_COLUMNS."""
    db = model._meta.database
    row = {**fields, "unique_hold": hold}
    actor_name, app = fields["actor_name"], fields.get("app", "")
    clash: Optional[pw.IntegrityError] = None
    try:
        # In the caller's transaction, a savepoint: a clash must not abort it (in autocommit, nothing to undo).
        with db.atomic() if db.in_transaction() else contextlib.nullcontext():
            row_id, found = insert_or_holder(model, row, expect_holder(actor_name))
    except pw.IntegrityError as e:  # a plain INSERT's clash
        row_id, found, clash = None, None, e
    record_clash(actor_name, held=row_id is None)
    if row_id is not None:
        return row_id, None
    check_idempotency(model, fields)  # an idempotency key's clash wins
    if found is None:  # the clash, or the holder committed after the statement began
        found = read_holder(model, hold, app)
    if found is None and clash is not None and model.get_or_none(message_id=fields["message_id"]) is not None:
        raise clash  # not the hold: this message already has a row
    if found is None:
        return None, None  # it released its hold meanwhile
    if found.message_id == fields["message_id"]:
        return None, found
    if _outlived(found, window_ms):
        model.update(unique_hold=None).where((model.id == found.id) & (model.unique_hold == hold)).execute()
        return None, None
    return None, (model.get_or_none(id=found.id) or found) if full else found


def holder(model: type[JobModel], hold: str, window_ms: Optional[float], app: str = "") -> Optional[JobModel]:
    """The job of ``app`` holding ``hold`` (HOLDER_COLUMNS of it), if one does and, with ``window_ms``,
    was sent less than that long ago."""
    job = read_holder(model, hold, app)
    return None if job is None or _outlived(job, window_ms) else job


def _outlived(job: JobModel, window_ms: Optional[float]) -> bool:
    return window_ms is not None and job.created_at <= after_ms(-window_ms)


def replace(
    model: type[JobModel], holder: JobModel, hold: str, args: list, kwargs: dict, process_after: datetime,
    *, held: Optional[dict[str, Any]] = None,
) -> Optional[JobModel]:
    """Give a waiting holder new arguments and due time (and ``held``: outbox.Block.stamp's writes);
    None if it is no longer waiting."""
    updated = (
        model.update(args=args, kwargs=kwargs, process_after=process_after, revision=model.revision + 1, **(held or {}))
        .where((model.id == holder.id) & (model.unique_hold == hold) & model.status.in_(WAITING))
        .returning(model)
    )
    return next(iter(updated.execute()), None)


def unclaim_sends(
    model: type[JobModel], ids: list[int], status: str, *, ref: Union[str, list[str], None] = None,
    options: Optional[dict] = None,
) -> None:
    """Hand rows claimed for a send whose publish failed back to ``status``, for the re-drive: only rows
    still queued without a broker id, or with the broker id ``ref`` (one of a list) the send wrote, which
    goes too; ``options`` replaces theirs."""
    fields: dict[str, Any] = {"status": status, "enqueued_at": None}
    if options is not None:
        fields["options"] = options
    if ref is None:
        published = model.broker_ref.is_null()
    else:
        fields["broker_ref"] = None
        published = model.broker_ref.in_(ref) if isinstance(ref, list) else model.broker_ref == ref
    model.update(**fields).where(model.id.in_(ids) & (model.status == JobStatus.QUEUED.value) & published).execute()


def record_refs(model: type[JobModel], refs: dict[int, str]) -> None:
    """Record the broker's ids of sent rows in one statement; a ref set meanwhile is newer: kept."""
    if refs:
        queries.run(model, "record_refs", {"refs": dumps(list(refs.items()))})


#: ms a running row's lease is still honoured after it ran out by this process's clock, before a new
#: delivery may replace its attempt: leases are written by one process's clock and judged by another's.
LEASE_SKEW_MS = 1_000
#: The ``worker`` of a row a waker's claim started ahead of its delivery, as a LIKE pattern.
WOKEN = "%:woken"
#: The columns an attempt's start reads back; current_job() reads the rest when asked.
START_COLUMNS = ("message_id", "actor_name", "attempts", "unique_key", "fencing_token", "checkpoints")
#: Set on a model instance that holds only some columns (START_COLUMNS, DECK_COLUMNS).
PARTIAL = "_dramatiq_unique_partial"


def draw_token(model: type[JobModel], key: str, job_id: Optional[int] = None) -> int:
    """The fencing key's next token, for job ``job_id`` about to run; rows of the key still running
    under an older token are fenced out (a start on PostgreSQL draws in its own statement instead)."""
    values = {"key": key, "own": -1 if job_id is None else int(job_id), "running": JobStatus.RUNNING.value}
    values["token"] = token = int(queries.run(model, "draw_token", values).fetchone()[0])
    queries.run(model, "revoke_older", values)
    return token


def start(
    model: type[JobModel], job_id: int, *, revision: int, lease_ms: float, worker: str, release_hold: bool,
    fence_key: Optional[str] = None, woken_by: Optional[str] = None,
) -> Optional[JobModel]:
    """Mark an attempt running and return the row; None if the job finished or was replaced meanwhile,
    or another attempt of it runs under a live lease (less :data:`LEASE_SKEW_MS`).  ``woken_by``: a LIKE
    pattern of the ``worker`` of a row a waker's claim started, which this delivery may start again.
    ``fence_key``: the attempt draws the key's next fencing token (in the same statement on PostgreSQL)."""
    now = utcnow()
    lease_until = after_ms(lease_ms, now)
    fields = model._meta.fields
    values = {
        "key": fence_key, "token": None, "running": JobStatus.RUNNING.value,
        "started_at": fields["started_at"].db_value(now), "lease_until": fields["lease_until"].db_value(lease_until),
        "worker": worker, "release_hold": 1 if release_hold else 0, "id": job_id, "revision": revision,
        "succeeded": FINISHED[0], "failed": FINISHED[1],
        "live_after": fields["lease_until"].db_value(after_ms(-LEASE_SKEW_MS, now)), "woken_by": woken_by or "",
    }
    merged = fence_key is not None and is_postgres(model._meta.database)
    if fence_key is not None and not merged:
        # SQLite draws in a statement of its own: look first, so that a refused start (a duplicate
        # delivery) draws no token.  A race past this look costs only a gap in the key's counter.
        if queries.run(model, "startable", values).fetchone() is None:
            return None
        values["token"] = draw_token(model, fence_key, job_id)
    row = queries.run(model, "start_attempt_fenced" if merged else "start_attempt", values).fetchone()
    if row is None:
        return None
    return to_model(model, row, START_COLUMNS, id=job_id, revision=revision, status=JobStatus.RUNNING.value,
                    started_at=now, lease_until=lease_until, worker=worker)


def start_fetched(
    model: type[JobModel], rows: Sequence[tuple[int, int, float, bool]], worker: str,
) -> dict[int, JobModel]:
    """:func:`start` for fetched jobs' rows, ``(id, revision, lease ms, release_hold)`` each, in one statement
    (PostgreSQL; no fencing key): the started rows by id.  A row :func:`start` would refuse is left out."""
    now = utcnow()
    fields = model._meta.fields
    leases = {job_id: after_ms(lease_ms, now) for job_id, _, lease_ms, _ in rows}
    revisions = {job_id: revision for job_id, revision, _, _ in rows}
    values = {
        "running": JobStatus.RUNNING.value, "started_at": fields["started_at"].db_value(now), "worker": worker,
        "ids": list(leases), "revisions": list(revisions.values()),
        "leases": [fields["lease_until"].db_value(lease) for lease in leases.values()],
        "releases": [bool(release) for _, _, _, release in rows],
        "succeeded": FINISHED[0], "failed": FINISHED[1],
        "live_after": fields["lease_until"].db_value(after_ms(-LEASE_SKEW_MS, now)),
    }
    return {
        row[0]: to_model(model, row[1:], START_COLUMNS, id=row[0], revision=revisions[row[0]],
                         status=JobStatus.RUNNING.value, started_at=now, lease_until=leases[row[0]], worker=worker)
        for row in queries.run(model, "start_fetched", values).fetchall()
    }


def renew_fetched(model: type[JobModel], job: JobModel, lease_ms: float) -> bool:
    """Count the lease and start of a row :func:`start_fetched` started from now; False if that start no
    longer owns the row."""
    now = utcnow()
    fields = model._meta.fields
    lease_until = after_ms(lease_ms, now)
    values = {
        "started_at": fields["started_at"].db_value(now), "lease_until": fields["lease_until"].db_value(lease_until),
        "id": job.id, "running": JobStatus.RUNNING.value, "worker": job.worker, "token": job.fencing_token,
    }
    if not queries.run(model, "renew_fetched", values).rowcount:
        return False
    job.started_at, job.lease_until = now, lease_until
    return True


def unstart_fetched(model: type[JobModel], started: Sequence[JobModel], held: Sequence[int] = ()) -> int:
    """Put rows :func:`start_fetched` started back to ``queued``, their attempt not counted, where that start
    still owns them; returns how many.  ``held``: the ids of those whose start freed their key, which take it
    again unless another job took it meanwhile."""
    values = {
        "queued": JobStatus.QUEUED.value, "running": JobStatus.RUNNING.value, "worker": started[0].worker,
        "ids": [job.id for job in started], "tokens": [job.fencing_token for job in started],
    }
    count = queries.run(model, "unstart_fetched", values).rowcount
    if held:
        try:
            queries.run(model, "hold_again", {"ids": list(held), "queued": JobStatus.QUEUED.value})
        except pw.IntegrityError:
            pass  # a send took a key at this very moment, or two such rows share one: each keeps it as it is
    return count


def update_fenced(
    model: type[JobModel], job_id: int, fencing_token: int, values: dict[str, Any], *,
    attempt: Optional[dict[str, Any]] = None,
) -> int:
    """UPDATE one row only if its fencing token is still ``fencing_token``; returns the row count.
    ``attempt``: a history entry appended in the same statement."""
    written, params = _written(model, values)
    params["row_id"], params["attempt_token"] = job_id, fencing_token
    if attempt is None:
        return queries.run(model, "update_fenced", params, written=written).rowcount
    params.update(entry=dumps(attempt), keep=MAX_HISTORY)
    return queries.run(model, "update_fenced_with_history", params, written=written).rowcount


def finish(model: type[JobModel], job: JobModel, *, release_hold: bool, **fields: Any) -> bool:
    """Record an attempt's outcome, fenced by its token, in its history too; False if a newer attempt
    owns the row."""
    if release_hold:
        fields["unique_hold"] = None
    count = update_fenced(model, job.id, job.fencing_token, fields, attempt=attempt_of(job, fields))
    if not count:
        events.fenced_out(job, "outcome")
    return bool(count)


def finish_succeeded(model: type[JobModel], done: Sequence[tuple[JobModel, bool, datetime, Any]]) -> set[int]:
    """:func:`finish` for several succeeded attempts, ``(job, release_hold, finished_at, result)`` each, in one
    statement (PostgreSQL): the ids of the rows written.  A row a newer attempt owns is left out."""
    fields = model._meta.fields
    params = {
        "succeeded": JobStatus.SUCCEEDED.value, "keep": MAX_HISTORY,
        "ids": [job.id for job, *_ in done], "tokens": [job.fencing_token for job, *_ in done],
        "finished": [fields["finished_at"].db_value(at) for _, _, at, _ in done],
        "results": [fields["result"].db_value(result) for *_, result in done],
        "entries": [dumps(attempt_of(job, {"status": JobStatus.SUCCEEDED.value, "finished_at": at}))
                    for job, _, at, _ in done],
        "releases": [bool(release) for _, release, _, _ in done],
    }
    written = {row[0] for row in queries.run(model, "finish_succeeded", params).fetchall()}
    for job, *_ in done:
        if job.id not in written:
            events.fenced_out(job, "outcome")
    return written


def finish_revoked(model: type[JobModel], job: JobModel, *, release_hold: bool, **fields: Any) -> bool:
    """Record the outcome of an attempt whose token another job of its key took (else the row would stay
    ``running`` until the re-drive reported it lost), if no newer attempt of this job started since: the
    row still ``running``, not parked, with what only this attempt's start wrote (``worker``, ``attempts``)."""
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
    appended = {model.history: history_append(model, attempt_of(job, fields))}
    return bool(model.update(appended, **fields).where(cond).execute())


#: Entries kept in a row's history (appended in SQL by the outcome's statement): the oldest goes first.
MAX_HISTORY = 20
#: Longest ``error`` of an entry, in characters (the full traceback stays in ``last_error``).
MAX_HISTORY_ERROR = 500


def _iso(value: Any) -> Optional[str]:
    return value.isoformat(timespec="milliseconds") if isinstance(value, datetime) else value


def attempt_of(job: JobModel, fields: dict[str, Any], status: Optional[str] = None) -> dict[str, Any]:
    """The history entry of ``job``'s attempt, whose outcome ``fields`` record (``retrying`` when they
    leave the status as it was), its error cut to its first line."""
    data, error = job.__data__, fields.get("last_error")
    return {"attempt": data.get("attempts") or 0, "started_at": _iso(data.get("started_at")),
            "finished_at": _iso(fields.get("finished_at") or utcnow()),
            "status": status or str(fields.get("status") or "retrying"),
            "error": error.split("\n", 1)[0][:MAX_HISTORY_ERROR] if error else None, "worker": data.get("worker")}


def history_append(model: type[pw.Model], item: dict[str, Any]) -> pw.Node:
    """The new value of ``history`` with ``item`` appended, for a peewee UPDATE."""
    return queries.fragment(model, "history_append", {"entry": dumps(item), "keep": MAX_HISTORY})


def _move(db: Any, name: str) -> str:
    """Parking move ``name``, committed without waiting for the WAL flush on PostgreSQL outside the caller's
    transaction: a later synchronous commit flushes it, and a lost move leaves the row where the re-drive looks."""
    return f"{name}_no_flush_wait" if is_postgres(db) and not db.in_transaction() else name


def db_now(db: Any) -> str:
    """The database's clock as an SQL expression in the job table's time format (naive UTC)."""
    return queries.text_of("now", queries.dialect_of(db))


def _order(model: type[JobModel], order_by: str) -> str:
    """The column a group's queue is served by: ``process_after`` (first ready), else ``created_at``."""
    return model._meta.fields["process_after" if order_by == "process_after" else "created_at"].column_name


def claim_parked(
    model: type[JobModel], group: str, order_by: str, now: Any, broker_ref: str,
    start: Optional[tuple[Any, str, bool]] = None, *, app: str,
) -> Optional[JobModel]:
    """Claim the next due job of ``app`` parked on ``group`` (pending to queued, its message to be
    delivered under ``broker_ref``) in one statement; None if none.  ``start`` (lease end, worker, release
    the hold): start the attempt in it too."""
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
    """Park a waiting job on ``group``; returns its ``(created_at, process_after)``, or None if it is not
    waiting.  A running row whose lease ran out counts as waiting: its token moves on (queries.sql)."""
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


#: The columns a reservation reads back: what the woken message and its start need (:data:`PARTIAL`).
DECK_COLUMNS = (
    "id", "message_id", "actor_name", "queue_name", "args", "kwargs", "options", "status", "revision",
    "attempts", "unique_key", "fencing_token", "checkpoints", "broker_ref", "created_at", "process_after",
)


def reserve(
    model: type[JobModel], group: str, order_by: str, marker: str, lease_ms: float, *, app: str,
) -> Optional[JobModel]:
    """Reserve the first due, unreserved row of ``app`` parked on ``group`` for the process ``marker``
    names, for ``lease_ms`` by the database's clock (safety rests on start_reserved's compare-and-set, not
    on any clock); None if none.  It gets a fresh ``broker_ref``."""
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
    """Start a row this process reserved (``row`` as its reservation read it), drawing its token; None if it
    is no longer ours as reserved."""
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
    return None if found is None else to_model(model, found, DECK_COLUMNS, started_at=now, lease_until=lease_until,
                                                 worker=worker, parked_on=None)


def unstart(model: type[JobModel], started: JobModel, group: str) -> bool:
    """Undo a start whose message was not delivered: parked on ``group`` again, the attempt not
    counted, its token spent.  False if the attempt no longer owns the row."""
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
    """Put a claimed row that was not delivered back in its group's queue (it left the group at the claim)."""
    model.update(status=JobStatus.PENDING.value, parked_on=group).where(
        (model.id == row.id) & (model.status == JobStatus.QUEUED.value) & model.parked_on.is_null()
    ).execute()


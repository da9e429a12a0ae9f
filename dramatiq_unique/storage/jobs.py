"""Job-row operations shared by the middlewares.

Every write that records an attempt's outcome is conditional on the
attempt's ``fencing_token``: a worker whose lease ran out and whose job
was started again cannot overwrite what the newer attempt wrote.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Literal, Optional, Union

import peewee as pw

from dramatiq_unique.errors import DatabaseUnavailable
from dramatiq_unique.observe import events
from dramatiq_unique.storage import conflicts, history, statements
from dramatiq_unique.storage.models import WAITING, JobModel, JobStatus, after_ms, utcnow

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


def insert(model: type[JobModel], fields: dict[str, Any]) -> int:
    """Insert a row; returns its id.  Raises IntegrityError on a message_id or hold clash."""
    return statements.insert(model, fields)


def adopt(model: type[JobModel], fields: dict[str, Any]) -> tuple[int, int]:
    """A row for a message sent without the suite (before set-up, by another producer):
    ``(id, revision)`` of the row inserted, or of the row an earlier delivery of the same
    message inserted (the message id is unique)."""
    try:
        return statements.insert(model, fields), 0
    except pw.IntegrityError:
        row = get(model, message_id=fields["message_id"])
        if row is None:
            raise  # not the message id: another unique column clashed
        return row.id, row.revision


def unclaim_sends(
    model: type[JobModel], ids: list[int], status: str, *, ref: Union[str, list[str], None] = None,
    options: Optional[dict] = None,
) -> None:
    """Hand rows claimed for a send whose publish failed back to ``status`` (the re-drive
    sends them later).  Only rows still queued without a broker id: a publish that did go
    through recorded one, and a start or a newer claim moved the row on.  ``ref``: rows a
    send wrote with the broker id ``ref`` (or one of a list, durable/outbox_batch.py) before its publish
    failed (durable/deferral.py), whose id goes too; ``options`` replaces theirs.

    Not for a parked row's claim (:func:`dramatiq_unique.storage.parking_statements.unclaim`):
    that claim writes the woken message's broker id before it publishes, and its undo
    parks the row on its group again.
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
    carry only :data:`statements.HOLDER_COLUMNS` (a skipped send needs no more).

    An actor whose keys were found held often lately inserts with one
    statement that reads the holder on the clash (:mod:`dramatiq_unique.storage.conflicts`
    says when, and what each way costs); the others insert plainly and read
    the holder after the unique index refused the row.
    """
    db = model._meta.database
    row = {**fields, "unique_hold": hold}
    actor_name = fields["actor_name"]
    insert = statements.insert_or_holder if conflicts.expect_holder(actor_name) else _plain
    for _ in range(MAX_INSERT_ROUNDS):
        try:
            if db.in_transaction():
                # A savepoint: a clash must not abort the caller's transaction.
                with db.atomic():
                    row_id, found = insert(model, row)
            else:  # in autocommit a failed INSERT leaves nothing to roll back
                row_id, found = insert(model, row)
            conflicts.record(actor_name, held=row_id is None)
            if row_id is not None:
                return row_id, None
            # The hold was the arbiter, so an idempotency key's clash went unchecked: it wins, as below.
            check_idempotency(model, fields)
            if found is None:  # it committed after the statement began: read it now
                found = statements.holder(model, hold, fields.get("app", ""))
                if found is None:
                    continue  # and released its hold already
        except pw.IntegrityError:
            conflicts.record(actor_name, held=True)
            check_idempotency(model, fields)
            found = statements.holder(model, hold, fields.get("app", ""))
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
    return statements.insert(model, row), None  # a clash raises IntegrityError


def holder(model: type[JobModel], hold: str, window_ms: Optional[float], app: str = "") -> Optional[JobModel]:
    """The job of ``app`` holding ``hold`` (:data:`statements.HOLDER_COLUMNS` of it), if one does and, with
    ``window_ms``, was sent less than that long ago."""
    job = statements.holder(model, hold, app)
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


#: ms a running row's lease is still honoured after it ran out by this process's clock,
#: before a new delivery of the job may replace its attempt.  Leases are written with
#: the clock of the process that runs the attempt; a duplicate delivery judges them with
#: its own.  Hosts kept in step by NTP differ by a few ms; this covers a second of skew,
#: at the cost of a crashed attempt's redelivery waiting that much longer.
LEASE_SKEW_MS = 1_000
#: The ``worker`` of a row a waker's claim started ahead of its delivery (parking/waking.py, parking/deck.py
#: write ``<worker id>:woken``), as a LIKE pattern.
WOKEN = "%:woken"


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
    """Mark an attempt running; None if the job finished or was replaced meanwhile, or if
    another attempt of it is running under a live lease (this delivery is a duplicate).

    ``fence_key``: draw that key's next fencing token for the attempt (see statements.start).
    ``woken_by``: a LIKE pattern of the ``worker`` a waker's claim writes on a row it
    started ahead of its delivery (prestart.py), which this delivery may start again.
    """
    now = utcnow()
    return statements.start(
        model, job_id, revision=revision, started_at=now, lease_until=after_ms(lease_ms, now),
        worker=worker, release_hold=release_hold, fencing_token=fencing_token, fence_key=fence_key,
        live_after=after_ms(-LEASE_SKEW_MS, now), woken_by=woken_by,
    )


def finish(model: type[JobModel], job: JobModel, *, release_hold: bool, **fields: Any) -> bool:
    """Record an attempt's outcome, fenced by the attempt's token, and append it to the row's history
    (storage/history.py); False if a newer attempt owns the row."""
    if release_hold:
        fields["unique_hold"] = None
    count = statements.update_fenced(model, job.id, job.fencing_token, fields, attempt=attempt_of(job, fields))
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

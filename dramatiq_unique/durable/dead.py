"""The dead set and the operator's actions on one job: :func:`dead_jobs`, :func:`retry_job`, :func:`cancel_job`.

Each is one conditional UPDATE, so a job that moved on meanwhile is refused (:class:`JobStateError`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Optional, Union

import dramatiq
import peewee as pw

from dramatiq_unique import options as opt
from dramatiq_unique import suite as _config
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable import lookup
from dramatiq_unique.durable.bulk_actions import RETRY, Selection, cancel_fields, matching
from dramatiq_unique.durable.messages import RETRY_BASE, build_message
from dramatiq_unique.durable.redrive import claim_fields, send_claimed, sending_fields
from dramatiq_unique.errors import DuplicateJob, JobStateError, RedisUnavailable
from dramatiq_unique.guard import guarded
from dramatiq_unique.locks import queue
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import WAITING, JobModel, JobStatus, utcnow
from dramatiq_unique.unique import recent
from dramatiq_unique.unique.enqueue import queue_lock_ttl, take_queue_lock

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

FAILED, PENDING = JobStatus.FAILED.value, JobStatus.PENDING.value
#: Rows :func:`dead_jobs` returns unless told otherwise.
DEFAULT_LIMIT = 100
#: Times retry_job looks again when the job holding its key let it go meanwhile.
MAX_HOLD_ROUNDS = 20


def named(job: JobModel) -> str:
    """A job in an error: by its id, which an operator may have typed, and its message id, unique everywhere."""
    return f"job {job.id} ({job.message_id})"


def _changed(job: JobModel, what: str) -> JobStateError:
    now = type(job).get_or_none(id=job.id)
    return JobStateError(f"{named(job)} changed {what}: {'gone' if now is None else f'now {now.status}'}", job=now)


def since_of(since: Union[datetime, timedelta, None], now: Optional[datetime] = None) -> Optional[datetime]:
    """``since`` as the job table's time (naive UTC; a naive datetime is UTC), or a timedelta before ``now``."""
    if since is None:
        return None
    if isinstance(since, timedelta):
        return (now or utcnow()) - since
    if isinstance(since, datetime):
        return since if since.tzinfo is None else since.astimezone(timezone.utc).replace(tzinfo=None)
    raise TypeError(f"since must be a datetime or a timedelta, not {type(since).__name__}")


def dead_jobs(
    actor_name: Optional[str] = None, since: Union[datetime, timedelta, None] = None, limit: int = DEFAULT_LIMIT,
    *, suite: Optional["Suite"] = None,
) -> list[JobModel]:
    """The dead set: this app's failed jobs in every job table, the last to fail first; ``actor_name``'s
    only, failed at or after ``since`` (a datetime, naive in UTC, or a timedelta: that long ago)."""
    if actor_name is not None and not isinstance(actor_name, str):
        raise TypeError(f"actor_name must be a str, not {type(actor_name).__name__}")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    sel = Selection(actor=actor_name, since=since_of(since))
    suite = suite or _config.current()

    def read(index: int, tables: list[type[JobModel]]) -> list[JobModel]:
        return [row for model in tables for row in model.select().where(matching(suite, RETRY, model, sel))
                .order_by(model.finished_at.desc(), model.id.desc()).limit(limit)]

    answers, down = lookup.each_store(suite, "reading the dead set", read)
    for error in down:
        logger.warning("%s; its rows are left out.", error)
    found = [row for rows in answers for row in rows]
    found.sort(key=lambda job: (job.finished_at or datetime.min, job.id), reverse=True)
    return found[:limit]


def retry_job(
    id_or_message_id: Union[int, str, JobModel], *, model: Optional[type[JobModel]] = None,
    suite: Optional["Suite"] = None,
) -> JobModel:
    """Send a failed job again as a new attempt of the same job; returns its row after the send.

    Its attempts, last error, checkpoints and timings stay; its unique key is held again and Dramatiq's
    ``Retries`` starts a new count.  The job is named by its message id, its row (acted on in the store it
    came from) or its numeric id (in ``model``, the shared table by default; :class:`AmbiguousJobId` if
    several stores have it).  Raises :class:`JobNotFound`, :class:`JobStateError` (not failed, or changed
    meanwhile), or :class:`DuplicateJob` (``.job``: the holder of its key).  A publish the broker refuses
    leaves the row ``pending`` for the re-drive.
    """
    suite = suite or _config.current()
    job = lookup.resolve(suite, id_or_message_id, model=model)
    if job.status != FAILED:
        raise JobStateError(f"{named(job)} is {job.status}: only a failed job can be retried", job=job)
    config = suite.actor_config(job.actor_name)
    if config is None:  # its lock type, window and broker are the actor's
        raise JobStateError(f"actor {job.actor_name} is not declared in this process: declare it to retry its jobs",
                            job=job)
    broker = suite.broker or dramatiq.get_broker()
    table, opts = type(job), dict(job.options or {})
    lock = config.for_message(opts).unique_lock
    key = job.unique_key if job.unique_key is not None and lock in opt.QUEUE_LOCKS else None
    marker = {**(opts.get(MARKER) or {}), RETRY_BASE: job.attempts}
    if key is not None:
        marker.setdefault("qt", job.message_id)  # the queue lock's token, as a send's (unique/enqueue.py)
    opts.pop("retries", None)  # a new count: build_message gives the message its own
    # A new fencing token fences out the attempt the job failed in, should it be alive after all (a job "lost"
    # under on_lost="fail" whose worker only stalled): its outcome must not land on the new attempt's row.
    extra: dict[str, Any] = dict(options={**opts, MARKER: marker}, process_after=utcnow(), finished_at=None,
                                 parked_on=None, fencing_token=job.fencing_token + 1)
    if key is not None:
        extra["unique_hold"] = key
    with guarded(f"retrying job {job.message_id}"):
        row = _claim(table, job, extra, key, recent.window(config, opts, lock) if key is not None else None)
        if key is not None:
            try:
                take_queue_lock(suite, build_message(row), suite.keys.queue_lock(key),
                                 queue_lock_ttl(config, opts, lock, None))
            except RedisUnavailable:  # the row's hold decides; the lock only names the waiting job
                logger.warning("Retrying job %s without its Redis queue lock: Redis is down.", job.message_id)
        send_claimed(suite, broker, table, [row], PENDING)  # a publish refused leaves it pending for the re-drive
        return table.get_or_none(id=row.id) or row


def _claim(table: type[JobModel], job: JobModel, extra: dict, key: Optional[str], window: Optional[float]) -> JobModel:
    """Make the failed ``job`` a new attempt, as a re-drive claim does; raises if another job holds ``key``
    or the row changed since it was read."""
    db = table._meta.database
    cond = (table.id == job.id) & (table.revision == job.revision) & (table.status == FAILED)
    cond &= table.fencing_token == job.fencing_token
    for _ in range(MAX_HOLD_ROUNDS):
        # Built each round: peewee keeps an executed query's result.
        update = table.update(claim_fields(table, **extra)).where(cond).returning(*sending_fields(table))
        try:
            with db.atomic():  # a savepoint inside the caller's transaction: the clash aborts only it
                claimed = list(update.execute())
        except pw.IntegrityError:
            assert key is not None  # only the hold has a unique index that this UPDATE touches
            found = jobs.read_holder(table, key, job.app)
            if found is None:
                continue  # it let the key go meanwhile
            if jobs.holder(table, key, window, job.app) is None:  # sent longer than unique_window ago
                table.update(unique_hold=None).where((table.id == found.id) & (table.unique_hold == key)).execute()
                continue
            holder = table.get_or_none(id=found.id) or found
            raise DuplicateJob(f"{named(holder)}, {holder.status}, holds the key of {named(job)}",
                               job=holder) from None
        if claimed:
            return claimed[0]
        raise _changed(job, "meanwhile")
    raise JobStateError(f"could not take the key of {named(job)} back: it keeps changing hands", job=job)


def cancel_job(
    id_or_message_id: Union[int, str, JobModel], *, model: Optional[type[JobModel]] = None,
    suite: Optional["Suite"] = None,
) -> JobModel:
    """Cancel a waiting job (``pending``, ``queued`` or ``retrying``); returns its row, now ``cancelled``.

    Its message is skipped when it arrives, its unique key freed, a parked one never woken.  The job is
    named as for :func:`~dramatiq_unique.retry_job`.  Raises :class:`JobNotFound`, or :class:`JobStateError`
    for a job running, finished, or changed while it was cancelled.
    """
    suite = suite or _config.current()
    job = lookup.resolve(suite, id_or_message_id, model=model)
    if job.status not in WAITING:
        raise JobStateError(f"{named(job)} is {job.status}: only a waiting job can be cancelled", job=job)
    table = type(job)
    cond = (table.id == job.id) & (table.revision == job.revision) & (table.status == job.status)
    with guarded(f"cancelling job {job.message_id}"):
        if not table.update(cancel_fields(table)).where(cond).execute():
            raise _changed(job, "while it was cancelled")
        logger.info("Job %s (%s) cancelled while %s.", job.message_id, job.actor_name, job.status)
        # After the row: the hold decided who may send the key; the lock only names the waiting job.
        token = ((job.options or {}).get(MARKER) or {}).get("qt")
        queue.release_key(suite, job.unique_key, token, job.message_id)
        return table.get_or_none(id=job.id) or job

"""Deliveries that end before the job runs: refused, skipped by another middleware, or duplicates.

A refused or skipped delivery ends the job (``failed``, its key freed); a second delivery of a running job
is sent again, due when the live attempt's lease runs out.  Decided here so that JobTracking stays small.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from dramatiq_unique import options as opt
from dramatiq_unique.context import MARKER, job_model
from dramatiq_unique.locks import queue
from dramatiq_unique.observe import events
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import MAX_ERROR_LENGTH, WAITING, JobStatus, utcnow

if TYPE_CHECKING:
    from dramatiq_unique.context import JobContext
    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import ActorConfig, Suite

logger = logging.getLogger(__name__)

#: ms added to a live attempt's lease before a duplicate copy of its job is delivered again.
RESEND_MARGIN = 50


def _frees_key(config: "ActorConfig", opts: dict) -> bool:  # has a key, and not until_expired (which keeps it)
    resolved = config.for_message(opts)
    return resolved.unique and resolved.unique_lock != opt.UNTIL_EXPIRED


def _waiting(model: Any, job_id: int, revision: int) -> Any:  # the row still waits for this very delivery
    return (model.id == job_id) & (model.revision == revision) & model.status.in_(WAITING) & model.parked_on.is_null()


def skip_reason(message: Any, started: bool = False) -> str:
    """``last_error`` of a job another middleware (or its actor) skipped: Dramatiq keeps the SkipMessage on
    the proxy when the middleware also failed the message (AgeLimit does); a plain skip leaves nothing."""
    error = getattr(message, "_exception", None)
    head = f"{type(error).__name__}: {error}" if error is not None else "SkipMessage: its message was skipped"
    return f"{head} ({'skipped after its attempt started' if started else 'skipped before it ran'})"


def fail_unstarted(suite: "Suite", config: "ActorConfig", message: Any, reason: str) -> None:
    """Mark failed, its key freed, the job of a delivery that ended before it started, while its row still
    waits for this very delivery."""
    model = job_model(suite, config.model, message.options)  # the store that holds the row
    marker = message.options.get(MARKER) or {}
    if "id" in marker:
        job_id, revision = int(marker["id"]), int(marker.get("rev", 0))
    else:  # sent without the suite and never adopted: its row, if it has one
        row = model.get_or_none(message_id=message.message_id)
        if row is None:
            return
        job_id, revision = row.id, row.revision
    fields: dict[str, Any] = dict(
        status=JobStatus.FAILED.value, finished_at=utcnow(), last_error=reason[:MAX_ERROR_LENGTH], lease_until=None,
    )
    waiting = _waiting(model, job_id, revision)
    if _frees_key(config, message.options):
        fields["unique_hold"] = None
        # The Redis key goes first, as at a finish: once a reader sees the job failed, its key is free in
        # Redis too.  Only while the row still waits for this delivery (else the row's hold decides).
        row = model.select(model.unique_key).where(waiting).first()
        if row is None:
            return
        queue.release_key(suite, row.unique_key, marker.get("qt"), message.message_id)
    rows = list(model.update(**fields).where(waiting).returning(model.unique_key).execute())
    if rows:
        logger.warning("Job %s (%s) marked failed before it ran: %s", message.message_id, message.actor_name,
                       reason.splitlines()[0], extra=events.fields(message.message_id, message.actor_name,
                                                                   rows[0].unique_key))


def note_refusal(suite: "Suite", config: "ActorConfig", message: Any, reason: str) -> None:
    """A delivery refused before the job started, which Retries sends again: the waiting row's
    ``last_error`` says why (``RedisUnavailable: ...``)."""
    marker = message.options.get(MARKER) or {}
    if "id" not in marker:
        return
    model = job_model(suite, config.model, message.options)
    try:
        model.update(last_error=reason[:MAX_ERROR_LENGTH]).where(
            _waiting(model, int(marker["id"]), int(marker.get("rev", 0)))).execute()
    except Exception as e:  # often the very outage that refused it: the row is only a report
        logger.debug("Could not note why job %s was refused: %s", message.message_id, e)


def wait_for_attempt(suite: "Suite", message: Any, running: "JobModel") -> None:
    """Send a duplicate delivery of a running job again, due when the attempt's lease runs out."""
    lease = running.lease_until
    left = (lease - utcnow()).total_seconds() * 1000 if lease is not None else 0
    delay = int(max(left, 0) + jobs.LEASE_SKEW_MS + RESEND_MARGIN)
    broker = suite.broker
    assert broker is not None  # set when a broker declared the tracked actor, before any job ran
    try:
        # The row's broker id becomes the copy's (enqueue.py): should the live attempt die,
        # the re-drive finds the copy waiting in the broker and leaves the job to it.
        broker.enqueue(getattr(message, "_message", message), delay=delay)
    except Exception as e:  # the broker is down: the re-drive recovers the job if the attempt dies
        logger.warning("Could not send duplicate job %s again (%s); the re-drive looks after it.",
                       message.message_id, e)
        return
    logger.info("Job %s is running in another attempt; this copy was sent again for in %d ms.", message.message_id,
                delay, extra=events.fields(message.message_id, message.actor_name, running.unique_key))


def fail_started(ctx: "JobContext", message: Any, free_queue_lock: Callable[[], None]) -> None:
    """A started attempt that a later middleware skipped: the job is over, failed, its key freed."""
    job, release = ctx.job, _frees_key(ctx.config, message.options)
    assert job is not None
    if release:
        free_queue_lock()  # first: once a reader sees the job finished, its key is free in Redis too
    jobs.finish(ctx.model, job, release_hold=release, lease_until=None, status=JobStatus.FAILED.value,
                 finished_at=utcnow(), last_error=skip_reason(message, started=True))


def record_revoked(ctx: "JobContext", job: "JobModel", release: bool, fields: dict) -> None:
    """An attempt's outcome whose fenced write was refused: recorded anyway if another job of the key took
    the token (its execution lock ran out under it) and no newer attempt started.  Left ``running``, the
    re-drive would report a job that did finish as lost, and run it again (storage/jobs.py's ``finish_revoked``)."""
    if ctx.fence_key is None:
        return  # only an execution lock's draw revokes another job's token
    fields = dict(fields)
    if fields.get("status") is None and ctx.retry_enqueued:
        # Retries sent the retry, whose own write (enqueue.py) was fenced out as well.
        fields.update(status=JobStatus.RETRYING.value, **ctx.retry_fields)
    if fields.get("status") == JobStatus.SUCCEEDED.value:
        # Succeeded, but say why another job of its key may have run beside it.
        fields["last_error"] = "LockLost: succeeded after its execution lock ran out; another job of its key ran"
    if jobs.finish_revoked(ctx.model, job, release_hold=release, lease_until=None, **fields):
        logger.warning("Job %s ended after its execution lock ran out; its outcome is recorded.", job.message_id,
                       extra=events.fields(job.message_id, job.actor_name, job.unique_key))

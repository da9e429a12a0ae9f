"""The enqueue side: recording a send, and uniqueness at enqueue (JobTracking's ``before_enqueue``), which
the database decides (docs/discussions/how-it-is-built.md, "Sending")."""

from __future__ import annotations

import contextvars
import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Callable, Optional

from dramatiq.common import q_name

from dramatiq_unique import options as opt
from dramatiq_unique.broker.refs import REDIS_MESSAGE_ID, broker_ref, is_resending
from dramatiq_unique.context import MARKER, active, job_model
from dramatiq_unique.durable import deferral, outbox
from dramatiq_unique.durable.messages import args_to_row, job_options, options_to_row
from dramatiq_unique.errors import DatabaseUnavailable, DramatiqUniqueError, DuplicateJob, NotConfigured
from dramatiq_unique.locks import queue
from dramatiq_unique.observe import events
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.database import DB_ERRORS
from dramatiq_unique.storage.models import JobStatus, after_ms, utcnow
from dramatiq_unique.unique import recent
from dramatiq_unique.unique.keys import bind_arguments, idempotency_hold

if TYPE_CHECKING:
    from dramatiq import Message

    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import ActorConfig, Suite

logger = logging.getLogger(__name__)

#: How many times a unique send tries its insert while the holders it meets go away.
MAX_INSERT_ROUNDS = 20

#: What the send under way wrote (set by send.py's wrapper), each as (undo: the publish failed; keep: the
#: broker is down, kept pending for the re-drive).
Created = tuple[Callable[[], None], Callable[[], None]]
created_rows: contextvars.ContextVar[Optional[list[Created]]] = contextvars.ContextVar("dramatiq_unique_created",
                                                                                      default=None)


class Redirect(DramatiqUniqueError):
    """Internal: the send resolves to an existing job"""

    # Caught by the wrapped enqueue (send.py), which returns the existing job's message, or with ``resend``
    # sends the replaced job again (its row's ``marker``, ``model``, a replace held for the outbox's ``stamp``).

    def __init__(self, message_id: str, *, resend: Optional[dict] = None) -> None:
        super().__init__(message_id)
        self.message_id = message_id
        self.resend = resend


def row_fields(config: "ActorConfig", message: "Message", delay: Optional[int]) -> dict[str, Any]:
    now = utcnow()
    options = options_to_row(job_options(message.options))
    args, kwargs = args_to_row(message.args, message.kwargs)
    fields: dict[str, Any] = {
        "app": config.app,
        "message_id": message.message_id,
        "actor_name": message.actor_name,
        "queue_name": q_name(message.queue_name),
        "args": args,
        "kwargs": kwargs,
        "options": options,
        "status": JobStatus.QUEUED.value,
        "created_at": now,
        "enqueued_at": now,
        "process_after": after_ms(delay, now),
        # The Redis broker's id for this delivery; other brokers have none: the message id says "published".
        "broker_ref": broker_ref(message),
    }
    idempotency_key = message.options.get("idempotency_key")
    if idempotency_key is not None:  # set by submit()
        owner = message.options.get("owner")
        fields.update(
            idempotency_key=idempotency_key, owner=owner,
            idempotency_hold=idempotency_hold(message.actor_name, owner, idempotency_key),
        )
    if config.extra_fields:
        bound = bind_arguments(config.fn, message.args, message.kwargs)
        fields.update({name: bound.get(name) for name in config.extra_fields})
    return fields


def new_row(config: "ActorConfig", message: "Message", delay: Optional[int], *, pending: bool,
            deferred: bool) -> tuple[dict[str, Any], Optional[str], bool]:
    """A new send's row fields, its unique key, and whether it holds the key (a lock type with a queue
    lock, whose token its marker carries: the message id, which a worker releases it with)."""
    key = recent.key_of(config, message)
    fields = row_fields(config, message, delay)
    fields["unique_key"] = key
    if pending:
        fields.update(status=JobStatus.PENDING.value, enqueued_at=None, broker_ref=None)
    holds = key is not None and config.for_message(message.options).unique_lock in opt.QUEUE_LOCKS
    marker: dict[str, Any] = {"qt": message.message_id} if holds else {}
    if deferred:
        marker[deferral.DEFERRED] = 1
    fields["options"][MARKER] = marker
    if holds:
        fields["unique_hold"] = key
    return fields, key, holds


def made_row(suite: "Suite", model: Any, row_id: int, fields: dict, key: Optional[str]) -> Created:
    """How to undo a row inserted with ``fields`` (and the queue lock it took of ``key``), and how to keep it."""

    def undo() -> None:
        model.delete_by_id(row_id)
        queue.release_key(suite, key, fields["message_id"], fields["message_id"])

    # Kept, the lock, if it was written, names the waiting job: it stays (the database decides anyway).
    return undo, lambda: deferral.keep(model, row_id, fields["broker_ref"], fields["options"])


def created_row(suite: "Suite", model: Any, row_id: int, fields: dict, key: Optional[str]) -> None:
    """A row this send inserted, for its wrapper; a pending row (outbox, deferred) is not this send's to publish."""
    created = created_rows.get()
    if created is not None and fields["status"] == JobStatus.QUEUED.value:
        created.append(made_row(suite, model, row_id, fields, key))


def publish_failed(suite: "Suite", broker: Any, created: list[Created], error: BaseException) -> bool:
    """A publish failed with ``error``: what the send wrote kept pending for the re-drive if the broker is
    down (on_broker_down="defer"; True), else undone, as a row left behind would be a phantom job."""
    if created and deferral.defers(suite, error):
        try:
            for _, keep in created:
                keep()
        except Exception:
            # The database is down too: the row, if left queued, is found by the lost-message check.
            logger.exception("Could not keep %d jobs pending after the broker failed.", len(created))
        else:
            deferral.failed(suite, broker, error)
            return True
    undo_all(created)
    return False


def undo_all(created: list[Created]) -> None:
    for undo, _ in created:
        try:
            undo()
        except Exception:  # the error that made it undo matters more
            logger.exception("Could not undo a job row after a failed send.")


def on_enqueue(suite: "Suite", config: "ActorConfig", message: "Message", delay: Optional[int]) -> None:
    """``before_enqueue`` for a tracked actor."""
    opts = message.options
    marker = opts.get(MARKER)
    if marker is not None and "id" in marker:
        _known(suite, config, message, delay)
        return
    held = outbox.active()
    # The broker failed a moment ago: kept pending without trying it (durable/deferral.py).
    deferred = held is None and deferral.skip_publish(suite)
    # Not in the broker until the caller's transaction commits, or it is back.
    fields, key, holds = new_row(config, message, delay, pending=held is not None or deferred, deferred=deferred)
    marker = fields["options"][MARKER]

    def write(target: "type[JobModel]") -> tuple[int, int]:
        try:
            if holds:
                return _insert_unique(suite, config, message, delay, str(key), fields)
            row_id, revision, created = jobs.adopt(target, fields)  # the same message sent again: the same job
        except jobs.IdempotencyHeld as held_by:  # submit() with a key that a job already has
            raise Redirect(held_by.job.message_id) from None
        if created:
            created_row(suite, target, row_id, fields, None)
        return row_id, revision

    model, (row_id, revision) = store(suite, config, opts, held, write, marker)
    marker.update(id=row_id, rev=revision)
    opts[MARKER] = marker
    if held is not None:
        if suite.broker is None:  # set when a broker declares a tracked actor, before any send of it
            raise NotConfigured("no broker has declared a tracked actor")
        raise held.defer(suite.broker, message, delay, (model, row_id, revision))
    if deferred:
        raise outbox.Deferred(dataclasses.replace(message, options=job_options(message.options)))


def store(suite: "Suite", config: "ActorConfig", opts: dict, held: Any, write: Callable[[Any], Any],
          marker: dict) -> tuple["type[JobModel]", Any]:
    """``write(model)`` on the primary store, or, while it is down and the send may fail over, another (whose
    index ``marker`` gets); returns the model written and what ``write`` returned."""
    if suite.stores.several and held is None and may_fail_over(config, opts):
        return suite.stores.insert(config.model, write, marker)
    # With one store, on_primary only calls write.
    return config.model, suite.stores.on_primary(config.model, lambda: _needs(config, opts, held),
                                                 lambda: write(config.model))


def may_fail_over(config: "ActorConfig", opts: dict) -> bool:
    """Whether a send's row may go to another store while the primary is down: not a unique or idempotent one
    (a key is unique by the primary's index alone), nor one taking a lock or slot (waiters wake from one table)."""
    resolved = config.for_message(opts)
    return not (resolved.unique or resolved.has_slots) and opts.get("idempotency_key") is None


def _needs(config: "ActorConfig", opts: dict, held: Any) -> str:
    """What makes a send need the primary, for its DatabaseUnavailable."""
    what = "an idempotent" if opts.get("idempotency_key") is not None else "a unique" \
        if config.for_message(opts).unique else "a slot-taking" if held is None else "a transaction()'s"
    return f"{what} send of {config.actor_name}"


def _known(suite: "Suite", config: "ActorConfig", message: "Message", delay: Optional[int]) -> None:
    """A message that already has a row: a retry, a delayed message coming due, a re-drive."""
    ctx = active.get()
    model = job_model(suite, config.model, message.options)  # the store that holds its row
    ref = message.options.get(REDIS_MESSAGE_ID)  # the Redis broker's id for this delivery
    if ctx is None or ctx.job is None or ctx.message.message_id != message.message_id:
        # A promotion from a delay queue (the broker gives it a new id, which the
        # lost-message check looks up) or a re-send by the suite (which records it).
        if ref and not is_resending():
            row_id = message.options[MARKER]["id"]
            try:
                model.update(broker_ref=ref, missing_since=None).where(model.id == row_id).execute()
            except DB_ERRORS:
                # The database is down (Retries re-sending a start that failed on it): the message matters more.
                logger.warning("Sending job %s with its row's broker id not updated: the database is down; "
                               "the re-drive may send it again, a duplicate its start drops.", message.message_id)
        return
    # Retries re-enqueues the running message: the same job, due again later.
    ctx.retry_enqueued = True
    retry = dict(process_after=after_ms(delay), enqueued_at=utcnow(), broker_ref=ref or message.message_id)
    # Kept for JobTracking, should this write be fenced out (durable/refused.record_revoked).
    ctx.retry_fields = retry
    model.update(status=JobStatus.RETRYING.value, missing_since=None, **retry).where(
        (model.id == ctx.job.id) & (model.fencing_token == ctx.job.fencing_token)
    ).execute()
    # If the publish fails, JobTracking records a retry that the re-drive must send; the
    # same if the broker is down: the re-drive sends the retry when it is due.
    created = created_rows.get()
    if created is not None:
        not_enqueued = lambda: setattr(ctx, "retry_enqueued", False)  # noqa: E731
        created.append((not_enqueued, not_enqueued))


def queue_lock_ttl(config: "ActorConfig", opts: dict, lock: str, delay: Optional[int]) -> float:
    resolved = config.for_message(opts)
    window = resolved.unique_window
    if lock == opt.UNTIL_EXPIRED and window is not None:
        return float(window)
    ttl = resolved.unique_ttl
    if window is not None:
        ttl = min(ttl, float(window))
    return ttl + (delay or 0)


def _insert_unique(
    suite: "Suite", config: "ActorConfig", message: "Message", delay: Optional[int], key: str, fields: dict,
) -> tuple[int, int]:
    """Insert a row holding ``key``, then take its queue lock (not if kept pending); (row id, revision)."""
    opts = message.options
    resolved = config.for_message(opts)
    conflict, lock = resolved.unique_on_conflict, resolved.unique_lock
    window = recent.window(config, opts, lock)
    for _ in range(MAX_INSERT_ROUNDS):
        row_id, holder = jobs.insert_holding(config.model, fields, key, window, full=conflict != "skip")
        if row_id is not None:
            # Inside transaction() the send is published at the caller's commit, or rolled back: the
            # lock is left out (the index decides either way); so for a send kept pending.
            queued = fields["status"] == JobStatus.QUEUED.value
            created_row(suite, config.model, row_id, fields, key if queued else None)
            if queued:
                take_queue_lock(suite, message, suite.keys.queue_lock(key), queue_lock_ttl(config, opts, lock, delay))
            return row_id, 0
        if holder is None:
            continue  # the key came free meanwhile
        if holder.message_id == message.message_id:
            return holder.id, holder.revision  # this very message, sent again
        if not _conflict(config, message, delay, key, conflict, holder):
            continue  # the holder started while we looked: the key is free again
    raise DatabaseUnavailable(f"could not settle the unique hold {key!r}")


def take_queue_lock(suite: "Suite", message: "Message", lock_name: str, ttl: float) -> None:
    """The queue lock of a send that holds its key (:func:`~dramatiq_unique.locks.queue.take_many`); on the
    broker's own server it goes with the publish (broker/publish.py)."""
    lock = (lock_name, message.message_id, ttl)
    if suite.publisher is None or not suite.publisher.later(lock):
        queue.take_many(suite, [lock])


def _conflict(
    config: "ActorConfig", message: "Message", delay: Optional[int], key: str, conflict: str, holder: "JobModel"
) -> bool:
    """Resolve a send that collided with ``holder``: raises, or False to try the insert again."""
    if conflict == "raise":
        events.duplicate("raise", message, holder.message_id, key)
        raise DuplicateJob(f"{config.actor_name} job {holder.message_id} is {holder.status}", job=holder)
    why = ""
    if conflict == "replace":
        args, kwargs = args_to_row(message.args, message.kwargs)
        # Inside transaction(): the new message is held until the commit, and claims the row only if
        # this replace is the last committed write of it (durable/outbox.py).
        block = outbox.active()
        stamp, held = block.stamp(config.model) if block is not None else (None, None)
        replaced = jobs.replace(config.model, holder, key, args, kwargs, after_ms(delay), held=held)
        if replaced is not None:
            marker = dict((replaced.options or {}).get(MARKER) or {})
            marker.update(id=replaced.id, rev=replaced.revision)
            events.duplicate("replace", message, replaced.message_id, key)
            raise Redirect(replaced.message_id, resend={"marker": marker, "model": config.model, "stamp": stamp})
        refreshed = config.model.get_or_none(id=holder.id)
        if refreshed is None or refreshed.unique_hold != key:
            return False
        why = f"it is {refreshed.status}: nothing to replace"
    events.duplicate("skip", message, holder.message_id, key, why)
    raise Redirect(holder.message_id)

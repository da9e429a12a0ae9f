"""The job record: a row per tracked message, from send to outcome."""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, ClassVar

from dramatiq import Middleware
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import ShutdownNotifications, SkipMessage, TimeLimit
from dramatiq.middleware.retries import DEFAULT_MIN_BACKOFF, Retries

from dramatiq_unique import context
from dramatiq_unique import options as opt
from dramatiq_unique.broker import consumer
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable import outbox, refused
from dramatiq_unique.durable.fetched import Fetches
from dramatiq_unique.durable.outcome import format_error, outcome
from dramatiq_unique.durable.successes import Successes
from dramatiq_unique.guard import hook, own_skip
from dramatiq_unique.locks import queue
from dramatiq_unique.middleware import time_limit
from dramatiq_unique.parking.groups import WAKE
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.database import greenlet_connections
from dramatiq_unique.storage.models import FINISHED, JobStatus
from dramatiq_unique.suite import Suite
from dramatiq_unique.unique.enqueue import on_enqueue, row_fields
from dramatiq_unique.unique.send import install_enqueue

logger = logging.getLogger(__name__)

#: Middlewares that may raise an exception in a worker thread from outside (an actor past its time limit, a worker
#: shutting down) until their own after hook, which runs after the suite's.  Raised in the suite's after hooks, it
#: would cut an outcome short, and Dramatiq would then run every after hook again with it as the attempt's error:
#: a job recorded ``succeeded`` would be recorded ``retrying`` and run again.
INTERRUPTERS = (TimeLimit, ShutdownNotifications)


#: Set on an actor function that :func:`disarm_on_return` wrapped.
_DISARMS = "_dramatiq_unique_disarms"


def disarm(broker: Any, message: Any) -> None:
    """The actor is done (or never ran): nothing is left for :data:`INTERRUPTERS` to interrupt.  Their own after
    hooks, called now, are idempotent; Dramatiq calls them again later."""
    for middleware in broker.middleware:
        if isinstance(middleware, INTERRUPTERS):
            middleware.after_process_message(broker, message)


def disarm_on_return(actor: Any) -> None:
    """Disarm :data:`INTERRUPTERS` as soon as ``actor`` returns or raises, whether or not it is tracked.  The after
    hooks of the middlewares that come after the suite's run before the suite's (Retries': a retry's send, which a
    stalled Redis holds up); an interrupt raised there escapes Dramatiq's worker loop and ends the worker thread.
    Their own hooks only read the thread (``message`` is not used)."""
    fn = actor.fn
    if getattr(fn, _DISARMS, False):
        return

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            disarm(actor.broker, None)

    setattr(call, _DISARMS, True)
    actor.fn = call


def check_start(ctx: context.JobContext, began: float) -> None:
    """Raise LockLost before the actor runs if more than the row's lease has passed since ``began``
    (monotonic: when the start, or the execution lock before it, was asked for).  A late reply may report
    a start whose lease ran out, the job since sent again, even run; with an execution lock it is also
    checked before the start draws the key's fencing token."""
    took = time.monotonic() - began
    if took * 1000 >= ctx.config.unique_ttl:
        ctx.fail(f"starting job {ctx.message.message_id} took {took:.1f} s, longer than its lease")


class JobTracking(Middleware):
    """Keeps a job row for every message of a tracked actor.

    An actor is tracked when it sets ``track=True`` or any other suite option.  Untracked actors cost nothing: no
    database or Redis call. Add it before :class:`~dramatiq.middleware.Retries` so that its ``after_process_message``
    sees what Retries decided.

    Declares the row's options and the unique ones it applies as a job is sent, started and finished.  An actor whose
    lock type holds an execution lock needs :class:`ExecutionLocks` too; one with a concurrency option needs
    :class:`ConcurrencySlots` (both before this one): the actor is refused when it is declared otherwise.

    Parameters:
      suite: the configuration that :func:`dramatiq_unique.setup` returns.
    """

    #: Names this middleware where the suite checks which of its middlewares a broker has.
    capability: ClassVar[str] = opt.TRACKING
    actor_options = set(opt.TRACKING_OPTIONS | opt.UNIQUE_OPTIONS)

    def __init__(self, *, suite: Suite) -> None:
        self.suite = suite
        self.fetches = Fetches(suite)
        self.successes = Successes()

    @hook
    def before_declare_actor(self, broker, actor) -> None:
        self.suite.broker = broker
        opt.check_actor(broker, actor)
        if self.suite.configure_actor(actor) is not None:
            install_enqueue(broker, self.suite)
        disarm_on_return(actor)  # after the gates made an async actor carry the context

    @hook
    def before_enqueue(self, broker, message, delay) -> None:
        config = self.suite.actor_config(message.actor_name)
        if config is None:
            held = outbox.active()
            if held is not None and getattr(broker.enqueue, "_dramatiq_unique", False):
                raise held.defer(broker, message, delay)  # untracked, inside transaction(): after commit
            return
        on_enqueue(self.suite, config, message, delay)

    # -- processing ---------------------------------------------------------

    @hook
    def before_process_message(self, broker, message) -> None:
        config = self.suite.actor_config(message.actor_name)
        if config is None:
            return
        ctx = context.attach(message, self.suite, config)
        if message.failed or ctx.job is not None:
            # Rejected by an earlier middleware (after_process_message records it), or started by another JobTracking
            # of this broker (setup() called on it again): the same delivery, not a duplicate to refuse and skip.
            return
        began = time.monotonic()
        if ctx.asked is not None:
            # The start draws the key's fencing token, which fences out the key's running attempts.
            # A process frozen after it took the lock, for longer than the lock's lease, would fence
            # out the lock's next holder: it gives up here instead, before the draw.  A row its
            # claim started is judged from when that start was asked for.
            began = ctx.asked
            check_start(ctx, began)
        job = self._start(message, ctx)
        if job is not None and job.__data__.get("queue_name") is None:
            # A start reads back a few columns only; the attempt's metrics are labelled by its queue.
            job.__data__["queue_name"] = message.queue_name
        ctx.job = job
        context.active.set(ctx)
        if job is not None:
            # A start whose reply came after its lease ran out does not run; one its fetch made, or a claim,
            # counts from when that was asked for.
            check_start(ctx, began if ctx.asked is None else ctx.asked)

    def _start(self, message, ctx):
        marker = message.options.get(MARKER) or {}
        config = ctx.config  # with the message's own options
        release_hold = config.released_at_start
        if "id" not in marker:
            # A message sent without the suite (before set-up, another producer): give it a row.
            job_id, revision, _ = jobs.adopt(config.model, row_fields(config, message, None))
            marker = {"id": job_id, "rev": revision}
            ctx.model = config.model  # adopted rows are the primary's
        started, ctx.started = ctx.started, None
        if started is not None and started.id == marker["id"]:
            job = started  # its claim started it (parking/lot.py)
        elif (fetched := self.fetches.take(message)) is not None:
            job, ctx.asked = fetched  # started with its fetch (durable/fetched.py)
        else:
            job = jobs.start(
                ctx.model,  # the store that holds the row (its message's marker says which)
                marker["id"],
                revision=marker.get("rev", 0),
                lease_ms=config.unique_ttl,
                worker=f"{self.suite.worker_id}:{threading.get_ident()}",
                release_hold=release_hold,
                fence_key=ctx.fence_key,
                # A row started ahead by its waker's claim is this delivery's only if it is the woken
                # message (a gate took up its reservation, or another gate's is still on it); a copy
                # of the job's first message is a duplicate of that attempt like any other.
                woken_by=jobs.WOKEN if ctx.woken or WAKE in marker else None,
            )
        if job is None:
            return self._not_started(message, ctx, marker)
        if release_hold:  # the start cleared the row's hold: the queue lock goes too (locks/queue.py)
            queue.release(self.suite, job, marker, wait=False)
        return job

    def _not_started(self, message, ctx, marker):
        """The start found the job finished, replaced, gone or running: skip it (a running
        job's copy waits for the attempt, refused.py), or record it anew."""
        existing = ctx.model.get_or_none(id=marker["id"])
        if existing is None:
            logger.warning("Job row of message %s is gone; recording it anew.", message.message_id)
            message.options.pop(MARKER, None)
            return self._start(message, ctx)
        if existing.status in FINISHED:  # cancelled included (cancel_job): skipped, no failure recorded
            raise SkipMessage(f"job {message.message_id} already {existing.status}")
        if existing.revision == marker.get("rev", 0) and existing.status == JobStatus.RUNNING:
            # A second delivery of a running job: it must not run beside the attempt.
            refused.wait_for_attempt(self.suite, message, existing)
            raise SkipMessage(f"job {message.message_id} is running in another attempt; this copy waits")
        if existing.revision == marker.get("rev", 0):
            # Left running a moment ago (a retry is due, or it was woken): its own message carries it.
            raise SkipMessage(f"job {message.message_id} is {existing.status}: a superseded copy")
        raise SkipMessage(f"job {message.message_id} was replaced by revision {existing.revision}")

    def after_process_message(self, broker, message, *, result=None, exception=None) -> None:
        self.fetches.release([message])  # refused before its start: its fetch's start is undone
        ctx = context.of(message)
        if ctx is None:
            if message.failed:  # refused by a middleware before ours could look at it
                self._refused(message, exception)
            return
        if ctx.recorded:
            return  # emitted again for this attempt: an interrupt escaped an after hook (see INTERRUPTERS)
        ctx.recorded = True
        disarm(broker, message)
        context.active.set(None)
        context.run_before_record(ctx)
        try:
            self._record(broker, ctx, message, result, exception)
        except Exception:
            # Dramatiq swallows after-hook errors; say so loudly.  The
            # row keeps its lease, and the re-drive settles it.
            logger.exception("Could not record the outcome of job %s.", message.message_id)

    def _record(self, broker, ctx, message, result, exception) -> None:
        config, job = ctx.config, ctx.job
        opts = message.options
        if job is None:
            if message.failed:  # refused before it started, and Dramatiq gave up on it
                self._refused(message, exception)
            elif exception is not None:  # refused, and Retries sends it again: say why it waits
                refused.note_refusal(self.suite, config, message, format_error(exception))
            return
        if exception is None and ctx.lock_lost is not None:
            # heartbeat() raised LockLost and the actor returned anyway: not a success.
            # Nothing re-sends it (Retries saw no error): retrying, for the re-drive.
            exception = ctx.lock_lost
        fields, done = outcome(
            message, result, exception,
            retries=any(isinstance(m, Retries) for m in broker.middleware), retry_enqueued=ctx.retry_enqueued,
            min_backoff=opt.lookup(opts, config.options, "min_backoff", DEFAULT_MIN_BACKOFF),
        )
        release = done and config.unique and config.unique_lock == opt.UNTIL_EXECUTED
        if release:
            # Before the row says it finished: once a reader sees it finished, the key is free in Redis too.  The row's
            # hold stays the authority meanwhile, so a send in between is still resolved correctly.
            queue.release(self.suite, job, opts.get(MARKER) or {})
        if not self.successes.finish(ctx.model, job, release_hold=release, lease_until=None, **fields):
            refused.record_revoked(ctx, job, release, fields)

    def _refused(self, message, exception) -> None:
        """A delivery Dramatiq gave up on before the job started: failed, its key freed."""
        config = self.suite.actor_config(message.actor_name)
        if config is None:
            return
        reason = format_error(exception) if exception is not None else "rejected before it started"
        try:
            refused.fail_unstarted(self.suite, config, message, reason)
        except Exception:
            logger.exception("Could not record job %s as failed; the re-drive settles it.", message.message_id)

    def after_skip_message(self, broker, message) -> None:
        self.fetches.release([message])
        ctx = context.of(message)
        if ctx is not None:
            disarm(broker, message)  # a skip's record, and the gates' hand-on after it, are not to be cut either
        context.active.set(None)
        if own_skip(message):
            return  # parked, or a finished, replaced or running job's copy dropped: not a failure
        config = self.suite.actor_config(message.actor_name)
        if config is None:
            return
        try:
            if ctx is not None and ctx.job is not None:  # skipped after its start (a later middleware)
                context.run_before_record(ctx)
                refused.fail_started(ctx, message, lambda: queue.release(
                    self.suite, ctx.job, message.options.get(MARKER) or {}))
            else:
                refused.fail_unstarted(self.suite, config, message, refused.skip_reason(message))
        except Exception:
            logger.exception("Could not record skipped job %s; the re-drive settles it.", message.message_id)

    # -- thread hygiene: peewee connections are per thread --------------------

    def before_worker_boot(self, broker, worker) -> None:
        time_limit.install(broker)  # its interrupts must not wedge the process (see there)
        if isinstance(broker, RedisBroker):
            consumer.listen(broker, self.fetches)  # before the worker's consumers are made

    def after_worker_boot(self, broker, worker) -> None:
        for db in self.suite.stores.databases:
            if (warning := greenlet_connections(db, worker.worker_threads)) is not None:
                logger.warning(warning)

    def before_worker_thread_shutdown(self, broker, thread) -> None:
        self.suite.close()

    before_consumer_thread_shutdown = before_worker_thread_shutdown

    def after_worker_shutdown(self, broker, worker) -> None:
        self.suite.close()

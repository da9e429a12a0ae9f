"""Per-attempt state: what the middlewares know about the message being processed, on the message proxy
and, while the actor runs, in a context variable read by :func:`current_job` and friends; and the attempt's
leases: the gates it holds while it runs (an execution lock, a concurrency slot), taken by the gate middlewares
(:mod:`dramatiq_unique.middleware.gates`), and its row's, which ``heartbeat()`` renews.

A job that cannot enter a gate parks (:mod:`dramatiq_unique.parking.lot`) and is woken by the holder
that leaves.  A lost lease is remembered in the attempt's context: later heartbeats raise at once,
and the attempt is not recorded as succeeded.  ``checkpoint()`` stores a finished step's result on the row, in
one write fenced by the attempt's token, so that a retry does not redo it (docs/howto/checkpoints.md).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional, TypeVar

from dramatiq.asyncio import async_to_sync

from dramatiq_unique.errors import DatabaseUnavailable, LockLost, NotInJob, NotSerializable
from dramatiq_unique.guard import guarded
from dramatiq_unique.observe import events
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.database import DB_ERRORS
from dramatiq_unique.storage.jobs import PARTIAL
from dramatiq_unique.storage.models import after_ms, dumps
from dramatiq_unique.storage.stores import STORE

if TYPE_CHECKING:
    import dramatiq
    from dramatiq.broker import MessageProxy

    from dramatiq_unique.parking.groups import Gate
    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import ActorConfig, Suite

#: The key of the suite's bookkeeping in ``message.options``.
MARKER = "dramatiq_unique"

_ATTRIBUTE = "_dramatiq_unique_context"

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Held:
    """A gate held by one attempt; :meth:`renew` is its ``heartbeat()`` renewer."""

    gate: "Gate"
    group: str
    token: str
    ttl_ms: float
    #: The limit it entered under (a slot group's; -1: none).
    limit: int = -1

    def renew(self) -> float:
        """Extend the lease to a full ``ttl_ms``; the seconds left."""
        started = time.monotonic()
        if not self.gate.renew(self.group, self.token, self.ttl_ms, self.limit):
            raise LockLost(self.gate.lost.format(self.group))
        return self.ttl_ms / 1000 - (time.monotonic() - started)


@dataclasses.dataclass
class JobContext:
    """One attempt of one tracked job."""

    suite: "Suite"
    #: The actor's options, with the message's own over them (:meth:`ActorConfig.for_message`).
    config: "ActorConfig"
    message: "MessageProxy"
    #: The job's row once the attempt has started.
    job: "Optional[JobModel]" = None
    #: Set when Retries re-enqueued the message during this attempt.
    retry_enqueued: bool = False
    #: The job's model in the store that holds its row (:func:`job_model`); set by :func:`attach`.
    model: "Any" = None
    #: The gates the attempt holds, by kind ("lock", "slot"): parking/groups.py.
    held: dict[str, Held] = dataclasses.field(default_factory=dict)
    #: Run when the actor is done, before the outcome is recorded (a slot is handed on first).
    before_record: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    #: The LockLost that ended the attempt's hold: it is not recorded as succeeded.
    lock_lost: Optional[LockLost] = None
    #: time.monotonic() of the last write of the row's lease (:func:`heartbeat`).
    lease_written: Optional[float] = None
    #: The unique key whose fencing token the start draws (an execution lock is held).
    fence_key: Optional[str] = None
    #: time.monotonic() when the first lease the attempt runs under was asked for: its execution lock,
    #: or its row's start by its waker's claim.  The lease runs from then, whenever the reply came.
    asked: Optional[float] = None
    #: The row a woken job's claim already started (parking).
    started: "Optional[JobModel]" = None
    #: This delivery is a woken job's message: only it may start a row its waker's claim started.
    woken: bool = False
    #: The fields a retry's send wrote (or meant to write) on the row.
    retry_fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The outcome's recording has begun: a second ``after_process_message`` of the attempt records nothing.
    recorded: bool = False

    def fail(self, error: LockLost | str) -> NoReturn:
        """Raise LockLost, remembered first: the attempt lost its hold and must not be recorded as succeeded."""
        error = LockLost(error) if isinstance(error, str) else error
        self.lock_lost = error
        events.lock_lost(self.job, error)
        raise error


#: The attempt whose actor runs in this context (set while it runs): :func:`require` and :func:`current_job` read it.
active: contextvars.ContextVar[Optional[JobContext]] = contextvars.ContextVar("dramatiq_unique_job", default=None)


def attach(message: "MessageProxy", suite: "Suite", config: "ActorConfig") -> JobContext:
    """The message's context, made on first use."""
    ctx = getattr(message, _ATTRIBUTE, None)
    if ctx is None:
        ctx = JobContext(suite, config.for_message(message.options), message,
                         model=job_model(suite, config.model, message.options))
        setattr(message, _ATTRIBUTE, ctx)
    return ctx


def store_of(options: dict) -> int:
    """The store that holds the row of the job whose message has ``options`` (0: the primary)."""
    marker = options.get(MARKER)
    return int(marker.get(STORE, 0)) if marker else 0


def job_model(suite: "Suite", model: "type[JobModel]", options: dict) -> "type[JobModel]":
    """``model`` in the store that holds the row of the job whose message has ``options``."""
    index = store_of(options)
    return model if index == 0 else suite.stores.model_in(model, index)


def of(message: Any) -> Optional[JobContext]:
    return getattr(message, _ATTRIBUTE, None)


def require() -> JobContext:
    ctx = active.get()
    if ctx is None or ctx.job is None:
        raise NotInJob()
    return ctx


def current_job() -> "JobModel":
    """Inside an actor: the current job's row."""
    ctx = require()
    job = ctx.job
    if getattr(job, PARTIAL, False):
        # The start returned only what the middlewares need: the rest read once, the attempt's own columns kept.
        model = type(job)  # in the store that holds the row
        full = model.get_or_none(model.id == job.id)  # type: ignore[union-attr]
        if full is not None:
            full.__data__.update(job.__data__)  # type: ignore[union-attr]
            ctx.job = job = full
    return job  # type: ignore[return-value]


def run_before_record(ctx: JobContext) -> None:
    """Run (once) what other middlewares left to do before the outcome is recorded."""
    steps, ctx.before_record = ctx.before_record, []
    for step in steps:
        try:
            step()
        except Exception:  # the outcome must still be written
            logger.exception("A step before recording job %s failed.", ctx.message.message_id)


T = TypeVar("T")

#: The row's lease is rewritten when a tenth of it has passed (Redis leases every call).
LEASE_REWRITE_FRACTION = 0.1

_CARRIES = "_dramatiq_unique_carries_context"


def heartbeat() -> float:
    """Inside an actor: renew the current job's leases; returns the seconds left.

    Renews the execution lock and concurrency slot the job holds (one Redis round trip each, every call) and
    the job row's lease (a database write at most every tenth of ``unique_ttl``).  Call it as often as you
    like: there is no limit on renewals.

    Raises :class:`~dramatiq_unique.errors.LockLost` if a lease is gone (it ran out, or Redis lost it, or a
    newer attempt took the job): stop the work, the attempt will not be recorded as succeeded.
    """
    ctx = require()
    if ctx.lock_lost is not None:
        raise LockLost(ctx.lock_lost.detail)
    started = time.monotonic()
    try:
        left = [held.renew() for held in ctx.held.values()]
    except LockLost as e:
        ctx.fail(e)
    left.append(_renew_row(ctx))
    remaining = min(left) - (time.monotonic() - started)
    if remaining <= 0:
        # The renewal took longer than the lease (a network cut, a stalled server, a frozen process):
        # counted from when it was sent, the lease may have run out before it landed, and a newer
        # attempt may hold the job by now.  A late "yes" is not a hold.
        ctx.fail(f"renewing the leases of job {ctx.message.message_id} took "
                  f"{time.monotonic() - started:.1f} s, longer than the lease")
    events.heartbeat(ctx.job)
    return remaining


def _renew_row(ctx: JobContext) -> float:
    job = ctx.job
    assert job is not None
    ttl = ctx.config.unique_ttl
    now = time.monotonic()
    written = ctx.lease_written
    if written is not None and (now - written) * 1000 < ttl * LEASE_REWRITE_FRACTION:
        return ttl / 1000 - (now - written)
    try:
        renewed = jobs.update_fenced(type(job), job.id, job.fencing_token, {"lease_until": after_ms(ttl)})
    except DB_ERRORS as e:
        raise DatabaseUnavailable(f"renewing the lease of job {job.message_id}: {e}") from e
    if not renewed:
        events.fenced_out(job, "lease")
        ctx.fail(f"job {job.message_id} was taken over by a newer attempt")
    ctx.lease_written = now
    return ttl / 1000


def carry_context(actor: "dramatiq.Actor") -> None:
    """Make an async actor's coroutine see the attempt's context, however the loop runs it."""
    fn = actor.fn
    original = getattr(fn, "__wrapped__", None)
    if getattr(fn, _CARRIES, False) or original is None or not inspect.iscoroutinefunction(original):
        return

    @functools.wraps(original)
    async def run(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        active.set(ctx)
        return await original(*args, **kwargs)

    runner = async_to_sync(run)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        # Runs on the worker thread, where the middlewares set the context.
        return runner(active.get(), *args, **kwargs)

    setattr(call, _CARRIES, True)
    actor.fn = call


def step_key(name: str) -> str:
    """A key for step ``name`` of the current job, the same on every attempt."""
    job = require().job
    return f"{job.message_id}:{name}"  # type: ignore[union-attr]


def checkpoint(name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` once per job; on a retry return its stored result.

    The result must be JSON-serialisable; what is returned is its JSON
    form, the same on the first attempt and on retries (a tuple comes back
    as a list).  Raises :class:`NotSerializable` before the step is
    recorded as done, :class:`LockLost` if a newer attempt owns the job, and
    :class:`DatabaseUnavailable` if the step cannot be checked or recorded.
    """
    job = require().job
    assert job is not None
    done = dict(job.checkpoints or {})
    if name in done:
        return done[name]
    model = type(job)
    with guarded(f"checking the fence of job {job.message_id}"):  # a zombie should not even start the step
        token = model.select(model.fencing_token).where(model.id == job.id).scalar()
    if token != job.fencing_token:
        raise events.lock_lost(job, LockLost(f"job {job.message_id} was started again by a newer attempt"))
    result = fn(*args, **kwargs)
    try:
        stored = json.loads(dumps(result))
    except (TypeError, ValueError) as e:
        raise NotSerializable(f"step {name!r} of {job.actor_name} returned a {type(result).__name__}") from e
    done[name] = stored
    with guarded(f"recording step {name!r} of job {job.message_id}"):
        recorded = jobs.update_fenced(model, job.id, job.fencing_token, {"checkpoints": done})
    if not recorded:
        events.fenced_out(job, "checkpoint")
        raise LockLost(f"job {job.message_id} was started again by a newer attempt; step {name!r} not recorded")
    job.checkpoints = done
    return stored

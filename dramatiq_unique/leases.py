"""An attempt's leases: the gates it holds while it runs (an execution lock, a concurrency slot), taken
by the gate middlewares (:mod:`dramatiq_unique.middleware.gates`), and its row's; ``heartbeat()`` renews them all.

A job that cannot enter a gate parks (:mod:`dramatiq_unique.parking.lot`) and is woken by the holder
that leaves.  A lost lease is remembered in the attempt's context: later heartbeats raise at once,
and the attempt is not recorded as succeeded.  ``checkpoint()`` stores a finished step's result on the row, in
one write fenced by the attempt's token, so that a retry does not redo it (docs/howto/checkpoints.md).
"""

from __future__ import annotations

import functools
import inspect
import json
import time
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from dramatiq.asyncio import async_to_sync

from dramatiq_unique import context
from dramatiq_unique.context import JobContext
from dramatiq_unique.errors import DatabaseUnavailable, LockLost, NotSerializable
from dramatiq_unique.guard import guarded
from dramatiq_unique.observe import events
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.database import DB_ERRORS
from dramatiq_unique.storage.models import after_ms, dumps

if TYPE_CHECKING:
    import dramatiq

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
    ctx = context.require()
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
        context.activate(ctx)
        return await original(*args, **kwargs)

    runner = async_to_sync(run)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        # Runs on the worker thread, where the middlewares set the context.
        return runner(context.active(), *args, **kwargs)

    setattr(call, _CARRIES, True)
    actor.fn = call


def step_key(name: str) -> str:
    """A key for step ``name`` of the current job, the same on every attempt."""
    job = context.require().job
    return f"{job.message_id}:{name}"  # type: ignore[union-attr]


def checkpoint(name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` once per job; on a retry return its stored result.

    The result must be JSON-serialisable; what is returned is its JSON
    form, the same on the first attempt and on retries (a tuple comes back
    as a list).  Raises :class:`NotSerializable` before the step is
    recorded as done, :class:`LockLost` if a newer attempt owns the job, and
    :class:`DatabaseUnavailable` if the step cannot be checked or recorded.
    """
    job = context.require().job
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

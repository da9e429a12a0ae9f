"""An attempt's leases: the gates it holds while it runs (an execution lock, a concurrency slot), taken
by the gate middlewares (:mod:`dramatiq_unique.middleware.gates`), and its row's; ``heartbeat()`` renews them all.

A job that cannot enter a gate parks (:mod:`dramatiq_unique.parking.lot`) and is woken by the holder
that leaves.  A lost lease is remembered in the attempt's context: later heartbeats raise at once,
and the attempt is not recorded as succeeded.
"""

from __future__ import annotations

import functools
import inspect
import time
from typing import TYPE_CHECKING, Any, NoReturn

from dramatiq.asyncio import async_to_sync

from dramatiq_unique import context
from dramatiq_unique.context import JobContext
from dramatiq_unique.errors import DatabaseUnavailable, LockLost
from dramatiq_unique.observe import events
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.database import DB_ERRORS
from dramatiq_unique.storage.models import after_ms

if TYPE_CHECKING:
    import dramatiq

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
        fail(ctx, e)
    left.append(_renew_row(ctx))
    remaining = min(left) - (time.monotonic() - started)
    if remaining <= 0:
        # The renewal took longer than the lease (a network cut, a stalled server, a frozen process):
        # counted from when it was sent, the lease may have run out before it landed, and a newer
        # attempt may hold the job by now.  A late "yes" is not a hold.
        fail(ctx, f"renewing the leases of job {ctx.message.message_id} took "
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
        fail(ctx, f"job {job.message_id} was taken over by a newer attempt")
    ctx.lease_written = now
    return ttl / 1000


def check_start(ctx: JobContext, began: float) -> None:
    """Raise LockLost before the actor runs if more than the row's lease has passed since ``began``
    (monotonic: when the start, or the execution lock before it, was asked for).  A late reply may report
    a start whose lease ran out, the job since sent again, even run; with an execution lock it is also
    checked before the start draws the key's fencing token."""
    took = time.monotonic() - began
    if took * 1000 >= ctx.config.unique_ttl:
        fail(ctx, f"starting job {ctx.message.message_id} took {took:.1f} s, longer than its lease")


def fail(ctx: JobContext, error: LockLost | str) -> NoReturn:
    """Raise LockLost, remembered first: the attempt lost its hold and must not be recorded as succeeded."""
    error = LockLost(error) if isinstance(error, str) else error
    ctx.lock_lost = error
    events.lock_lost(ctx.job, error)
    raise error


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

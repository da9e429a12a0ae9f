"""``heartbeat()``: a long job keeps its lease, and learns when it lost it.

What a heartbeat renews lives in the attempt's context (``ctx.extras``):

* ``RENEWERS``: callables that renew a Redis lease (the execution lock,
  a concurrency slot) and return the seconds left, or raise
  :class:`~dramatiq_unique.errors.LockLost`;
* the job row's ``lease_until``, renewed for every tracked job, fenced
  by the attempt's token (a newer attempt owns the row otherwise).

A lost lease is remembered in the context (``LOST``): every later
``heartbeat()`` raises at once, and JobTracking does not record the
attempt as succeeded even if the actor swallows the exception and
returns: the row goes to ``retrying``, for the re-drive to send again.
If another attempt took the key meanwhile, drawing its fencing token
already took this attempt off its row, and nothing is recorded at all.

Async actors: Dramatiq runs them on its event-loop thread.  asyncio
copies the caller's context variables into the coroutine's task
(``call_soon_threadsafe`` and ``create_task`` both do), so the context
set by the worker thread is visible there; :func:`carry_context` also
hands it over explicitly, so that it does not depend on how the event
loop schedules the coroutine.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from typing import TYPE_CHECKING, Any

from dramatiq.asyncio import async_to_sync

from dramatiq_unique import context
from dramatiq_unique import options as opt
from dramatiq_unique.errors import DatabaseUnavailable, LockLost
from dramatiq_unique.observe import events
from dramatiq_unique.storage.database import DB_ERRORS
from dramatiq_unique.storage.models import after_ms

if TYPE_CHECKING:
    import dramatiq

    from dramatiq_unique.context import JobContext

logger = logging.getLogger(__name__)

#: ``ctx.extras`` key: callables renewing the attempt's Redis leases.
RENEWERS = "renewers"
#: ``ctx.extras`` key: the LockLost that ended the attempt's hold, once it happened.
LOST = "lock_lost"
# ``ctx.extras`` key: time.monotonic() of the last write of the row's lease.
_LEASE_WRITTEN = "lease_written"
#: The row's lease is rewritten when a tenth of it has passed (Redis leases every call).
LEASE_REWRITE_FRACTION = 0.1

_CARRIES = "_dramatiq_unique_carries_context"


def heartbeat() -> float:
    """Inside an actor: renew the current job's leases; returns the seconds left.

    Renews the execution lock and concurrency slot the job holds (one
    Redis round trip each, every call) and the job row's lease (a
    database write at most every tenth of ``unique_ttl``).  Call it as
    often as you like: there is no limit on renewals.

    Raises :class:`~dramatiq_unique.errors.LockLost` if a lease is gone
    (it ran out, or Redis lost it, or a newer attempt took the job): stop
    the work, the attempt will not be recorded as succeeded.
    """
    ctx = context.require()
    lost = ctx.extras.get(LOST)
    if lost is not None:
        raise LockLost(lost.detail)
    started = time.monotonic()
    left = []
    try:
        for renew in ctx.extras.get(RENEWERS, ()):
            left.append(renew())
    except LockLost as e:
        give_up(ctx, e)
        raise
    left.append(_renew_row(ctx))
    remaining = min(left) - (time.monotonic() - started)
    if remaining <= 0:
        # The renewal took longer than the lease (a network cut, a stalled server, a frozen process):
        # counted from when it was sent, the lease may have run out before it landed, and a newer
        # attempt may hold the job by now.  A late "yes" is not a hold.
        error = LockLost(f"renewing the leases of job {ctx.message.message_id} took "
                         f"{time.monotonic() - started:.1f} s, longer than the lease")
        give_up(ctx, error)
        raise error
    events.heartbeat(ctx.job)
    return remaining


def _renew_row(ctx: "JobContext") -> float:
    job = ctx.job
    assert job is not None
    ttl = float(ctx.config.get(ctx.message.options, "unique_ttl", opt.DEFAULT_UNIQUE_TTL))
    now = time.monotonic()
    written = ctx.extras.get(_LEASE_WRITTEN)
    if written is not None and (now - written) * 1000 < ttl * LEASE_REWRITE_FRACTION:
        return ttl / 1000 - (now - written)
    model = type(job)
    try:
        renewed = (
            model.update(lease_until=after_ms(ttl))
            .where((model.id == job.id) & (model.fencing_token == job.fencing_token))
            .execute()
        )
    except DB_ERRORS as e:
        raise DatabaseUnavailable(f"renewing the lease of job {job.message_id}: {e}") from e
    if not renewed:
        events.fenced_out(job, "lease")
        error = LockLost(f"job {job.message_id} was taken over by a newer attempt")
        give_up(ctx, error)
        raise error
    ctx.extras[_LEASE_WRITTEN] = now
    return ttl / 1000


def check_start(ctx: "JobContext", began: float) -> None:
    """Right after an attempt's start (begun at ``time.monotonic()`` ``began``): raise LockLost, before the
    actor runs, if the start took longer than the row's lease (``unique_ttl``).  A reply that arrives late
    (a network cut that heals, a stalled server) may report a start whose lease ran out long ago; the
    re-drive may have sent the job again, and it may even have run and succeeded."""
    job = ctx.job
    if job is None:
        return
    ttl = float(ctx.config.get(ctx.message.options, "unique_ttl", opt.DEFAULT_UNIQUE_TTL))
    took = time.monotonic() - began
    if took * 1000 >= ttl:
        error = LockLost(f"starting job {ctx.message.message_id} took {took:.1f} s, longer than its lease")
        give_up(ctx, error)
        raise error


def give_up(ctx: "JobContext", error: LockLost) -> None:
    """Remember that the attempt lost its hold: it must not be recorded as succeeded."""
    ctx.extras[LOST] = error
    job = ctx.job
    events.lock_lost(job, error)


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

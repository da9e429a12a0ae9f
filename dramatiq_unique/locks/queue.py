"""The queue lock: what a unique send takes, and how it is handed over when the job starts.

A unique send's row holds its key in the job table (``unique_hold``, under a unique
index: the database decides duplicates, :mod:`dramatiq_unique.unique.enqueue`), and the
send takes the Redis lock ``redlock:<prefix>:queue:<unique key>`` under a token the
message carries (``marker["qt"]``), in the round trip of its publish
(:mod:`dramatiq_unique.broker.publish`), so that Redis-side readers (pottery locks of the
app, operators) see the key taken.  Both belong to the *waiting* job.

Hand-over at start, for the lock types that free the key then (``until_executing``,
``until_and_while_executing``: ``options.RELEASED_AT_START``), in this order, which is
the rule this module holds:

1. for ``until_and_while_executing``, the execution lock is taken, by
   :class:`~dramatiq_unique.middleware.ExecutionLocks`, which runs before JobTracking
   (``setup()`` orders them; the middlewares' combination check refuses another order),
   so the key passes from one lock to the other and is never free of both;
2. the attempt's start clears the row's hold in its own statement (``release_hold``): from
   then on a new send of the key may win it;
3. :func:`hand_over` frees the Redis queue lock: at once and not waited for, or, for
   ``until_executing`` on the Redis broker, in the script that acks the message
   (:mod:`dramatiq_unique.broker.acks`), which saves a round trip;
4. the actor runs.

Other lock types keep both until the outcome is recorded (:func:`release` then), and
every path that ends a job without running it (refused, failed by the re-drive) frees the
Redis lock with :func:`release_key`.  The lock has a TTL: whatever is not freed here
expires by itself.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

from dramatiq_unique import options as opt
from dramatiq_unique.errors import RedisUnavailable

if TYPE_CHECKING:
    from dramatiq_unique.context import JobContext
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

def hand_over(suite: "Suite", ctx: "JobContext", job: Any, marker: dict, lock_type: str) -> None:
    """Step 3: free the queue lock of a job whose start just cleared its row's hold."""
    acks = suite.acks
    at_ack = lock_type == opt.UNTIL_EXECUTING and acks is not None and acks.locks
    if at_ack and job.unique_key and marker.get("qt"):
        ctx.release_at_ack = (suite.keys.queue_lock(job.unique_key), marker["qt"])
    else:
        # Not waited for (redis/scripts.py: a wait costs a worker thread its turn at the
        # GIL); a send from inside the job comes after it on this thread's connection.
        release(suite, job, marker, wait=False)


def release(suite: "Suite", job: Any, marker: dict, *, wait: bool = True) -> None:
    """Free the queue lock the job's send took, if it took one."""
    if job.unique_key and marker.get("qt"):
        free(suite, (suite.keys.queue_lock(job.unique_key), marker["qt"]), job.message_id, wait=wait)


def release_key(suite: "Suite", unique_key: Optional[str], token: Optional[str], message_id: str) -> None:
    """Free the queue lock of ``unique_key`` if ``token`` still holds it (a job that ends unrun)."""
    if unique_key and token:
        free(suite, (suite.keys.queue_lock(unique_key), token), message_id, wait=True)


def at_ack(ctx: Optional["JobContext"]) -> Optional[tuple]:
    """The queue lock the message's ack is to free, if :func:`hand_over` left it to the ack."""
    return ctx.release_at_ack if ctx is not None else None


def at_nack(suite: "Suite", ctx: Optional["JobContext"], message_id: str) -> None:
    """A message nacked instead of acked: free the lock its ack was to free."""
    lock = ctx.release_at_ack if ctx is not None else None
    if ctx is not None and lock is not None:
        ctx.release_at_ack = None
        free(suite, lock, message_id, wait=False)


def free(suite: "Suite", lock: tuple, message_id: str, *, wait: bool) -> None:
    """Release ``(lock name, token)``; a Redis outage only costs the lock its TTL."""
    try:
        if wait:
            suite.locks.release(*lock)
        else:
            suite.locks.release_later(*lock)
    except RedisUnavailable:
        logger.warning("Could not release the queue lock of job %s; it expires by itself.", message_id)

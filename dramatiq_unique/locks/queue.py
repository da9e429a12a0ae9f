"""The queue lock: what a unique send takes, and how it is freed.

A unique send's row holds its key in the job table (the database decides duplicates,
:mod:`dramatiq_unique.unique.enqueue`); the send then takes the Redis lock ``redlock:<prefix>:queue:<unique key>``
under the message id, before its publish, so that Redis-side readers (pottery locks of the app, operators) see the key
taken.  The order in which it is handed over at a job's start is in docs/discussions/how-it-is-built.md ("Sending").
The lock has a TTL: whatever is not freed here expires by itself.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

from dramatiq_unique.errors import RedisUnavailable

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)


def take_many(suite: "Suite", locks: list[tuple]) -> None:
    """Take the queue locks ``(name, token, ttl ms)`` of sends that hold their keys: on one master
    overwritten in one round trip (their holders no longer wait), with several taken one by one where free."""
    if not suite.locks.single:
        for name, token, ttl in locks:
            suite.locks.acquire(name, ttl, token=token)
    elif locks:
        suite.locks.force(locks)


def release(suite: "Suite", job: Any, marker: dict, *, wait: bool = True) -> None:
    """Free the queue lock the job's send took, if it took one; ``wait=False`` at a job's start
    (a wait costs a worker thread its turn at the GIL)."""
    release_key(suite, job.unique_key, marker.get("qt"), job.message_id, wait=wait)


def release_key(suite: "Suite", unique_key: Optional[str], token: Optional[str], message_id: str, *,
                wait: bool = True) -> None:
    """Free the queue lock of ``unique_key`` if ``token`` still holds it; a Redis outage only costs the lock its TTL."""
    if not (unique_key and token):
        return
    name = suite.keys.queue_lock(unique_key)
    try:
        if wait:
            suite.locks.release(name, token)
        else:
            suite.locks.release_later(name, token)
    except RedisUnavailable:
        logger.warning("Could not release the queue lock of job %s; it expires by itself.", message_id)

"""Publishing a tracked send on the Redis broker over the thread's own connection,
with a unique send's queue lock in the same round trip.

A tracked send waits for two replies, its row's INSERT and the broker's
publish (a unique one also for its queue lock).  With several producer
threads on one GIL the publish through redis-py's client is the dearest
of them: measured on this project's 2-core machine with four threads,
about 260 us of CPU per call against about 85 us for one of our scripts
(:mod:`dramatiq_unique.redis.scripts`) and 40 us for a psycopg2 statement.  So a
tracked send's message is written by a script of ours, exactly as
Dramatiq's ``dispatch.lua`` writes it on ``enqueue``: the producer's
heartbeat, the body in the queue's ``.msgs`` hash, its id at the tail of
the queue.  A unique send's queue lock is written by the same script
(:mod:`dramatiq_unique.unique.enqueue` says why it may be) where the locks live
on the broker's Redis server, as one master: a unique send then waits as
often as a tracked one.

Dramatiq's own publish is used for every untracked send (they pay
nothing for the suite), and for a tracked one when the broker would do
its queue maintenance on this enqueue (``maintenance_chance`` in a
million), which only its script does.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any, Callable, Optional

from dramatiq import Middleware
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis

from dramatiq_unique.broker.keys import BrokerKeys
from dramatiq_unique.errors import RedisUnavailable
from dramatiq_unique.redis import lua, scripts
from dramatiq_unique.redis.keys import LOCK_PREFIX
from dramatiq_unique.redis.servers import identity

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

#: The tracked message the send under way publishes: (the broker's id for it, and the queue
#: lock to write with it, if any: (lock name, token, ttl ms)).
_pending: contextvars.ContextVar[Optional[tuple]] = contextvars.ContextVar("dramatiq_unique_publish", default=None)


def _server(client: Any) -> tuple:
    return identity(client)  # a Sentinel pool has no host or port: its service names it


class Publisher:
    """Publishes tracked messages on one Redis broker (see the module's docs)."""

    def __init__(self, broker: Any, suite: "Suite", dispatch: Callable[..., Any]) -> None:
        self.broker, self.suite, self.dispatch = broker, suite, dispatch
        self.script = lua.register(broker.client, "broker_publish")
        self.keys = BrokerKeys(broker.namespace)
        #: Whether queue locks can be written by the publish: one master, the broker's server.
        self.locks = suite.locks.single and _server(broker.client) == _server(suite.locks.masters[0])

    @classmethod
    def install(cls, broker: Any, suite: "Suite") -> Optional["Publisher"]:
        """Route ``broker``'s publishes through a Publisher, where it can serve; None where not."""
        if not isinstance(broker, RedisBroker):
            return None
        if not hasattr(broker, "_dispatch") or not hasattr(broker, "_should_do_maintenance"):
            return None  # pragma: no cover  (a Dramatiq whose Redis broker works otherwise)
        # RedisBroker.enqueue publishes with self.do_enqueue, which it builds in __getattr__:
        # an attribute of the instance comes first.
        publisher = cls(broker, suite, broker._dispatch("enqueue"))
        broker.do_enqueue = publisher.do_enqueue  # type: ignore[attr-defined]  # an internal (compat.py)
        return publisher

    def expect(self, ref: str, lock: Optional[tuple] = None) -> bool:
        """The message with the broker id ``ref``, about to be published, is a tracked one;
        ``lock`` (name, token, ttl ms) is written with it if it can be (returns whether)."""
        if lock is not None and not self.locks:
            return False
        _pending.set((ref, lock))
        return True

    def do_enqueue(self, queue_name: str, ref: str, body: bytes) -> Any:
        pending = _pending.get()
        if pending is None or pending[0] != ref:
            return self.dispatch(queue_name, ref, body)
        _pending.set(None)
        lock = pending[1]
        if self.broker._should_do_maintenance("enqueue"):
            # Only the broker's script does the queue maintenance: the lock first, then its publish.
            if lock is not None:
                try:
                    self.suite.locks.force(*lock)
                except RedisUnavailable:
                    # The broker's server is down: its publish fails as the broker's (which a tracked
                    # send may defer, durable/deferral.py); the database decides duplicates anyway.
                    pass
            return self.dispatch(queue_name, ref, body)
        keys = [self.keys.heartbeats(), self.keys.queue(queue_name), self.keys.messages(queue_name)]
        args = [current_millis(), self.broker.broker_id, ref, body]
        if lock is not None:
            keys.append(f"{LOCK_PREFIX}:{lock[0]}")
            args += [lock[1], int(lock[2])]
        # Fails as the broker's publish would, with redis-py's errors.
        return self.script(keys=keys, args=args)

    def batches(self) -> bool:
        """Whether tracked messages may be published in batches (:meth:`publish_many`) on this broker: a
        batch goes around the broker's ``enqueue``, so its ``before_enqueue`` hooks must be the suite's
        alone (a hook of another middleware would be skipped)."""
        if not getattr(self.broker.enqueue, "_dramatiq_unique", False):
            return False
        hooks = [m for m in self.broker.middleware if type(m).before_enqueue is not Middleware.before_enqueue]
        return all(getattr(m, "suite", None) is self.suite for m in hooks)  # JobTracking's alone

    def publish_many(self, entries: list[tuple[str, str, bytes, Optional[tuple]]]) -> None:
        """Publish many tracked messages, each ``(queue name, broker id, body, queue lock or None)``, as
        :meth:`do_enqueue` publishes one, in one round trip: a MULTI/EXEC (`redis.scripts.run_all`),
        so that a failure leaves none of them published.  Raises redis-py's errors."""
        now, broker_id = current_millis(), self.broker.broker_id
        calls = []
        for queue_name, ref, body, lock in entries:
            keys = [self.keys.heartbeats(), self.keys.queue(queue_name), self.keys.messages(queue_name)]
            args = [now, broker_id, ref, body]
            if lock is not None:
                keys.append(f"{LOCK_PREFIX}:{lock[0]}")
                args += [lock[1], int(lock[2])]
            calls.append((keys, args))
        scripts.run_all(self.script, calls)


def settle(suite: "Suite") -> None:
    """After the broker's enqueue returned: a queue lock that no publish wrote (a broker whose
    enqueue no longer goes through ``do_enqueue``) is written now."""
    pending = _pending.get()
    if pending is not None:
        _pending.set(None)
        if pending[1] is not None:
            suite.locks.force(*pending[1])


def expected(ref: str) -> bool:
    """Whether the message with the broker id ``ref`` is already expected."""
    pending = _pending.get()
    return pending is not None and pending[0] == ref


def forget() -> contextvars.Token:
    """Start a send with nothing expected (a send from another's hooks has its own)."""
    return _pending.set(None)


def restore(token: contextvars.Token) -> None:
    _pending.reset(token)

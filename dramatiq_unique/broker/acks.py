"""Acking a tracked message on the Redis broker over the thread's own connection.

The same reasoning as :mod:`dramatiq_unique.broker.publish`, at the other end of
a message's life: with eight worker threads on one GIL, Dramatiq's ack
through redis-py's client was about a quarter of the worker's GIL time
for a tracked job (py-spy, ``--gil``), and a call of one of our scripts
costs a third of one through redis-py under that load.  So a tracked
message is acked by a script of ours that does what Dramatiq's
``dispatch.lua`` does on ``ack``: the worker's heartbeat, then the id out
of this worker's ack set and, if it was there, the body out of the
queue's ``.msgs`` hash.  Dramatiq never does its queue maintenance on an
ack, so nothing is lost by not going through its script.

Only the message that ``before_ack`` announced on this thread is acked
this way; every other ack (untracked messages, a Dramatiq that acks
elsewhere) goes through the broker's own.

An ``until_executing`` job's Redis queue lock is released by the same
script, where the locks live on the broker's Redis server as one master
(as :mod:`dramatiq_unique.broker.publish` writes it with the publish).  The row's
hold, which decides, is cleared when the job starts; the lock only
mirrors it and never turns a send away (:mod:`dramatiq_unique.unique.enqueue`),
so it may outlive the start by the run.  A send of the key meanwhile
overwrites it, and the release leaves a lock naming another job alone.
Releasing it on its own at the start cost about 80 us of the worker's
CPU and 50 us of Redis's per job, with 8 worker threads (``/proc``).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis

from dramatiq_unique.broker.keys import BrokerKeys
from dramatiq_unique.broker.refs import redis_ref
from dramatiq_unique.redis import lua
from dramatiq_unique.redis.keys import LOCK_PREFIX


class _Announced(threading.local):
    ref: Optional[str] = None
    lock: Optional[tuple] = None


class Acks:
    """Acks tracked messages on one Redis broker (see the module's docs)."""

    def __init__(self, broker: Any, dispatch: Callable[..., Any], *, locks: bool = False) -> None:
        self.broker, self.dispatch = broker, dispatch
        self.script = lua.register(broker.client, "broker_ack")
        self.announced = _Announced()
        self.keys = BrokerKeys(broker.namespace)
        #: Whether a queue lock can be released with an ack: one master, the broker's server.
        self.locks = locks

    @classmethod
    def install(cls, broker: Any, *, locks: bool = False) -> Optional["Acks"]:
        """Route ``broker``'s acks through an Acks, where it can serve; None where not.
        ``locks``: whether the suite's locks live on the broker's server, as one master."""
        if not isinstance(broker, RedisBroker) or not hasattr(broker, "_dispatch"):
            return None
        acks = cls(broker, broker._dispatch("ack"), locks=locks)
        # As for do_enqueue (publish.py): RedisBroker builds do_ack in __getattr__.
        broker.do_ack = acks.do_ack  # type: ignore[attr-defined]  # an internal (compat.py)
        return acks

    def announce(self, message: Any, lock: Optional[tuple] = None) -> None:
        """The message this thread acks next is a tracked one; ``lock`` (name, token): a queue
        lock to release with it (only where :attr:`locks`)."""
        self.announced.ref = redis_ref(message)
        self.announced.lock = lock

    def do_ack(self, queue_name: str, ref: str) -> Any:
        if self.announced.ref != ref:
            return self.dispatch(queue_name, ref)
        lock, self.announced.ref, self.announced.lock = self.announced.lock, None, None
        worker = self.broker.broker_id
        keys = [self.keys.heartbeats(), self.keys.acks(worker, queue_name), self.keys.messages(queue_name)]
        args = [current_millis(), worker, ref]
        if lock is not None:
            keys.append(f"{LOCK_PREFIX}:{lock[0]}")
            args.append(lock[1])
        # Fails as the broker's ack would, with redis-py's errors (the consumer retries it).
        return self.script(keys=keys, args=args)

"""Acking a tracked message on the Redis broker over the thread's own connection.

The same reasoning as :mod:`dramatiq_unique.publish`, at the other end of
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
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from dramatiq.common import current_millis

from dramatiq.brokers.redis import RedisBroker

from . import scripts
from .keys import BrokerKeys

# KEYS[1] heartbeats, KEYS[2] this worker's ack set for the queue, KEYS[3] the queue's message
# hash; ARGV timestamp, broker id, the broker's message id.
_ACK = """
redis.call('zadd', KEYS[1], ARGV[1], ARGV[2])
if redis.call('srem', KEYS[2], ARGV[3]) > 0 then redis.call('hdel', KEYS[3], ARGV[3]) end
return 1
"""


class _Announced(threading.local):
    ref: Optional[str] = None


class Acks:
    """Acks tracked messages on one Redis broker (see the module's docs)."""

    def __init__(self, broker: Any, dispatch: Callable[..., Any]) -> None:
        self.broker, self.dispatch = broker, dispatch
        self.script = scripts.register(broker.client, _ACK)
        self.announced = _Announced()
        self.keys = BrokerKeys(broker.namespace)

    @classmethod
    def install(cls, broker: Any) -> Optional["Acks"]:
        """Route ``broker``'s acks through an Acks, where it can serve; None where not."""
        if not isinstance(broker, RedisBroker) or not hasattr(broker, "_dispatch"):
            return None
        acks = cls(broker, broker._dispatch("ack"))
        # As for do_enqueue (publish.py): RedisBroker builds do_ack in __getattr__.
        broker.do_ack = acks.do_ack
        return acks

    def announce(self, message: Any) -> None:
        """The message this thread acks next is a tracked one."""
        self.announced.ref = message.options.get("redis_message_id")

    def do_ack(self, queue_name: str, ref: str) -> Any:
        if self.announced.ref != ref:
            return self.dispatch(queue_name, ref)
        self.announced.ref = None
        keys, worker = self.keys, self.broker.broker_id
        # Fails as the broker's ack would, with redis-py's errors (the consumer retries it).
        return self.script(
            keys=[keys.heartbeats(), keys.acks(worker, queue_name), keys.messages(queue_name)],
            args=[current_millis(), worker, ref],
        )

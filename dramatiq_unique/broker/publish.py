"""Publishing a batch of tracked messages on the Redis broker in one round trip: the broker's own
``dispatch`` script once per message, in one MULTI/EXEC of redis-py's, queue locks taken first.

A single send goes through Dramatiq's own ``enqueue``; only :func:`dramatiq_unique.send_many` and
the outbox's commit publish batches (docs/discussions/how-it-is-built.md, "Sending")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from dramatiq import Middleware
from dramatiq.brokers.redis import RedisBroker

from dramatiq_unique.broker.keys import dispatch
from dramatiq_unique.errors import RedisPermissionDenied, RedisUnavailable
from dramatiq_unique.locks import queue
from dramatiq_unique.redis.servers import identity

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

#: One message of a batch: (queue name, the broker's id for it, body, its queue lock (name, token, ttl ms) or None).
Entry = tuple[str, str, bytes, Optional[tuple]]


class Publisher:
    """Publishes batches of tracked messages on one Redis broker."""

    def __init__(self, broker: Any, suite: "Suite") -> None:
        self.broker, self.suite = broker, suite
        #: Whether the queue locks live on the broker's server, as one master: a lock that fails there
        #: is left out, the publish then failing as the broker's (a Sentinel pool is named by its service).
        self.shares_server = suite.locks.single and identity(broker.client) == identity(suite.locks.masters[0])

    @classmethod
    def install(cls, broker: Any, suite: "Suite") -> Optional["Publisher"]:
        """A Publisher for ``broker`` if it is a Redis broker; None if not."""
        return cls(broker, suite) if isinstance(broker, RedisBroker) else None

    def covers(self, error: RedisUnavailable) -> bool:
        """Whether a queue lock that failed with ``error`` may be left out of a send: the locks share
        the broker's server, which is down too, so the publish fails as the broker's.  A refusal (an
        ACL) comes from a server that answers: the publish would go through without the lock."""
        return self.shares_server and not isinstance(error, RedisPermissionDenied)

    def batches(self) -> bool:
        """Whether tracked messages may be published in batches: a batch goes around the broker's
        ``enqueue``, so its ``before_enqueue`` hooks must be the suite's alone."""
        if not getattr(self.broker.enqueue, "_dramatiq_unique", False):
            return False
        hooks = [m for m in self.broker.middleware if type(m).before_enqueue is not Middleware.before_enqueue]
        return all(getattr(m, "suite", None) is self.suite for m in hooks)  # JobTracking's alone

    def publish_many(self, entries: list[Entry]) -> None:
        """Take the entries' queue locks (one call), then publish the messages as the broker's
        ``enqueue`` would, all or none (MULTI/EXEC).  Raises redis-py's errors or RedisUnavailable."""
        try:
            queue.take_many(self.suite, [entry[3] for entry in entries if entry[3] is not None])
        except RedisUnavailable as error:
            if not self.covers(error):
                raise
        with self.broker.client.pipeline(transaction=True) as pipe:
            for queue_name, ref, body, _ in entries:
                dispatch(self.broker, "enqueue", queue_name, ref, body, client=pipe,
                         maintenance=self.broker._should_do_maintenance("enqueue"))
            pipe.execute()

"""Is a job's message still in the broker?  The re-drive's lost-message check, one ``HEXISTS`` per
job on the Redis broker, and the hand-back of messages that dead or reconnected workers hold
(docs/discussions/how-it-is-built.md, "Sending")."""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, Any, Iterable, Optional

from dramatiq.common import current_millis, dq_name, xq_name

from dramatiq_unique.broker.keys import BrokerKeys

if TYPE_CHECKING:
    from dramatiq import Broker

    from dramatiq_unique.storage.models import JobModel

logger = logging.getLogger(__name__)


class Presence(enum.Enum):
    #: The message is in the broker (queued, delayed, or held by a consumer).
    PRESENT = "present"
    #: The message is in none of the broker's places.
    MISSING = "missing"
    #: The broker dead-lettered the message: the job failed.
    DEAD = "dead"


class RedisProbe:
    """Looks messages up in a :class:`~dramatiq.brokers.redis.RedisBroker`."""

    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self.client = broker.client  # type: ignore[attr-defined]
        self.namespace: str = broker.namespace  # type: ignore[attr-defined]
        self.keys = BrokerKeys(self.namespace)

    def check(self, rows: "Iterable[JobModel]") -> list[Presence]:
        """Where each row's last published message is; a row without ``broker_ref`` is missing."""
        rows = list(rows)
        pipe = self.client.pipeline(transaction=False)
        for row in rows:
            if row.broker_ref:
                for name in (row.queue_name, dq_name(row.queue_name), xq_name(row.queue_name)):
                    pipe.hexists(self.keys.messages(name), row.broker_ref)
        answers = iter(pipe.execute()) if len(pipe) else iter(())
        out = []
        for row in rows:
            if not row.broker_ref:
                out.append(Presence.MISSING)
                continue
            queued, delayed, dead = next(answers), next(answers), next(answers)
            out.append(Presence.PRESENT if queued or delayed else Presence.DEAD if dead else Presence.MISSING)
        return out

    def requeue_orphans(self, rows: "Iterable[JobModel]") -> int:
        """Hand messages held by dead consumers back to their queues, by Dramatiq's own maintenance
        (which a quiet queue may not run for long); returns how many queues were swept."""
        rows = [row for row in rows if row.broker_ref]
        heartbeat_timeout = getattr(self.broker, "heartbeat_timeout", None)
        script = getattr(self.broker, "scripts", {}).get("dispatch")
        if not rows or heartbeat_timeout is None or script is None:
            return 0
        dead = self.client.zrangebyscore(
            self.keys.heartbeats(), 0, current_millis() - heartbeat_timeout
        )
        if not dead:
            return 0
        pipe = self.client.pipeline(transaction=False)
        probes = []
        for row in rows:
            for queue_name in (row.queue_name, dq_name(row.queue_name)):
                for worker in dead:
                    worker_id = worker.decode() if isinstance(worker, bytes) else worker
                    pipe.sismember(self.keys.acks(worker_id, queue_name), row.broker_ref)
                    probes.append(queue_name)
        queues = {name for name, held in zip(probes, pipe.execute(), strict=True) if held}
        for queue_name in sorted(queues):
            self._maintain(script, queue_name)
        return len(queues)

    def release_stranded(self, rows: "Iterable[JobModel]") -> int:
        """Hand back to its delay queue each row's delayed message that a *live* worker fetched and no
        longer holds (its connection broke: its delay queue starts empty); returns how many.  ``rows``:
        retrying rows due ``lost_after`` ago whose message was found present."""
        broker: Any = self.broker
        script = getattr(broker, "scripts", {}).get("dispatch")
        heartbeat_timeout = getattr(broker, "heartbeat_timeout", None)
        rows = [row for row in rows if row.broker_ref]
        if not rows or script is None or heartbeat_timeout is None:
            return 0
        now = current_millis()
        workers = [w.decode() if isinstance(w, bytes) else w
                   for w in self.client.zrangebyscore(self.keys.heartbeats(), now - heartbeat_timeout, "+inf")]
        if not workers:
            return 0
        pipe = self.client.pipeline(transaction=False)
        probes = []
        for row in rows:
            for worker in workers:
                pipe.sismember(self.keys.acks(worker, dq_name(row.queue_name)), row.broker_ref)
                probes.append((row, worker))
        released = 0
        unpack = broker._max_unpack_size() if hasattr(broker, "_max_unpack_size") else 4000
        for (row, worker), held in zip(probes, pipe.execute(), strict=True):
            if not held:
                continue
            # Dramatiq's own requeue, as that worker's shutdown would run it: out of its ack set, back to the queue.
            script(args=["requeue", current_millis(), dq_name(row.queue_name), worker, heartbeat_timeout,
                         broker.dead_message_ttl, 0, unpack, row.broker_ref], keys=[self.namespace])
            released += 1
            logger.warning("Job %s's retry was held by live worker %s, which no longer has it (its connection to "
                           "Redis broke): handed back to queue %r.", row.message_id, worker, dq_name(row.queue_name))
        return released

    def _maintain(self, script, queue_name: str) -> None:
        broker: Any = self.broker  # the Redis broker's own attributes, which Broker does not declare
        unpack = broker._max_unpack_size() if hasattr(broker, "_max_unpack_size") else 4000
        args = [
            "qsize", current_millis(), queue_name, broker.broker_id, broker.heartbeat_timeout,
            broker.dead_message_ttl, 1, unpack,
        ]
        script(args=args, keys=[self.namespace])
        logger.info("Moved messages of dead workers back to queue %r.", queue_name)


def probe_for(broker: "Broker") -> Optional[RedisProbe]:
    """The probe for ``broker``, or None if the broker cannot be asked about one message."""
    from dramatiq.brokers.redis import RedisBroker

    if isinstance(broker, RedisBroker):
        return RedisProbe(broker)
    return None

"""Is a job's message still in the broker?  The re-drive's lost-message check on the Redis broker, and the
hand-back of messages that dead or reconnected workers hold, or that a worker's ack set holds and the worker
does not (docs/discussions/how-it-is-built.md, "Sending")."""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis, dq_name, xq_name

from dramatiq_unique.broker.refs import BrokerKeys, dispatch

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

    def __init__(self, broker: Any) -> None:  # a RedisBroker, whose attributes Broker does not declare
        self.broker, self.client, self.keys = broker, broker.client, BrokerKeys(broker.namespace)

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
        held = self._held(rows, 0, current_millis() - self.broker.heartbeat_timeout,
                          lambda row: (row.queue_name, dq_name(row.queue_name)))
        queues = sorted({queue_name for _, queue_name, _ in held})
        for queue_name in queues:
            dispatch(self.broker, "qsize", queue_name, maintenance=1)
            logger.info("Moved messages of dead workers back to queue %r.", queue_name)
        return len(queues)

    def release_stranded(self, rows: "Iterable[JobModel]") -> int:
        """Hand back to its delay queue each row's delayed message that a *live* worker fetched and no
        longer holds (its connection broke: its delay queue starts empty); returns how many."""
        held = self._held(rows, current_millis() - self.broker.heartbeat_timeout, "+inf",
                          lambda row: (dq_name(row.queue_name),))
        for row, queue_name, worker in held:  # Dramatiq's own requeue, as that worker's shutdown would run it
            dispatch(self.broker, "requeue", queue_name, row.broker_ref, worker=worker)
            logger.warning("Job %s's retry was held by live worker %s, which no longer has it (its connection "
                           "to Redis broke): handed back to queue %r.", row.message_id, worker, queue_name)
        return len(held)

    def _held(self, rows: "Iterable[JobModel]", low: Any, high: Any,
              queues: "Callable[[JobModel], tuple[str, ...]]") -> "list[tuple[JobModel, str, str]]":
        """Each (row, queue, worker) whose ack set holds the row's message, of the rows with a broker id,
        their ``queues``, and the workers whose last heartbeat falls between ``low`` and ``high`` (ms)."""
        rows = [row for row in rows if row.broker_ref]
        workers = [w.decode() if isinstance(w, bytes) else w
                   for w in self.client.zrangebyscore(self.keys.heartbeats(), low, high)] if rows else []
        probes = [(row, queue_name, worker) for row in rows for queue_name in queues(row) for worker in workers]
        if not probes:
            return []
        pipe = self.client.pipeline(transaction=False)
        for row, queue_name, worker in probes:
            pipe.sismember(self.keys.acks(worker, queue_name), row.broker_ref)
        return [probe for probe, held in zip(probes, pipe.execute(), strict=True) if held]


def unheld(broker: Any, worker: Any, processing: Callable[[], Iterable[str]]) -> dict[str, set[str]]:
    """For each queue ``worker`` consumes, the entries of its ack set (on its Redis ``broker``) whose messages
    the worker holds nowhere: not fetched and unacked by its consumers, not waiting in its work queue or its
    delay queues, not ``processing()`` (the ids its threads took up).  A message on its way from one to the
    next as they are read may be missed: a caller acts on what two looks in a row find."""
    keys, queues = BrokerKeys(broker.namespace), list(worker.consumers)
    pipe = broker.client.pipeline(transaction=False)
    for queue_name in queues:
        pipe.smembers(keys.acks(broker.broker_id, queue_name))
    entries = {queue_name: [e.decode() if isinstance(e, bytes) else e for e in members]
               for queue_name, members in zip(queues, pipe.execute(), strict=True)}
    found = [queue_name for queue_name in queues if entries[queue_name]]
    pipe = broker.client.pipeline(transaction=False)
    for queue_name in found:
        pipe.hmget(keys.messages(queue_name), entries[queue_name])
    bodies = dict(zip(found, pipe.execute(), strict=True)) if found else {}
    held = held_by(worker, processing)  # read after the ack sets: a fetch answered meanwhile counts as held
    out: dict[str, set[str]] = {queue_name: set() for queue_name in queues}
    for queue_name in found:
        for entry, body in zip(entries[queue_name], bodies[queue_name], strict=True):
            message_id = _message_id(body)
            if message_id is not None and message_id not in held:
                out[queue_name].add(entry)
    return out


def hand_back(broker: Any, queue_name: str, entries: Iterable[str]) -> None:
    """Move ``entries`` of this worker's ack set of ``queue_name`` back to the queue, by Dramatiq's own
    requeue (an entry acked meanwhile is left alone)."""
    dispatch(broker, "requeue", queue_name, *entries)


def held_by(worker: Any, processing: Callable[[], Iterable[str]]) -> set[str]:
    """The ids of the messages a Dramatiq 2 ``worker`` holds: fetched and not acked (its consumers' own
    count, and the answers they have not yet read), waiting in its work queue or its delay queues, or
    ``processing()``; each place read before the one a message goes to next."""
    with worker.work_queue.mutex:
        items = list(worker.work_queue.queue)
    ids = {item.message.message_id for item in items}
    ids.update(processing())
    for thread in list(worker.consumers.values()):
        with thread.delay_queue.mutex:
            delayed = list(thread.delay_queue.queue)
        ids.update(item.message.message_id for item in delayed)
        consumer = thread.consumer
        if consumer is not None:
            ids.update(_copy(getattr(consumer, "queued_message_ids", ())))
            cached = (_message_id(data) for data in _copy(getattr(consumer, "message_cache", ())))
            ids.update(message_id for message_id in cached if message_id is not None)
    return ids


def _copy(items: Iterable[Any]) -> list[Any]:
    """A copy of a collection another thread may be changing (a set changed in iteration raises: try again)."""
    for _ in range(10):
        try:
            return list(items)
        except RuntimeError:
            continue
    raise RuntimeError("a consumer's messages kept changing while they were read")


def _message_id(body: Any) -> Optional[str]:
    """The id of the message encoded in ``body``; None if there is none (acked meanwhile) or Dramatiq could
    not read it (then it is left where it is)."""
    if body is None:
        return None
    try:
        return str(Message.decode(body).message_id)
    except Exception:
        return None


def probe_for(broker: "Broker") -> Optional[RedisProbe]:
    """The probe for ``broker``, or None if the broker cannot be asked about one message."""
    return RedisProbe(broker) if isinstance(broker, RedisBroker) else None

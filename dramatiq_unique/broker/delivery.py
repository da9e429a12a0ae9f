"""Delivering a woken job: its message rebuilt from its row, handed straight to this process's worker as
the broker's fetch would have left it, else published (docs/discussions/how-it-is-built.md, "Sending")."""

from __future__ import annotations

import threading
import uuid
from typing import TYPE_CHECKING, Any, Optional

from dramatiq import Message
from dramatiq.broker import MessageProxy

from dramatiq_unique.broker.refs import REDIS_MESSAGE_ID, BrokerKeys, resending
from dramatiq_unique.redis import lua

try:  # Dramatiq 2.x; without them every delivery goes through the broker.
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.worker import _WorkQueueItem
except ImportError:  # pragma: no cover
    RedisBroker = _WorkQueueItem = None  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    import dramatiq


class Delivery:
    """Sends woken jobs; delivers them locally while a worker of this process is attached."""

    def __init__(self, broker_of: Any) -> None:
        # The suite's broker may be set after us (setup() assigns it): look it up each time.
        self._broker_of = broker_of
        #: Deliver to this process's worker when possible.
        self.local = True
        self.worker: "Optional[dramatiq.Worker]" = None
        self._claim: Any = None
        self._lock = threading.Lock()

    def send(self, message: Message, broker_ref: Optional[str] = None) -> None:
        """Deliver a woken job's message (``broker_ref``: the id its row records for it, if any)."""
        plan = self.plan(message, broker_ref)
        if plan is not None:
            with self._lock:
                if self._claim is None or self._claim.client is not plan.broker.client:
                    self._claim = lua.register(plan.broker.client, "broker_claim")
            self._claim(keys=plan.keys, args=plan.args)
            plan.complete()
            return
        broker = self._broker_of()
        if broker is None:
            raise RuntimeError("the suite has no broker to send woken jobs through")
        broker.enqueue(message)

    def plan(self, message: Message, broker_ref: Optional[str] = None) -> "Optional[LocalDelivery]":
        """A local delivery of ``message`` (``before_enqueue`` emitted), its Redis writes left to the caller
        (parking/deck.py folds them into its script); None where only the broker can deliver it."""
        worker, broker = self.worker, self._broker_of()
        if not self.local or worker is None or _WorkQueueItem is None or not isinstance(broker, RedisBroker):
            return None
        consumer = worker.consumers.get(message.queue_name)
        if consumer is None or not consumer.running or worker.broker is not broker:
            return None
        try:
            actor = broker.get_actor(message.actor_name)
        except Exception:
            return None
        message = message.copy(options={REDIS_MESSAGE_ID: broker_ref or str(uuid.uuid4())})
        with resending():  # the claim recorded broker_ref: JobTracking need not write it again
            broker.emit_before("enqueue", message, None)
        queue, keys = message.queue_name, BrokerKeys(broker.namespace)
        return LocalDelivery(
            broker, worker, actor.priority, message,
            keys=[keys.messages(queue), keys.acks(broker.broker_id, queue)],
            args=[message.options[REDIS_MESSAGE_ID], message.encode()],
        )


class LocalDelivery:
    """A message on its way to this process's worker: once ``keys``/``args`` are written as
    ``broker_claim.lua`` writes them, :meth:`complete` puts it on the work queue."""

    def __init__(self, broker: Any, worker: Any, priority: int, message: Message, *, keys: list, args: list) -> None:
        self.broker, self.worker, self.priority, self.message = broker, worker, priority, message
        self.keys, self.args = keys, args

    def complete(self) -> None:
        self.broker.emit_after("enqueue", self.message, None)
        # The message as written (its body was encoded from it): no need to decode it again.
        proxy = MessageProxy(self.message)
        try:
            # Ahead of the prefetched messages of its priority: it was sent before them, and has waited.
            item = _WorkQueueItem(self.priority, proxy, _queued_time=0)
        except TypeError:  # pragma: no cover  (a Dramatiq without the FIFO tie-break)
            item = _WorkQueueItem(self.priority, proxy)
        self.worker.work_queue.put(item)

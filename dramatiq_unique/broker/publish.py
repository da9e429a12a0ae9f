"""Putting the suite's messages in the Redis broker: publishing tracked messages with their queue locks (its
``dispatch`` script per message, in one MULTI/EXEC with the locks' SETs where the locks live on the broker's server,
else after the locks are taken; ``do_enqueue`` wrapped to carry a single send's lock), and delivering a woken job:
its message rebuilt from its row, handed straight to this process's worker as the broker's fetch would have left it,
else published (docs/discussions/how-it-is-built.md, "Sending")."""

from __future__ import annotations

import contextvars
import threading
import uuid
from typing import TYPE_CHECKING, Any, Optional

import redis
from dramatiq import Message, Middleware
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker

from dramatiq_unique.broker.refs import REDIS_MESSAGE_ID, BrokerKeys, dispatch_args, resending
from dramatiq_unique.errors import RedisPermissionDenied, permission_refused
from dramatiq_unique.locks import queue
from dramatiq_unique.redis import lua, scripts
from dramatiq_unique.redis.keys import LOCK_PREFIX
from dramatiq_unique.redis.servers import identity

try:  # Dramatiq 2.2.0 on; before, every woken job goes through the broker.
    from dramatiq.worker import _WorkQueueItem
except ImportError:  # pragma: no cover
    _WorkQueueItem = None  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    import dramatiq

    from dramatiq_unique.suite import Suite

#: A queue lock: (name, token, ttl ms).
Lock = tuple[str, str, float]
#: One message of a batch: (queue name, the broker's id for it, body, its queue lock or None).
Entry = tuple[str, str, bytes, Optional[Lock]]

# The queue locks of the single send under way, to go with its publish (set by unique/send.py's wrapper
# where they can: None elsewhere, and then a lock is taken at once).
_pending: contextvars.ContextVar[Optional[list[Lock]]] = contextvars.ContextVar("dramatiq_unique_lock", default=None)


class Publisher:
    """Publishes tracked messages, with their queue locks, on one Redis broker (whose ``do_enqueue`` it wraps)."""

    def __init__(self, broker: Any, suite: "Suite") -> None:
        self.broker, self.suite = broker, suite
        #: Whether the queue locks live on the broker's server, as one master: then they go in the
        #: publish's MULTI/EXEC (a Sentinel pool is named by its service).
        self.shares_server = suite.locks.single and identity(broker.client) == identity(suite.locks.masters[0])
        #: The broker's own script, over this thread's connection (redis/scripts.py).
        text = broker.scripts["dispatch"].script
        self.dispatch = scripts.Script(broker.client, text.decode() if isinstance(text, bytes) else text)
        #: The broker's own ``do_enqueue``, wrapped from now on.
        self._enqueue, broker.do_enqueue = broker.do_enqueue, self.do_enqueue

    def arm(self) -> contextvars.Token:
        """Let the send under way leave its queue lock to its publish (:meth:`later`); the caller resets it."""
        return _pending.set([] if self.shares_server else None)

    @staticmethod
    def later(lock: Lock) -> bool:
        """Leave ``lock`` to the publish of the send under way; False if it must be taken now."""
        pending = _pending.get()
        if pending is not None:
            pending.append(lock)
        return pending is not None

    def do_enqueue(self, queue_name: str, ref: str, body: bytes) -> Any:
        """The broker's ``do_enqueue``, with the queue lock the send under way left to it."""
        pending = _pending.get()
        if not pending:
            return self._enqueue(queue_name, ref, body)
        self.publish_many([(queue_name, ref, body, pending.pop())])
        return None

    def batches(self) -> bool:
        """Whether tracked messages may be published in batches: a batch goes around the broker's
        ``enqueue``, so its ``before_enqueue`` hooks must be the suite's alone."""
        if not getattr(self.broker.enqueue, "_dramatiq_unique", False):
            return False
        hooks = [m for m in self.broker.middleware if type(m).before_enqueue is not Middleware.before_enqueue]
        return all(getattr(m, "suite", None) is self.suite for m in hooks)  # JobTracking's alone

    def publish_many(self, entries: list[Entry]) -> None:
        """Publish the messages as the broker's ``enqueue`` would, all or none, their queue locks first.
        Raises redis-py's errors, RedisUnavailable (a lock on another server), RedisPermissionDenied."""
        locks = [entry[3] for entry in entries if entry[3] is not None]
        if not self.shares_server:
            queue.take_many(self.suite, locks)
            locks = []
        broker = self.broker
        # Overwritten: the database decided that these sends hold their keys.
        sets = [("SET", f"{LOCK_PREFIX}:{name}", token, "PX", int(ttl)) for name, token, ttl in locks]
        calls = [([broker.namespace], dispatch_args(broker, "enqueue", queue_name, ref, body,
                                                    maintenance=broker._should_do_maintenance("enqueue")))
                 for queue_name, ref, body, _ in entries]
        try:
            scripts.run_all(self.dispatch, calls, before=sets)
        except redis.ResponseError as error:
            if permission_refused(error):
                raise RedisPermissionDenied(f"publishing {len(entries)} messages: {error}") from error
            raise


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
        (the deck, parking/lot.py, folds them into its script); None where only the broker can deliver it."""
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
        # Ahead of the prefetched messages of its priority: it was sent before them, and has waited.
        # (Every Dramatiq with _WorkQueueItem, 2.2.0 on, has its FIFO tie-break.)
        self.worker.work_queue.put(_WorkQueueItem(self.priority, proxy, _queued_time=0))

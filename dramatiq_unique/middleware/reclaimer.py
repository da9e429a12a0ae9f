"""The :class:`Reclaimer`: hands back the messages a worker's ack sets hold that the worker itself does not."""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

import redis as redis_lib
from dramatiq import Middleware

from dramatiq_unique.broker import consumer, presence

logger = logging.getLogger(__name__)


class Reclaimer(Middleware):
    """Finds the messages that Dramatiq's Redis broker moved into this worker's ack sets and that the worker
    never received, and hands them back to their queues.

    The broker's consumer fetches messages in one script call that moves them into the worker's ack set, and
    only a dead worker's ack set is handed back (Dramatiq's maintenance).  When the call's answer is lost (a
    stalled link: the consumer gives up on its socket timeout and starts again, and the call reaches Redis, or
    its answer was on its way), the messages sit in the ack set of a worker that does not have them, for as
    long as it lives; the re-drive finds them in the broker and sends nothing.  Every ``interval`` ms a thread
    of each worker process compares its ack sets with what the process holds: what its consumers fetched and
    have not acked, its work queue, its delayed messages and the messages its threads process.  A message held
    by none of them at two looks in a row is handed back, as Dramatiq's own requeue does at a worker's
    shutdown; a message the worker holds is never, so nothing runs twice.

    As its worker boots, it also makes the broker's consumers take a socket timeout for a lost connection
    (:mod:`dramatiq_unique.broker.consumer`): Dramatiq 2.2 left a timed-out ack undone, and ended a consumer
    thread whose requeue timed out.

    :func:`dramatiq_unique.setup` adds it to a Redis broker, first of its middlewares (a thread's message is
    counted from the first hook on).

    Parameters:
      interval: ms between two looks (a stranded message goes back within two).
    """

    def __init__(self, *, interval: float = 5_000) -> None:
        self.interval = interval
        #: Messages handed back since the worker booted.
        self.handed_back = 0
        self._processing: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        #: Per queue, the ack set's entries the last look found held by nobody here.
        self._suspects: dict[str, set[str]] = {}

    # -- the messages the worker's threads process --------------------------------------------

    def before_process_message(self, broker: Any, message: Any) -> None:
        with self._lock:
            self._processing[message.message_id] = self._processing.get(message.message_id, 0) + 1

    def after_ack(self, broker: Any, message: Any) -> None:
        with self._lock:
            count = self._processing.pop(message.message_id, 0) - 1
            if count > 0:  # two deliveries of one message at once (a redelivery): one is still here
                self._processing[message.message_id] = count

    after_nack = after_ack

    def processing(self) -> list[str]:
        """The ids of the messages this worker's threads took up and have not acked yet."""
        with self._lock:
            return list(self._processing)

    # -- the looks -------------------------------------------------------------------------

    def before_worker_boot(self, broker: Any, worker: Any) -> None:
        consumer.install(broker)  # before the worker's consumers are made

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(broker, worker), name="dramatiq_unique-reclaimer",
                                        daemon=True)
        self._thread.start()

    def before_worker_shutdown(self, broker: Any, worker: Any) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=10)

    def _run(self, broker: Any, worker: Any) -> None:
        while not self._stop.wait(self.interval / 1000):
            try:
                self.handed_back += self.look(broker, worker)
            except redis_lib.RedisError:
                logger.debug("Could not look at this worker's ack sets; looking again later.", exc_info=True)
                self._suspects.clear()  # two looks in a row, not two looks around an outage
            except Exception:
                logger.exception("Could not look at this worker's ack sets; looking again later.")
                self._suspects.clear()

    def look(self, broker: Any, worker: Any) -> int:
        """One look at every ack set of ``worker``; returns how many messages went back to their queues."""
        handed = 0
        for queue_name, unheld in presence.unheld(broker, worker, self.processing).items():
            stranded = sorted(unheld & self._suspects.get(queue_name, set()))
            self._suspects[queue_name] = unheld - set(stranded)
            if stranded:
                presence.hand_back(broker, queue_name, stranded)
                logger.warning("Handed %d messages back to queue %r: this worker's ack set held them, and the "
                               "worker did not (a fetch whose answer was lost).", len(stranded), queue_name)
                handed += len(stranded)
        return handed

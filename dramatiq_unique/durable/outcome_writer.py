"""Successes written in batches: the attempts of a worker process that succeeded meanwhile share one
statement and one commit, and each message is acked once its outcome is committed.

Dramatiq acks a message from the worker thread that ran it, right after its ``after_process_message``
hooks.  :class:`~dramatiq_unique.JobTracking` leaves a success's outcome on its message instead of
writing it; the consumer that delivered the message (the broker's own, wrapped here) hands the ack to
the writer's thread, which writes every outcome that waits in one statement, then acks their messages.
The worker thread goes on to its next job at once, and the batch forms by itself while a statement is
in flight: nothing waits for company.  docs/discussions/how-it-is-built.md ("Outcomes in batches") says
why no promise changes.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import queue
import threading
import time
from typing import Any, Iterable, Optional

from dramatiq.broker import Broker, Consumer, MessageProxy

from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.database import BoundedPostgresqlDatabase

logger = logging.getLogger(__name__)

#: Set on a message by the consumer that delivered it, and on a success whose outcome waits.
_CONSUMER = "_dramatiq_unique_consumer"
_OUTCOME = "_dramatiq_unique_outcome"
#: Set on a broker: its writer.
_WRITER = "_dramatiq_unique_outcome_writer"
#: The most outcomes one statement writes.
MAX_BATCH = 64
#: How long a consumer that closes waits for the outcomes of the messages it delivered.
CLOSE_WAIT_MS = 30_000
#: How long a batch is sent again while it fails, and the longest pause between two tries.
RETRY_MS = 30_000
RETRY_PAUSE_MS = 1_000


def install(broker: Broker) -> None:
    """Wrap ``broker.consume`` (once) so that its consumers hand the acks of deferred outcomes to the
    broker's writer."""
    if getattr(broker, _WRITER, None) is not None:
        return
    writer = OutcomeWriter()
    consume = broker.consume

    def consume_with_writer(*args: Any, **kwargs: Any) -> Consumer:
        return _Consumer(consume(*args, **kwargs), writer)

    setattr(broker, _WRITER, writer)
    broker.consume = consume_with_writer  # type: ignore[method-assign]


def defer(message: MessageProxy, model: type[jobs.JobModel], job: jobs.JobModel, fields: dict[str, Any]) -> bool:
    """Leave a success's outcome (``fields``, as :func:`jobs.finish` takes them) for the writer; False when
    it must be written now: a consumer of ours did not deliver the message, or the row's store is not
    PostgreSQL of the suite's own (SQLite has one writer and cheap commits; a framework's borrowed
    connection belongs to its thread)."""
    if getattr(message, _CONSUMER, None) is None or not isinstance(model._meta.database, BoundedPostgresqlDatabase):
        return False
    setattr(message, _OUTCOME, (model, job, fields))
    return True


def stop(broker: Broker) -> None:
    """Write what waits, ack it, and end the broker's writer thread (the worker is shutting down)."""
    writer = getattr(broker, _WRITER, None)
    if writer is not None:
        writer.stop()


def _write_until(model: type[jobs.JobModel], done: list[tuple[Any, dict[str, Any]]], deadline: float) -> None:
    """Write a batch, sent again while it fails (a deadlock, a timeout, a server down for a while) until
    ``deadline``: a job whose outcome is recorded late is not run again, one whose outcome is lost is (the
    re-drive finds its row running when its lease runs out).  Then its messages are acked, as a single
    write that fails is."""
    pause = 0.05
    for again in itertools.count():
        try:
            jobs.finish_succeeded(model, done, again=again > 0)
            return
        except Exception:
            if time.monotonic() + pause > deadline:
                logger.exception("Could not record the outcomes of %d jobs (%s…); the re-drive settles them.",
                                  len(done), done[0][0].message_id)
                return
            logger.warning("Could not record the outcomes of %d jobs; trying again in %d ms.", len(done),
                           pause * 1000, exc_info=again == 0)
        time.sleep(pause)
        pause = min(pause * 2, RETRY_PAUSE_MS / 1000)


class _Consumer(Consumer):
    """The broker's consumer, whose acks of deferred outcomes wait for the writer."""

    def __init__(self, inner: Consumer, writer: "OutcomeWriter") -> None:
        self.inner = inner
        self.writer = writer

    def __next__(self) -> Optional[MessageProxy]:
        message = next(self.inner)
        if message is not None:
            setattr(message, _CONSUMER, self)
        return message

    def ack(self, message: MessageProxy) -> None:
        if getattr(message, _OUTCOME, None) is None:
            self.inner.ack(message)
        else:
            self.writer.submit(self, message)

    def nack(self, message: MessageProxy) -> None:
        self.inner.nack(message)

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        self.inner.requeue(messages)

    def close(self) -> None:
        self.writer.wait_for(self)
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # the broker's own attributes (outstanding_message_count…)
        return getattr(self.inner, name)


class OutcomeWriter:
    """One thread per process that writes the waiting successes, a batch a statement, then acks them."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._pid = 0
        self._queue: "queue.SimpleQueue[Optional[tuple[_Consumer, MessageProxy]]]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        #: Messages submitted and not acked yet, by their consumer.
        self._waiting: collections.Counter[_Consumer] = collections.Counter()

    def submit(self, consumer: _Consumer, message: MessageProxy) -> None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child starts its own thread
                self._pid, self._queue, self._waiting = os.getpid(), queue.SimpleQueue(), collections.Counter()
                self._thread = threading.Thread(target=self._run, name="dramatiq_unique-outcomes", daemon=True)
                self._thread.start()
            self._waiting[consumer] += 1
        self._queue.put((consumer, message))

    def wait_for(self, consumer: _Consumer) -> None:
        """Until the messages ``consumer`` delivered are acked (bounded by ``CLOSE_WAIT_MS``)."""
        with self._lock:
            if not self._lock.wait_for(lambda: not self._waiting[consumer], CLOSE_WAIT_MS / 1000):
                logger.warning("%d outcomes were not written in %d ms; their messages stay unacked, and a "
                               "redelivery waits for the row's lease.", self._waiting[consumer], CLOSE_WAIT_MS)

    def stop(self) -> None:
        thread = self._thread
        if thread is not None and self._pid == os.getpid():
            self._queue.put(None)
            thread.join(CLOSE_WAIT_MS / 1000)
            self._thread, self._pid = None, 0

    def _run(self) -> None:
        databases: set[Any] = set()
        while True:
            item = self._queue.get()
            batch = []
            while item is not None:
                batch.append(item)
                if len(batch) == MAX_BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                databases.update(self._write(batch))
                self._ack(batch)
            if item is None:
                break
        for db in databases:
            if not db.is_closed():
                db.close()  # this thread's connections

    @staticmethod
    def _write(batch: list[tuple[_Consumer, MessageProxy]]) -> set[Any]:
        by_model: dict[Any, list[tuple[Any, dict[str, Any]]]] = collections.defaultdict(list)
        for _, message in batch:
            model, job, fields = getattr(message, _OUTCOME)
            by_model[model].append((job, fields))
        for model, done in by_model.items():
            _write_until(model, done, time.monotonic() + RETRY_MS / 1000)
        return {model._meta.database for model in by_model}

    def _ack(self, batch: list[tuple[_Consumer, MessageProxy]]) -> None:
        for consumer, message in batch:
            try:
                consumer.inner.ack(message)
            except Exception:
                # Its outcome is committed: a redelivery, after this worker stops, is skipped as finished.
                logger.warning("Could not ack message %s.", message.message_id, exc_info=True)
            finally:
                with self._lock:
                    self._waiting[consumer] -= 1
                    if not self._waiting[consumer]:
                        del self._waiting[consumer]
                        self._lock.notify_all()

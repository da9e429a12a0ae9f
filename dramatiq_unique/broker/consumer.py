"""The Redis broker's consumers, with a socket timeout taken for what it is: a lost connection.

Dramatiq 2.2's Redis consumer turns ``redis.ConnectionError`` into ``ConnectionClosed`` on a fetch, an ack and a
nack, which its worker handles (an ack is tried again until the connection is back), but not ``redis.TimeoutError``
(not a subclass of it: a stalled link), nor either error on a requeue.  A timed-out ack is then logged as a bug in
Dramatiq and its message left unacked, and a consumer thread whose requeue of its delayed messages failed after
such an error ends: that worker never takes a delayed job again, heartbeating all along.  Dramatiq's pull request
895 maps the timeout on fetch, ack and nack; until a release has it, :func:`install` wraps the broker's consumers
so that it does, and on a requeue too.

The wrapper also tells a listener (:func:`listen`) of each message the consumer hands to the worker and of each
requeue: durable/fetched.py starts the tracked jobs a worker received together.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator, Protocol

import redis as redis_lib
from dramatiq.errors import ConnectionClosed

logger = logging.getLogger(__name__)

#: Set on a broker whose consumers :func:`install` wraps: the listeners of their messages.
_INSTALLED = "_dramatiq_unique_consumers"


class Listener(Protocol):
    def received(self, message: Any) -> None:
        """The consumer hands ``message`` (a MessageProxy) to the worker."""

    def requeued(self, messages: list[Any]) -> None:
        """``messages`` (MessageProxies) go back to their queue untaken (the worker stops)."""


def install(broker: Any) -> None:
    """Make every consumer ``broker`` (a Redis broker) hands out raise ``ConnectionClosed`` for a lost or
    timed-out connection.  Idempotent."""
    if getattr(broker, _INSTALLED, None) is not None:
        return
    consume = broker.consume
    listeners: list[Listener] = []

    def consume_with_timeouts(queue_name: str, prefetch: int = 1, timeout: int = 5000) -> "LostOnTimeout":
        return LostOnTimeout(consume(queue_name, prefetch, timeout), listeners)

    broker.consume = consume_with_timeouts
    setattr(broker, _INSTALLED, listeners)


def listen(broker: Any, listener: Listener) -> None:
    """Tell ``listener`` of the messages and requeues of ``broker``'s consumers (made from now on; :func:`install`
    first).  Idempotent."""
    install(broker)
    listeners = getattr(broker, _INSTALLED)
    if listener not in listeners:
        listeners.append(listener)


@contextlib.contextmanager
def _lost() -> Iterator[None]:
    try:
        yield
    except (redis_lib.ConnectionError, redis_lib.TimeoutError) as e:
        raise ConnectionClosed(e) from None


class LostOnTimeout:
    """A Dramatiq consumer whose calls raise ``ConnectionClosed`` for a lost or timed-out connection; anything
    else (its unacked messages, which the Reclaimer reads) is the consumer's own."""

    def __init__(self, consumer: Any, listeners: list[Listener]) -> None:
        self._consumer = consumer
        self._listeners = listeners

    def __iter__(self) -> "LostOnTimeout":
        return self

    def __next__(self) -> Any:
        with _lost():
            message = next(self._consumer)
        if message is not None:
            for listener in self._listeners:
                try:
                    listener.received(message)
                except Exception:
                    logger.exception("Could not note the receipt of message %s.", message.message_id)
        return message

    def ack(self, message: Any) -> None:
        with _lost():
            self._consumer.ack(message)

    def nack(self, message: Any) -> None:
        with _lost():
            self._consumer.nack(message)

    def requeue(self, messages: Any) -> None:
        messages = list(messages)  # Dramatiq passes a generator
        for listener in self._listeners:
            try:
                listener.requeued(messages)
            except Exception:
                logger.exception("Could not note the requeue of %d messages.", len(messages))
        with _lost():
            self._consumer.requeue(messages)

    def close(self) -> None:
        with _lost():
            self._consumer.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

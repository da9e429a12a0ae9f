"""The Redis broker's consumers, with a socket timeout taken for what it is: a lost connection.

Dramatiq 2.2's Redis consumer turns ``redis.ConnectionError`` into ``ConnectionClosed`` on a fetch, an ack and a
nack, which its worker handles (an ack is tried again until the connection is back), but not ``redis.TimeoutError``
(not a subclass of it: a stalled link), nor either error on a requeue.  A timed-out ack is then logged as a bug in
Dramatiq and its message left unacked, and a consumer thread whose requeue of its delayed messages failed after
such an error ends: that worker never takes a delayed job again, heartbeating all along.  Dramatiq's pull request
895 maps the timeout on fetch, ack and nack; until a release has it, :func:`install` wraps the broker's consumers
so that it does, and on a requeue too.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import redis as redis_lib
from dramatiq.errors import ConnectionClosed

#: Set on a broker whose consumers :func:`install` wraps.
_INSTALLED = "_dramatiq_unique_consumers"


def install(broker: Any) -> None:
    """Make every consumer ``broker`` (a Redis broker) hands out raise ``ConnectionClosed`` for a lost or
    timed-out connection.  Idempotent."""
    if getattr(broker, _INSTALLED, False):
        return
    consume = broker.consume

    def consume_with_timeouts(queue_name: str, prefetch: int = 1, timeout: int = 5000) -> "LostOnTimeout":
        return LostOnTimeout(consume(queue_name, prefetch, timeout))

    broker.consume = consume_with_timeouts
    setattr(broker, _INSTALLED, True)


@contextlib.contextmanager
def _lost() -> Iterator[None]:
    try:
        yield
    except (redis_lib.ConnectionError, redis_lib.TimeoutError) as e:
        raise ConnectionClosed(e) from None


class LostOnTimeout:
    """A Dramatiq consumer whose calls raise ``ConnectionClosed`` for a lost or timed-out connection; anything
    else (its unacked messages, which the Reclaimer reads) is the consumer's own."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer

    def __iter__(self) -> "LostOnTimeout":
        return self

    def __next__(self) -> Any:
        with _lost():
            return next(self._consumer)

    def ack(self, message: Any) -> None:
        with _lost():
            self._consumer.ack(message)

    def nack(self, message: Any) -> None:
        with _lost():
            self._consumer.nack(message)

    def requeue(self, messages: Any) -> None:
        with _lost():
            self._consumer.requeue(messages)

    def close(self) -> None:
        with _lost():
            self._consumer.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

"""The wrapped consumers' listeners (dramatiq_unique.broker.consumer), on a consumer of the test's own."""

from __future__ import annotations

from typing import Any, Optional

import pytest
import redis
from dramatiq.errors import ConnectionClosed

from dramatiq_unique.broker import consumer


class Fetching:
    """Fetches as Dramatiq's Redis consumer does: a batch into ``message_cache`` once it is empty, returned
    one message at a time."""

    def __init__(self, batches: list[list[str]]) -> None:
        self.batches = batches
        self.message_cache: list[str] = []
        self.requeued: list[list[str]] = []

    def __next__(self) -> Optional[Message]:
        if not self.message_cache:
            if not self.batches:
                return None
            self.message_cache = list(self.batches.pop(0))
        return Message(message_id=self.message_cache.pop(0))

    def requeue(self, messages: list[str]) -> None:
        if messages == ["lost"]:
            raise redis.TimeoutError("stalled")
        self.requeued.append(messages)


class Message:
    def __init__(self, message_id: str) -> None:
        self.message_id = message_id


class Broker:
    def __init__(self, made: Fetching) -> None:
        self.made = made

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Fetching:
        return self.made


class Heard:
    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.heard: list[Any] = []
        self.requeues: list[list[Any]] = []

    def received(self, message: Any) -> None:
        self.heard.append(message.message_id)
        if self.fails:
            raise RuntimeError("a listener's own failure")

    def requeued(self, messages: list[Any]) -> None:
        self.requeues.append(messages)
        if self.fails:
            raise RuntimeError("a listener's own failure")


@pytest.mark.parametrize("fails", [False, True])
def test_a_listener_hears_of_each_message_once(fails: bool) -> None:
    broker = Broker(Fetching([["a", "b", "c"], ["d"]]))
    heard = Heard(fails)
    consumer.listen(broker, heard)
    consumer.listen(broker, heard)  # once is enough
    made = broker.consume("q")
    assert [getattr(next(made), "message_id", None) for _ in range(5)] == ["a", "b", "c", "d", None]
    assert heard.heard == ["a", "b", "c", "d"]  # a listener's failure is logged, not raised


def test_a_requeue_is_heard_before_it_is_made() -> None:
    broker = Broker(Fetching([]))
    heard = Heard()
    consumer.listen(broker, heard)
    made = broker.consume("q")
    made.requeue(m for m in ["x", "y"])  # Dramatiq passes a generator
    assert heard.requeues == [["x", "y"]] and broker.made.requeued == [["x", "y"]]
    with pytest.raises(ConnectionClosed):
        made.requeue(["lost"])



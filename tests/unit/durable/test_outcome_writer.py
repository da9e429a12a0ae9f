"""The outcome writer's hand-over, with a stand-in for the broker's consumer and for the statements."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import peewee as pw
import pytest
from dramatiq import Message
from dramatiq.broker import Consumer, MessageProxy
from dramatiq.brokers.stub import StubBroker

from dramatiq_unique.durable import outcome_writer
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.database import BoundedPostgresqlDatabase


class Inner(Consumer):
    """Delivers the messages it was given, and records what happened to them, in order."""

    def __init__(self, messages: list[MessageProxy], events: list[tuple[str, Any]]) -> None:
        self.messages, self.events, self.closed = list(messages), events, False

    def __next__(self) -> Any:
        return self.messages.pop(0) if self.messages else None

    def ack(self, message: MessageProxy) -> None:
        self.events.append(("ack", message.message_id))

    def nack(self, message: MessageProxy) -> None:
        self.events.append(("nack", message.message_id))

    def close(self) -> None:
        self.closed = True


def proxy(n: int) -> MessageProxy:
    return MessageProxy(Message(queue_name="q", actor_name="a", args=(n,), kwargs={}, options={}))


class Model:
    """A job model whose database is PostgreSQL of the suite's own kind (never connected)."""

    _meta = SimpleNamespace(database=BoundedPostgresqlDatabase(None))


@pytest.fixture
def rig(monkeypatch):
    events: list[tuple[str, Any]] = []
    batches: list[list[int]] = []
    gate, entered = threading.Event(), threading.Event()
    gate.set()

    def finish_succeeded(model, done, again=False):
        entered.set()
        gate.wait(10)
        batches.append([job.id for job, _ in done])
        events.extend(("written", job.id) for job, _ in done)
        return {job.id for job, _ in done}

    monkeypatch.setattr(jobs, "finish_succeeded", finish_succeeded)
    broker = StubBroker()
    messages = [proxy(n) for n in range(5)]
    inner = Inner(messages, events)
    broker.consume = lambda *args, **kwargs: inner  # type: ignore[method-assign]
    outcome_writer.install(broker)
    consumer = broker.consume("q")
    yield SimpleNamespace(broker=broker, consumer=consumer, inner=inner, messages=messages, events=events,
                          batches=batches, gate=gate, entered=entered)
    gate.set()
    outcome_writer.stop(broker)


def deliver_and_defer(rig, n: int) -> list[MessageProxy]:
    delivered = [next(rig.consumer) for _ in range(n)]
    for i, message in enumerate(delivered):
        assert outcome_writer.defer(message, Model, SimpleNamespace(id=i, message_id=message.message_id), {})
    return delivered


def test_a_message_without_a_deferred_outcome_is_acked_at_once(rig):
    message = next(rig.consumer)
    rig.consumer.ack(message)
    assert rig.events == [("ack", message.message_id)]


def test_a_deferred_outcome_is_written_before_its_message_is_acked(rig):
    message, = deliver_and_defer(rig, 1)
    rig.consumer.ack(message)
    rig.consumer.close()  # waits for the writer
    assert rig.events == [("written", 0), ("ack", message.message_id)]
    assert rig.inner.closed


def test_outcomes_that_wait_while_a_statement_is_in_flight_share_the_next_one(rig):
    delivered = deliver_and_defer(rig, 5)
    rig.gate.clear()  # the first statement is held in flight
    rig.consumer.ack(delivered[0])
    assert rig.entered.wait(10)
    for message in delivered[1:]:
        rig.consumer.ack(message)
    rig.gate.set()
    rig.consumer.close()
    assert rig.batches[0] == [0]
    assert rig.batches[1:] == [[1, 2, 3, 4]]
    acked = [i for kind, i in rig.events if kind == "ack"]
    assert len(acked) == 5
    for n, message in enumerate(delivered):  # no ack before its own write
        assert rig.events.index(("written", n)) < rig.events.index(("ack", message.message_id))


def test_a_failed_batch_is_sent_again_until_it_is_written(rig, monkeypatch):
    tries: list[bool] = []

    def fails_twice(model, done, again=False):
        tries.append(again)
        if len(tries) < 3:
            raise pw.OperationalError("server closed the connection unexpectedly")
        rig.events.extend(("written", job.id) for job, _ in done)
        return {job.id for job, _ in done}

    monkeypatch.setattr(jobs, "finish_succeeded", fails_twice)
    delivered = deliver_and_defer(rig, 2)
    for message in delivered:
        rig.consumer.ack(message)
    rig.consumer.close()
    assert tries[0] is False and all(tries[1:])  # sent again: rows it finds finished are not fenced out
    assert [kind for kind, _ in rig.events] in (["written", "written", "ack", "ack"],)


def test_a_batch_that_fails_past_its_deadline_is_acked_for_the_re_drive(rig, monkeypatch):
    def fails(model, done, again=False):
        raise pw.OperationalError("deadlock detected")

    monkeypatch.setattr(jobs, "finish_succeeded", fails)
    monkeypatch.setattr(outcome_writer, "RETRY_MS", 200)
    delivered = deliver_and_defer(rig, 2)
    for message in delivered:
        rig.consumer.ack(message)
    rig.consumer.close()
    assert sorted(i for kind, i in rig.events if kind == "ack") == sorted(m.message_id for m in delivered)


def test_only_messages_of_a_wrapped_consumer_on_postgresql_are_deferred(rig):
    assert not outcome_writer.defer(proxy(9), Model, SimpleNamespace(id=9), {})  # not delivered by ours
    sqlite = SimpleNamespace(_meta=SimpleNamespace(database=pw.SqliteDatabase(None)))
    assert not outcome_writer.defer(next(rig.consumer), sqlite, SimpleNamespace(id=1), {})


def test_the_broker_is_wrapped_once():
    broker = StubBroker()
    outcome_writer.install(broker)
    consume = broker.consume
    outcome_writer.install(broker)
    assert broker.consume is consume

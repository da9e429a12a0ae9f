"""The transactional outbox (dramatiq_unique.durable.outbox): sends that commit or roll back with the caller's writes.

Real Redis brokers (the shared server, or a throwaway redis-server that
the test stops to play a broker outage), SQLite and PostgreSQL.
"""

from __future__ import annotations

import threading

import dramatiq
import peewee as pw
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import JobModel, transaction
from tests.conftest import REDIS_URL
from tests.durable import RedisServer, broker_messages, free_port, running_worker
from tests.helpers import job_of, wait_until


class Order(pw.Model):
    """The caller's own table, in the suite's database."""

    number = pw.IntegerField()


@pytest.fixture
def orders(suite):
    Order.bind(suite.db)
    suite.db.create_tables([Order])
    return Order


def test_sends_are_published_only_after_commit(suite, broker, orders, charge):
    """Given sends inside transaction(), then until the commit the rows are pending,
    visible only to the caller, and nothing is in the broker; after it, all is published."""
    with transaction():
        orders.create(number=1)
        message = charge.send(1)
        job = job_of(message)
        assert job.status == "pending" and job.enqueued_at is None
        assert broker_messages(broker) == []
    assert orders.select().count() == 1
    job = job_of(message)
    assert job.status == "queued" and job.enqueued_at is not None and job.broker_ref
    assert [m["message_id"] for m in broker_messages(broker)] == [message.message_id]
    with running_worker(broker):
        wait_until(lambda: job_of(message).status == "succeeded", timeout=10)


def test_a_rollback_publishes_nothing_and_leaves_no_row(suite, broker, orders, charge):
    with pytest.raises(RuntimeError):
        with transaction():
            orders.create(number=1)
            message = charge.send(1)
            raise RuntimeError("the payment provider said no")
    assert orders.select().count() == 0
    assert job_of(message) is None and JobModel.select().count() == 0
    assert broker_messages(broker) == []


def test_a_broker_outage_at_commit_leaves_rows_pending_for_the_redrive(database_url, key_prefix):
    """Given the broker goes down before the commit, the caller sees no error, the
    caller's writes and the pending rows are committed; the re-drive sends them later."""
    server = RedisServer().start()
    broker = RedisBroker(url=server.url, namespace=f"{key_prefix}-outage")
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    try:
        Order.bind(suite.db)
        suite.db.create_tables([Order])

        @dramatiq.actor(track=True)
        def charge(order):
            return order

        with transaction():
            orders = [Order.create(number=n) for n in range(3)]
            messages = [charge.send(o.number) for o in orders]
            server.stop()  # the broker is gone when the transaction commits
        assert Order.select().count() == 3
        assert [job_of(m).status for m in messages] == ["pending"] * 3
        assert dramatiq_unique.redrive().errors == 1  # still down: nothing lost, nothing sent

        server.start()  # back, empty
        counts = dramatiq_unique.redrive()
        assert counts.sent == 3
        assert sorted(m["message_id"] for m in broker_messages(broker)) == sorted(m.message_id for m in messages)
        with running_worker(broker):
            wait_until(lambda: all(job_of(m).status == "succeeded" for m in messages), timeout=10)
    finally:
        server.stop()
        broker.close()
        suite.db.close()


def test_outside_a_transaction_a_broker_failure_raises_and_leaves_no_row(database_url, key_prefix):
    """With on_broker_down="raise" (the default, "defer", is tested in test_broker_down.py)."""
    broker = RedisBroker(url=f"redis://127.0.0.1:{free_port()}/0", namespace=f"{key_prefix}-down")
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False,
                                  check_redis=False, on_broker_down="raise")
    try:

        @dramatiq.actor(track=True)
        def charge(order):
            pass

        @dramatiq.actor(unique_args=["order"])
        def refund(order):
            pass

        for actor in (charge, refund):
            message = actor.message(1)
            with pytest.raises(redis.ConnectionError):
                broker.enqueue(message)
            assert job_of(message) is None
        assert JobModel.select().count() == 0
        # Nor is the unique key held by a phantom job in Redis.
        assert list(suite.redis.scan_iter(match=f"redlock:{key_prefix}:*")) == []
    finally:
        broker.close()
        suite.db.close()


def test_a_unique_send_rolled_back_does_not_hold_its_key(suite, broker):
    @dramatiq.actor(unique_args=["order"], unique_lock="until_executed")
    def refund(order):
        pass

    with pytest.raises(KeyError):
        with transaction():
            rolled_back = refund.send(5)
            raise KeyError("abort")
    message = refund.send(5)
    assert message.message_id != rolled_back.message_id and job_of(message).status == "queued"
    assert refund.send(5).message_id == message.message_id  # and the new one holds the key


def test_a_unique_send_inside_a_transaction_is_deduplicated(suite, broker):
    @dramatiq.actor(unique_args=["order"], unique_lock="until_executed")
    def refund(order):
        pass

    with transaction():
        first = refund.send(5)
        second = refund.send(5)
    assert first.message_id == second.message_id
    assert [m["message_id"] for m in broker_messages(broker)] == [first.message_id]


def test_a_delayed_send_is_published_after_commit_with_its_delay(suite, broker, charge):
    with transaction():
        message = charge.send_with_options(args=(1,), delay=60_000)
    (published,) = broker_messages(broker)
    assert published["message_id"] == message.message_id and published["queue_name"] == "default.DQ"
    assert job_of(message).status == "queued"


def test_nested_blocks_roll_back_alone_and_publish_with_the_outermost_commit(suite, broker, orders, charge):
    with transaction():
        outer = charge.send(1)
        with pytest.raises(ValueError):
            with transaction():
                inner_rolled_back = charge.send(2)
                raise ValueError("inner")
        with transaction():
            inner = charge.send(3)
        assert broker_messages(broker) == []
    assert job_of(inner_rolled_back) is None
    assert sorted(m["message_id"] for m in broker_messages(broker)) == sorted([outer.message_id, inner.message_id])


def test_inside_the_callers_own_transaction_publishing_waits_for_its_commit(suite, broker, orders, charge):
    with suite.db.atomic():
        orders.create(number=1)
        with transaction():
            message = charge.send(1)
        assert broker_messages(broker) == []  # our block ended, the caller's has not
    assert [m["message_id"] for m in broker_messages(broker)] == [message.message_id]

    with pytest.raises(ZeroDivisionError):
        with suite.db.atomic():
            with transaction():
                rolled_back = charge.send(2)
            raise ZeroDivisionError
    assert job_of(rolled_back) is None and len(broker_messages(broker)) == 1


def test_untracked_sends_are_held_until_commit_too(suite, broker):
    @dramatiq.actor
    def notify(text):
        pass

    with transaction():
        kept = notify.send("kept")
        assert broker_messages(broker) == []
    with pytest.raises(LookupError):
        with transaction():
            notify.send("dropped")
            raise LookupError()
    assert [m["message_id"] for m in broker_messages(broker)] == [kept.message_id]


def test_a_send_from_another_thread_is_not_part_of_the_transaction(suite, broker):
    """peewee transactions are per thread, and so is the outbox."""

    @dramatiq.actor
    def notify(text):
        pass

    with transaction():
        inside = notify.send("inside")
        thread = threading.Thread(target=lambda: notify.send("other thread"))
        thread.start()
        thread.join(10)
        (published,) = broker_messages(broker)
        assert published["args"] == ["other thread"]
    assert inside.message_id in {m["message_id"] for m in broker_messages(broker)}


def test_a_redrive_during_the_commit_window_does_not_send_twice(suite, broker, charge, monkeypatch):
    """Given rows committed but not yet published (as between the commit and the
    publish), a re-drive pass and the after-commit publish both try: one sends."""
    from dramatiq_unique.durable import outbox

    calls = []
    original = outbox.publish

    def publish_after_a_redrive(suite, items):
        calls.append(dramatiq_unique.redrive().sent)  # a pass gets there first
        original(suite, items)

    monkeypatch.setattr(outbox, "publish", publish_after_a_redrive)
    with transaction():
        message = charge.send(1)
    assert calls == [1]
    assert [m["message_id"] for m in broker_messages(broker)] == [message.message_id]

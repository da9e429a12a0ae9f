"""A committed transaction's sends claimed and published in batches (dramatiq_unique.durable.outbox),
on the shared Redis with SQLite and PostgreSQL; a broker outage on a throwaway redis-server."""

from __future__ import annotations

import logging

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import JobModel, transaction
from dramatiq_unique.durable import outbox
from tests.conftest import REDIS_URL
from tests.durable import RedisServer, broker_messages, running_worker
from tests.helpers import job_of, wait_until


@pytest.fixture
def batches(monkeypatch) -> list[int]:
    """The sizes of the batches claimed and published."""
    sizes: list[int] = []
    original = outbox.claim_and_publish

    def spy(suite, model, held):
        sizes.append(len(held))
        return original(suite, model, held)

    monkeypatch.setattr(outbox, "claim_and_publish", spy)
    return sizes


def test_a_transactions_sends_go_out_in_batches_each_job_once(suite, broker, charge, batches):
    suite.settings.send_many_batch = 4
    with transaction():
        messages = [charge.send(n) for n in range(10)]
        messages += dramatiq_unique.send_many(charge, [(n,) for n in range(10, 15)])
    assert batches == [4, 4, 4, 3]
    published = {m["message_id"]: m for m in broker_messages(broker)}
    assert sorted(published) == sorted(m.message_id for m in messages)
    for message in messages:
        job = job_of(message)
        # The row names the message the broker holds, so the lost-message check finds it.
        assert (job.status, job.broker_ref) == ("queued", published[message.message_id]["options"]["redis_message_id"])
        assert job.enqueued_at is not None
    with running_worker(broker):
        wait_until(lambda: all(job_of(m).status == "succeeded" for m in messages), timeout=15)
    assert [job_of(m).attempts for m in messages] == [1] * 15


def test_delayed_and_untracked_sends_still_go_one_by_one(suite, broker, charge, batches):
    @dramatiq.actor
    def note(n):
        pass

    with transaction():
        now = charge.send(1)
        later = charge.send_with_options(args=(2,), delay=60_000)
        untracked = note.send(3)
    assert batches == [1]  # only the due tracked send
    assert job_of(later).status == "queued" and job_of(now).status == "queued"
    published = {m["message_id"]: m for m in broker_messages(broker)}
    assert {now.message_id, untracked.message_id, later.message_id} <= set(published)
    assert "eta" in published[later.message_id]["options"]  # in the delay queue, its delay kept


def test_a_row_the_redrive_claimed_first_is_not_sent_again(suite, broker, charge, monkeypatch):
    original = outbox.claim_and_publish
    sent = []

    def after_a_redrive(suite_, model, held):
        sent.append(dramatiq_unique.redrive().sent)  # a pass between the commit and this publish
        return original(suite_, model, held)

    monkeypatch.setattr(outbox, "claim_and_publish", after_a_redrive)
    with transaction():
        messages = [charge.send(n) for n in range(3)]
    assert sent == [3]
    assert sorted(m["message_id"] for m in broker_messages(broker)) == sorted(m.message_id for m in messages)


def test_a_batch_the_broker_fails_waits_pending_for_the_redrive(database_url, key_prefix, caplog):
    server = RedisServer().start()
    broker = RedisBroker(url=server.url, namespace=f"{key_prefix}-outage")
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix,
                                  redriver=False, send_many_batch=2)
    try:
        @dramatiq.actor(track=True)
        def charge(order):
            return order

        @dramatiq.actor
        def note(n):
            pass

        with caplog.at_level(logging.WARNING, logger="dramatiq_unique"):
            with transaction():
                messages = [charge.send(n) for n in range(5)]
                untracked = note.send(9)
                server.stop()
        assert [job_of(m).status for m in messages] == ["pending"] * 5
        assert all(job_of(m).broker_ref is None and job_of(m).enqueued_at is None for m in messages)
        outage = [r for r in caplog.records if "is down" in r.getMessage()]
        assert len(outage) == 1  # one WARNING for the outage, not one per job
        assert any(untracked.message_id in r.getMessage() and "lost" in r.getMessage() for r in caplog.records)

        server.start()
        assert dramatiq_unique.redrive().sent == 5
        with running_worker(broker):
            wait_until(lambda: all(job_of(m).status == "succeeded" for m in messages), timeout=15)
        assert JobModel.select().count() == 5
    finally:
        server.stop()
        broker.close()
        suite.db.close()


def test_on_a_psycopg_3_database_the_claim_is_never_prepared(broker, pg_url, key_prefix):
    """psycopg 3 prepares what a connection runs often; the claim of a batch, run once per batch, is kept
    out of it (a generic plan scanned every pending row): many transactions in a row, every job published."""
    import peewee as pw
    from playhouse.db_url import parse

    params = parse(pg_url)
    db = pw.PostgresqlDatabase(params.pop("database"), prefer_psycopg3=True, **params)
    dramatiq_unique.setup(broker, database=db, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    try:
        @dramatiq.actor(track=True)
        def charge(order):
            return order

        messages = []
        for block in range(8):  # past psycopg 3's prepare_threshold (5)
            with transaction():
                messages += dramatiq_unique.send_many(charge, [(block * 10 + n,) for n in range(10)])
        prepared = db.execute_sql("SELECT statement FROM pg_prepared_statements").fetchall()
        assert not [s for (s,) in prepared if "unnest" in s]
        assert sorted(m["message_id"] for m in broker_messages(broker)) == sorted(m.message_id for m in messages)
        assert {job_of(m).status for m in messages} == {"queued"}
    finally:
        db.close()

"""Tracked sends published by the Redis broker's own enqueue, unique ones with their queue locks,
on real Redis with SQLite and PostgreSQL."""

from __future__ import annotations

import time

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import JobModel, send_many
from dramatiq_unique.broker.publish import Publisher
from dramatiq_unique.redis import scripts
from tests.durable import RedisServer, running_worker
from tests.helpers import queue_lock_of, queue_size, wait_until
from tests.integration.unique.test_bulk import Runs


def watch_publishes(suite, broker, redis_client, monkeypatch) -> list:
    """Each publish through the broker's own enqueue: (queue, the send's queue lock as it stood then)."""
    seen: list = []
    dispatch = broker._dispatch("enqueue")

    def publish(queue_name, ref, body):
        locks = [(key, redis_client.get(key)) for key in redis_client.scan_iter(match=f"redlock:{suite.keys.prefix}*")]
        seen.append((queue_name, locks))
        return dispatch(queue_name, ref, body)

    monkeypatch.setattr(broker, "do_enqueue", publish)
    return seen


def test_a_tracked_message_is_published_by_the_broker_and_runs(suite, broker, worker, redis_client, monkeypatch):
    """Given a tracked and an untracked actor, When both send, Then both go through the broker's own
    enqueue, and are queued, fetched, run and acked like any message."""
    ran: list = []

    @dramatiq.actor(track=True)
    def tracked(x):
        ran.append(("tracked", x))

    @dramatiq.actor
    def plain(x):
        ran.append(("plain", x))

    calls = watch_publishes(suite, broker, redis_client, monkeypatch)

    sent = tracked.send(1)
    plain.send(2)
    tracked.send_with_options(args=(3,), delay=50)  # to the delay queue, promoted when due
    wait_until(lambda: len(ran) == 3, timeout=10)
    assert sorted(ran) == [("plain", 2), ("tracked", 1), ("tracked", 3)]
    assert [queue for queue, _ in calls[:3]] == ["default", "default", "default.DQ"]  # then its promotion
    wait_until(lambda: dramatiq_unique.get_job(sent.message_id).status == "succeeded", timeout=10)
    # Acked after the outcome is recorded: nothing left of them in the broker.
    wait_until(lambda: sum(broker.client.hlen(f"{broker.namespace}:{q}.msgs") for q in ("default", "default.DQ")) == 0)


def test_a_unique_send_writes_its_queue_lock_with_its_message(suite, broker, redis_client, monkeypatch):
    """Given the locks on the broker's server, When a unique send publishes, Then its queue lock is SET in
    the MULTI/EXEC that publishes its message, before it: one round trip, no call of its own."""
    @dramatiq.actor(unique_args=True, unique_lock="until_executing")
    def sync(account):
        pass

    trips: list = []
    real = scripts._Link.call_all

    def counted(self, commands):
        trips.append([command[0] for command in commands])
        return real(self, commands)

    def separately(*args):
        raise AssertionError("the queue lock was taken on its own")

    monkeypatch.setattr(scripts._Link, "call_all", counted)
    monkeypatch.setattr(suite.locks, "force", separately)
    sent = sync.send("acme")
    [trip] = trips
    assert trip[0] == "MULTI" and trip[-2:] == ["EVALSHA", "EXEC"] and trip[-3] == "SET", trip
    key = f"redlock:{suite.keys.queue_lock(dramatiq_unique.get_job(sent.message_id).unique_key)}"
    assert redis_client.get(key).decode() == sent.message_id, "the lock names the job"
    assert 0 < redis_client.pttl(key) <= 60_000
    assert queue_size(broker) == 1
    assert sync.send("acme").message_id == sent.message_id


def test_a_failed_publish_leaves_no_row_and_no_lock(suite, broker, redis_client, monkeypatch):
    @dramatiq.actor(unique_args=True, unique_lock="until_executing")
    def sync(account):
        pass

    def down(self, commands):
        raise redis.ConnectionError("Redis went away")

    monkeypatch.setattr(scripts._Link, "call_all", down)
    monkeypatch.setattr(suite.settings, "on_broker_down", "raise")
    with pytest.raises(redis.ConnectionError):
        sync.send("acme")
    assert JobModel.select().where(JobModel.actor_name == "sync").count() == 0
    assert queue_size(broker) == 0
    assert list(redis_client.scan_iter(match=f"redlock:{suite.keys.prefix}*")) == []
    monkeypatch.undo()
    assert dramatiq_unique.get_job(sync.send("acme").message_id).status == "queued"

    # With "defer" (the default) the row waits pending for the re-drive; the lock went with the publish.
    monkeypatch.setattr(scripts._Link, "call_all", down)
    kept = sync.send("other")
    assert dramatiq_unique.get_job(kept.message_id).status == "pending" and queue_size(broker) == 1
    assert queue_lock_of(suite, redis_client, kept.message_id) is None
    assert sync.send("other").message_id == kept.message_id, "a duplicate meanwhile is the pending job"


def test_locks_on_another_redis_are_written_before_the_broker_publishes(broker, database_url, key_prefix):
    """Given locks on another Redis database than the broker's, the lock is written there."""
    suite = dramatiq_unique.setup(
        broker, database=database_url, redis="redis://127.0.0.1:6379/1", key_prefix=key_prefix, redriver=False
    )
    other = redis.Redis.from_url("redis://127.0.0.1:6379/1")
    try:

        @dramatiq.actor(unique_args=True, unique_lock="until_executing")
        def sync(account):
            pass

        sent = sync.send("acme")
        job = dramatiq_unique.get_job(sent.message_id)
        assert other.get(f"redlock:{suite.keys.queue_lock(job.unique_key)}").decode() == sent.message_id
        assert queue_size(broker) == 1
    finally:
        for key in other.scan_iter(match=f"redlock:{key_prefix}*"):
            other.delete(key)
        other.close()
        suite.db.close()


@pytest.fixture
def own_redis(database_url, key_prefix):
    """One redis-server of the test's own for the broker and the suite's locks (the usual set-up), and
    a unique actor on it counting its runs: ``(server, broker, actor, runs)``."""
    server = RedisServer().start()
    broker = RedisBroker(url=server.url, namespace=f"{key_prefix}-kill")
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=database_url, redis=server.url, key_prefix=key_prefix,
                                  redriver=False)
    runs = Runs()

    @dramatiq.actor(unique_args=["key"], max_retries=0)
    def sync(key):
        runs.add(key)

    yield server, broker, sync, runs
    broker.close()
    server.stop()
    suite.db.close()


def redrive_and_run(broker, runs: Runs, expected: int) -> None:
    assert dramatiq_unique.redrive().errors == 0
    with running_worker(broker, threads=4):
        wait_until(lambda: JobModel.select().where(JobModel.status == "succeeded").count() == expected, timeout=30)
        time.sleep(0.3)  # a second delivery, if any, is fetched and dropped meanwhile
    assert len(runs.counts) == expected and set(runs.counts.values()) == {1}, runs.counts


def test_the_brokers_server_killed_as_a_unique_send_publishes(own_redis):
    """Given one Redis for the broker and the locks, When it dies as a unique send publishes,
    Then the send returns, its row waits pending, a duplicate meanwhile resolves to
    it, and once the server is back (empty) the re-drive publishes it and it runs once."""
    server, broker, sync, runs = own_redis
    real = scripts._Link.call_all
    stopped: list = []

    def killed(self, commands):
        if not stopped:
            stopped.append(server.stop())
        return real(self, commands)

    scripts._Link.call_all = killed
    try:
        sent = sync.send("k")
    finally:
        scripts._Link.call_all = real
    assert dramatiq_unique.get_job(sent.message_id).status == "pending"
    assert sync.send("k").message_id == sent.message_id, "the database decides while Redis is down"
    server.start()
    redrive_and_run(broker, runs, 1)


@pytest.mark.parametrize("many", [False, True], ids=["send", "send_many"])
def test_a_publish_whose_reply_was_lost_runs_once(own_redis, monkeypatch, many):
    """Given publishes that reached the broker but whose reply was lost (the connection broke), Then
    each row is kept pending and re-driven: its job is delivered twice, and runs once."""
    _, broker, sync, runs = own_redis
    if many:
        real = Publisher.publish_many

        def lost(self, entries):
            real(self, entries)
            raise redis.ConnectionError("the reply was lost")

        monkeypatch.setattr(Publisher, "publish_many", lost)
    else:
        dispatch = broker._dispatch("enqueue")

        def lost(*args):  # type: ignore[misc]
            dispatch(*args)
            raise redis.ConnectionError("the reply was lost")

        monkeypatch.setattr(broker, "do_enqueue", lost, raising=False)
    sent = send_many(sync, [("a",), ("b",)]) if many else [sync.send("a"), sync.send("b")]
    monkeypatch.undo()
    assert {dramatiq_unique.get_job(m.message_id).status for m in sent} == {"pending"}
    # In the broker all the same (a second single send is kept pending without trying: deferral.py).
    assert queue_size(broker) == (2 if many else 1)
    redrive_and_run(broker, runs, 2)

"""Tracked sends published by our own script, unique ones with their queue locks
(dramatiq_unique.broker.publish), on the Redis broker with real Redis, SQLite and PostgreSQL."""

from __future__ import annotations

import dramatiq
import pytest
import redis

import dramatiq_unique
from dramatiq_unique import JobModel
from tests.helpers import queue_lock_of, queue_size, wait_until


def count_script_calls(suite, monkeypatch) -> list:
    calls: list = []
    script = suite.publisher.script

    def counted(keys=(), args=()):
        calls.append(list(keys))
        return script(keys=keys, args=args)

    monkeypatch.setattr(suite.publisher, "script", counted)
    return calls


def test_a_tracked_message_is_published_as_the_broker_would_and_runs(suite, broker, worker, monkeypatch):
    """Given a tracked and an untracked actor, When both send, Then only the tracked message
    goes through our script, and both are queued, fetched, run and acked like any message."""
    ran: list = []

    @dramatiq.actor(track=True)
    def tracked(x):
        ran.append(("tracked", x))

    @dramatiq.actor
    def plain(x):
        ran.append(("plain", x))

    calls = count_script_calls(suite, monkeypatch)

    sent = tracked.send(1)
    plain.send(2)
    tracked.send_with_options(args=(3,), delay=50)  # to the delay queue, promoted when due
    wait_until(lambda: len(ran) == 3, timeout=10)
    assert sorted(ran) == [("plain", 2), ("tracked", 1), ("tracked", 3)]
    assert len(calls) == 2 and calls[1][1].endswith(":default.DQ")
    wait_until(lambda: dramatiq_unique.get_job(sent.message_id).status == "succeeded", timeout=10)
    # Acked after the outcome is recorded: nothing left of them in the broker.
    wait_until(lambda: sum(broker.client.hlen(f"{broker.namespace}:{q}.msgs") for q in ("default", "default.DQ")) == 0)


def test_a_unique_send_writes_its_queue_lock_with_its_message(suite, broker, redis_client, monkeypatch):
    @dramatiq.actor(unique_args=True, unique_lock="until_executing")
    def sync(account):
        pass

    calls = count_script_calls(suite, monkeypatch)
    sent = sync.send("acme")
    assert len(calls) == 1 and calls[0][3].startswith("redlock:")
    assert queue_lock_of(suite, redis_client, sent.message_id).decode() == sent.message_id
    assert 0 < redis_client.pttl(calls[0][3]) <= 60_000
    assert queue_size(broker) == 1


def test_when_the_broker_does_its_maintenance_it_publishes_after_the_lock_is_written(
    suite, broker, redis_client, monkeypatch
):
    """Only Dramatiq's own script does the queue maintenance (1 enqueue in maintenance_chance
    in a million): then the lock is written first, and the broker publishes."""
    @dramatiq.actor(unique_args=True, unique_lock="until_executing")
    def sync(account):
        pass

    calls = count_script_calls(suite, monkeypatch)
    monkeypatch.setattr(broker, "_should_do_maintenance", lambda command: 1)

    sent = sync.send("acme")
    assert calls == []
    assert queue_lock_of(suite, redis_client, sent.message_id).decode() == sent.message_id
    assert queue_size(broker) == 1
    assert sync.send("acme").message_id == sent.message_id


def test_a_failed_publish_leaves_no_row_and_no_lock(suite, broker, redis_client, monkeypatch):
    @dramatiq.actor(unique_args=True, unique_lock="until_executing")
    def sync(account):
        pass

    def down(keys=(), args=()):
        raise redis.ConnectionError("Redis went away")

    monkeypatch.setattr(suite.publisher, "script", down)
    monkeypatch.setattr(suite.settings, "on_broker_down", "raise")
    with pytest.raises(redis.ConnectionError):
        sync.send("acme")
    assert JobModel.select().where(JobModel.actor_name == "sync").count() == 0
    assert queue_size(broker) == 0
    assert list(redis_client.scan_iter(match=f"redlock:{suite.keys.prefix}*")) == []
    monkeypatch.undo()
    assert dramatiq_unique.get_job(sync.send("acme").message_id).status == "queued"

    # With "defer" (the default) the row waits pending for the re-drive; the lock went with the publish.
    monkeypatch.setattr(suite.publisher, "script", down)
    kept = sync.send("other")
    assert dramatiq_unique.get_job(kept.message_id).status == "pending" and queue_size(broker) == 1
    assert redis_client.get(f"redlock:{suite.keys.queue_lock(dramatiq_unique.get_job(kept.message_id).unique_key)}") \
        is None


def test_locks_on_another_redis_are_written_before_the_broker_publishes(broker, database_url, key_prefix):
    """Given locks on another Redis database than the broker's, the lock cannot go with the
    publish: it is written on its own, and the tracked message still goes through our script."""
    suite = dramatiq_unique.setup(
        broker, database=database_url, redis="redis://127.0.0.1:6379/1", key_prefix=key_prefix, redriver=False
    )
    other = redis.Redis.from_url("redis://127.0.0.1:6379/1")
    try:

        @dramatiq.actor(unique_args=True, unique_lock="until_executing")
        def sync(account):
            pass

        assert suite.publisher is not None and not suite.publisher.locks
        sent = sync.send("acme")
        job = dramatiq_unique.get_job(sent.message_id)
        assert other.get(f"redlock:{suite.keys.queue_lock(job.unique_key)}").decode() == sent.message_id
        assert queue_size(broker) == 1
    finally:
        for key in other.scan_iter(match=f"redlock:{key_prefix}*"):
            other.delete(key)
        other.close()
        suite.db.close()

"""Tracked messages acked by the Redis broker's own ack, and unique jobs' queue locks freed at their
start, with real Redis, SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import dramatiq

import dramatiq_unique
from tests.helpers import queue_lock_of, wait_until


def test_tracked_and_untracked_messages_are_acked_by_the_broker_after_their_outcome(suite, broker, worker):
    """Given a tracked and an untracked actor, When both run, Then neither leaves its body or its id
    in the broker, the tracked one acked once its outcome is recorded."""
    ran: list = []

    @dramatiq.actor(track=True)
    def tracked(x):
        ran.append(x)

    @dramatiq.actor
    def plain(x):
        ran.append(x)

    sent = tracked.send(1)
    plain.send(2)
    wait_until(lambda: sorted(ran) == [1, 2], timeout=10)
    wait_until(lambda: dramatiq_unique.get_job(sent.message_id).status == "succeeded", timeout=10)
    ns = broker.namespace
    client = broker.client

    def left() -> int:
        ack_sets = list(client.scan_iter(match=f"{ns}:__acks__.*"))
        return client.hlen(f"{ns}:default.msgs") + sum(client.scard(s) for s in ack_sets)

    wait_until(lambda: left() == 0, timeout=10)
    assert client.zscore(f"{ns}:__heartbeats__", broker.broker_id) is not None


def test_a_tracked_job_that_failed_for_good_is_nacked_by_the_broker_as_usual(suite, broker, worker):
    """A rejected message is not acked: the broker's own nack moves it to the dead-letter
    queue, and the row says failed."""

    @dramatiq.actor(track=True, max_retries=0)
    def broken():
        raise RuntimeError("no")

    sent = broken.send()
    wait_until(lambda: dramatiq_unique.get_job(sent.message_id).status == "failed", timeout=10)
    ns = broker.namespace
    wait_until(lambda: broker.client.hlen(f"{ns}:default.msgs") == 0, timeout=10)
    assert broker.client.hlen(f"{ns}:default.XQ.msgs") == 1


def test_an_until_executing_queue_lock_is_released_at_the_start(suite, broker, worker, redis_client):
    """Given a running until_executing job, its key is free (the row's hold cleared at the start,
    then its Redis queue lock): a send of the key meanwhile is accepted, its lock names the new job,
    and once that job is done no lock is left."""
    go, started = threading.Event(), []

    @dramatiq.actor(unique_args=["key"], unique_lock="until_executing")
    def sync(key, n):
        started.append(n)
        if n == 1:
            assert go.wait(10)

    worker.pause()  # else it may start, and free the lock, before the lock is looked at
    first = sync.send("k", 1)
    assert queue_lock_of(suite, redis_client, first.message_id).decode() == first.message_id
    worker.resume()
    wait_until(lambda: started == [1], timeout=10)
    wait_until(lambda: queue_lock_of(suite, redis_client, first.message_id) is None, timeout=10)
    second = sync.send("k", 2)
    assert second.message_id != first.message_id, "accepted: the first job has started"
    assert queue_lock_of(suite, redis_client, second.message_id).decode() == second.message_id
    go.set()
    wait_until(lambda: dramatiq_unique.get_job(second.message_id).status == "succeeded", timeout=10)
    wait_until(lambda: queue_lock_of(suite, redis_client, second.message_id) is None, timeout=10)
    assert started == [1, 2]


def test_an_until_executing_queue_lock_is_released_when_the_message_is_rejected(suite, broker, worker, redis_client):
    """A message that failed for good is nacked, not acked: its queue lock is released all the same."""

    @dramatiq.actor(unique_args=True, unique_lock="until_executing", max_retries=0)
    def broken(key):
        raise RuntimeError("no")

    worker.pause()  # else a fast worker may run and nack it before the lock is looked at
    sent = broken.send("k")
    assert queue_lock_of(suite, redis_client, sent.message_id) is not None
    worker.resume()
    wait_until(lambda: dramatiq_unique.get_job(sent.message_id).status == "failed", timeout=10)
    wait_until(lambda: queue_lock_of(suite, redis_client, sent.message_id) is None, timeout=10)

"""Successes written in batches on PostgreSQL, with a real Redis broker and worker: every message is acked
only after its outcome is committed, and a worker that stops writes and acks what waits."""

from __future__ import annotations

import threading

import dramatiq
import pytest
from dramatiq import Message

import dramatiq_unique
from dramatiq_unique import JobModel
from dramatiq_unique.storage import jobs
from tests.conftest import REDIS_URL
from tests.helpers import wait_until


@pytest.fixture
def pg_suite(broker, pg_url, key_prefix):
    suite = dramatiq_unique.setup(broker, database=pg_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    yield suite
    suite.db.close()


@pytest.fixture
def batches(monkeypatch) -> list[int]:
    """The size of each batch the writer wrote."""
    sizes: list[int] = []
    finish_succeeded = jobs.finish_succeeded

    def counted(model, done, again=False):
        sizes.append(len(done))
        return finish_succeeded(model, done, again=again)

    monkeypatch.setattr(jobs, "finish_succeeded", counted)
    return sizes


def test_no_message_is_acked_before_its_outcome_is_committed(pg_suite, broker, batches):
    @dramatiq.actor(track=True)
    def noop(n):
        return n

    sent = {noop.send(n).message_id for n in range(300)}
    msgs = f"{broker.namespace}:{noop.queue_name}.msgs"
    seen_early: list[str] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            # The queue's hash first: every message gone from it was acked, so its row must be written.
            queued = {Message.decode(data).message_id for data in broker.client.hvals(msgs)}
            acked = sent - queued
            if acked:
                rows = JobModel.select(JobModel.message_id).where(
                    JobModel.message_id.in_(list(acked)) & (JobModel.status != "succeeded"))
                seen_early.extend(r.message_id for r in rows)
        pg_suite.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=8)
    worker.start()
    try:
        broker.join(noop.queue_name, timeout=60_000)
    finally:
        stop.set()
        watcher.join(10)
        worker.stop(timeout=10_000)
    assert not seen_early, f"acked before their outcome was committed: {seen_early[:3]}"
    rows = list(JobModel.select().where(JobModel.message_id.in_(list(sent))))
    assert len(rows) == 300 and {r.status for r in rows} == {"succeeded"}
    assert all(r.result == r.args[0] and [e["status"] for e in r.history] == ["succeeded"] for r in rows)
    assert sum(batches) == 300 and len(batches) < 300  # written by the writer, some of them together


def test_a_stopping_worker_writes_and_acks_what_waits(pg_suite, broker, batches):
    gate = threading.Event()

    @dramatiq.actor(track=True)
    def held(n):
        gate.wait(10)

    sent = [held.send(n).message_id for n in range(16)]
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=8)
    worker.start()
    wait_until(lambda: JobModel.select().where(JobModel.status == "running").count() == 8, timeout=15)
    gate.set()
    worker.stop(timeout=10_000)  # the rest stay queued; the eight that ran are written and acked
    done = JobModel.select().where(JobModel.message_id.in_(sent) & (JobModel.status == "succeeded")).count()
    assert done >= 8
    assert broker.client.hlen(f"{broker.namespace}:{held.queue_name}.msgs") == 16 - done


def test_a_copy_delivered_while_its_outcome_waits_does_not_run(pg_suite, broker, monkeypatch):
    """The copy finds the row running (its outcome not yet committed): it waits for the attempt, and once
    the outcome is committed it is dropped as a finished job's copy."""
    held, entered = threading.Event(), threading.Event()
    finish_succeeded = jobs.finish_succeeded

    def slow(model, done, again=False):
        entered.set()
        held.wait(10)
        return finish_succeeded(model, done, again=again)

    monkeypatch.setattr(jobs, "finish_succeeded", slow)
    runs: list[int] = []

    @dramatiq.actor(track=True, unique_ttl=300)
    def once(n):
        runs.append(n)

    message = once.send(1)
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=4)
    worker.start()
    try:
        assert entered.wait(10), "the outcome reached the writer"
        broker.enqueue(message.copy())  # a second delivery of the same job while its outcome waits
        wait_until(lambda: broker.client.hlen(f"{broker.namespace}:{once.queue_name}.DQ.msgs") or len(runs) > 1,
                   timeout=10, what="the copy sent again for the lease's end")
        held.set()
        broker.join(once.queue_name, timeout=20_000)
        broker.join(f"{once.queue_name}.DQ", timeout=20_000)
        worker.join()
    finally:
        held.set()
        worker.stop(timeout=10_000)
    assert runs == [1]
    assert JobModel.get(JobModel.message_id == message.message_id).status == "succeeded"

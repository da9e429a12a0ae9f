"""send_many (dramatiq_unique.unique.bulk), on real Redis with SQLite and PostgreSQL."""

from __future__ import annotations

import collections
import threading
import time
from datetime import timedelta

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import DuplicateJob, InvalidOption, JobModel, send_many, transaction
from dramatiq_unique.broker.publish import Publisher
from dramatiq_unique.context import MARKER
from tests.conftest import REDIS_URL
from tests.durable import RedisServer, broker_messages, running_worker
from tests.helpers import job_of, queue_size, wait_until


def rows(actor_name: str) -> list[JobModel]:
    return list(JobModel.select().where(JobModel.actor_name == actor_name).order_by(JobModel.id))


class Runs:
    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.lock = threading.Lock()

    def add(self, key) -> None:
        with self.lock:
            self.counts[key] += 1


def test_every_item_form_is_one_job_and_a_worker_runs_each_once(suite, broker):
    runs = Runs()

    @dramatiq.actor(track=True)
    def add(a, b=0):
        runs.add((a, b))

    suite.settings.send_many_batch = 7  # 40 items: 6 batches
    items = [(i,) for i in range(10)] + [{"a": i, "b": 1} for i in range(10, 20)] + \
        [((i,), {"b": 2}) for i in range(20, 30)] + [[i] for i in range(30, 40)]
    messages = send_many(add, items)
    assert len(messages) == 40 and len({m.message_id for m in messages}) == 40
    assert [m.args for m in messages[:3]] == [(0,), (1,), (2,)] and messages[15].kwargs == {"a": 15, "b": 1}
    assert [r.message_id for r in rows("add")] == [m.message_id for m in messages], "rows in the items' order"
    assert {r.status for r in rows("add")} == {"queued"} and all(r.broker_ref for r in rows("add"))
    assert all(MARKER in m.options and "id" in m.options[MARKER] for m in messages)
    assert queue_size(broker) == 40
    assert send_many(add, []) == []
    with running_worker(broker, threads=4):
        wait_until(lambda: JobModel.select().where(JobModel.status == "succeeded").count() == 40, timeout=20)
    assert len(runs.counts) == 40 and set(runs.counts.values()) == {1}


def test_bad_items_send_nothing(suite, broker):
    @dramatiq.actor(track=True)
    def job(a):
        pass

    for bad in ([1, 2], [(1,), "x"], "abc", [({1: 2},)][0:0] + [{1: 2}]):
        with pytest.raises(InvalidOption):
            send_many(job, bad)
    with pytest.raises(InvalidOption):
        send_many(job, [(1,)], delay="soon")
    assert rows("job") == [] and queue_size(broker) == 0


def test_unique_skip_resolves_duplicates_in_the_batch_and_in_the_table(suite, broker):
    @dramatiq.actor(unique_args=["key"], unique_window=60_000)
    def report(key, who=None):
        pass

    existing = report.send(1, who="ann")
    messages = send_many(report, [(1, "bob"), (2, "cy"), (2, "dan"), {"key": 3}, (3,)])
    ids = [m.message_id for m in messages]
    assert ids[0] == existing.message_id and ids[2] == ids[1] and ids[4] == ids[3]
    assert len(set(ids)) == 3
    assert [r.unique_hold for r in rows("report")] == [r.unique_key for r in rows("report")]
    assert len(rows("report")) == 3 and queue_size(broker) == 3
    # the second batch of the same keys: all duplicates, nothing new
    again = send_many(report, [(3,), (2,), (1,)])
    assert [m.message_id for m in again] == [ids[3], ids[1], ids[0]]
    assert len(rows("report")) == 3 and queue_size(broker) == 3


def test_unique_raise_sends_the_items_before_the_duplicate(suite, broker):
    @dramatiq.actor(unique_args=["key"], unique_on_conflict="raise", unique_window=60_000)
    def report(key):
        pass

    existing = report.send(3)
    with pytest.raises(DuplicateJob) as error:
        send_many(report, [(1,), (2,), (3,), (4,)])
    assert error.value.job.message_id == existing.message_id
    assert len(rows("report")) == 3 and queue_size(broker) == 3, "1 and 2 were sent, 4 was not"
    with pytest.raises(DuplicateJob):
        send_many(report, [(5,), (5,)])


def test_unique_replace_gives_the_holder_the_last_arguments(suite, broker):
    @dramatiq.actor(unique_args=["key"], unique_on_conflict="replace", unique_window=60_000)
    def report(key, version=0):
        pass

    existing = report.send(1, 0)
    messages = send_many(report, [(1, 1), (2, 1), (2, 2), (3, 1)])
    ids = [m.message_id for m in messages]
    assert ids[0] == existing.message_id and ids[1] == ids[2] and len(set(ids)) == 3
    versions = {r.unique_key: (r.args, r.revision) for r in rows("report")}
    assert sorted(v[0][1] for v in versions.values()) == [1, 1, 2]
    assert len(rows("report")) == 3


def test_delay_sets_the_due_time_and_the_delay_queue(suite, broker):
    @dramatiq.actor(unique_args=["key"])
    def later(key):
        pass

    messages = send_many(later, [(1,), (2,)], delay=60_000)
    assert all(m.queue_name == "default.DQ" and m.options["eta"] for m in messages)
    for row in rows("later"):
        assert row.process_after - row.created_at >= timedelta(seconds=59)
    assert sorted(m["message_id"] for m in broker_messages(broker)) == sorted(m.message_id for m in messages)


def test_inside_transaction_commit_publishes_and_rollback_publishes_nothing(suite, broker):
    @dramatiq.actor(unique_args=["key"])
    def charge(key):
        pass

    with pytest.raises(RuntimeError):
        with transaction():
            send_many(charge, [(1,), (2,)])
            raise RuntimeError("no")
    assert rows("charge") == [] and broker_messages(broker) == []
    with transaction():
        messages = send_many(charge, [(1,), (2,), (2,)])
        assert {r.status for r in rows("charge")} == {"pending"} and broker_messages(broker) == []
    assert messages[1].message_id == messages[2].message_id
    assert {r.status for r in rows("charge")} == {"queued"}
    assert sorted(m["message_id"] for m in broker_messages(broker)) == sorted({m.message_id for m in messages})


def test_untracked_actors_are_plain_sends(suite, broker):
    @dramatiq.actor
    def plain(a):
        pass

    messages = send_many(plain, [(1,), (2,)])
    assert len(messages) == 2 and queue_size(broker) == 2 and rows("plain") == []


def fail_second_publish(monkeypatch) -> None:
    real, calls = Publisher.publish_many, []

    def publish_many(self, entries):
        calls.append(len(entries))
        if len(calls) == 2:
            raise redis.ConnectionError("down half-way")
        return real(self, entries)

    monkeypatch.setattr(Publisher, "publish_many", publish_many)


def test_a_publish_failing_half_way_is_deferred_then_redriven_once(suite, broker, monkeypatch):
    runs = Runs()

    @dramatiq.actor(unique_args=["key"], max_retries=0)
    def job(key):
        runs.add(key)

    suite.settings.send_many_batch = 10
    fail_second_publish(monkeypatch)
    messages = send_many(job, [(i,) for i in range(30)])
    statuses = [job_of(m).status for m in messages]
    # the third batch was written while the second was being published, and its publish worked
    assert statuses == ["queued"] * 10 + ["pending"] * 10 + ["queued"] * 10, "the failed batch waits pending"
    assert queue_size(broker) == 20
    assert dramatiq_unique.redrive().sent == 10
    with running_worker(broker, threads=4):
        wait_until(lambda: JobModel.select().where(JobModel.status == "succeeded").count() == 30, timeout=20)
    assert len(runs.counts) == 30 and set(runs.counts.values()) == {1}


def test_with_on_broker_down_raise_the_failed_batch_is_undone(suite, broker, monkeypatch):
    @dramatiq.actor(unique_args=["key"])
    def job(key):
        pass

    suite.settings.send_many_batch = 10
    suite.settings.on_broker_down = "raise"
    fail_second_publish(monkeypatch)
    with pytest.raises(redis.ConnectionError):
        send_many(job, [(i,) for i in range(30)])
    assert [r.unique_key is not None for r in rows("job")] == [True] * 10, "the first batch stays sent"
    assert queue_size(broker) == 10
    assert len(send_many(job, [(i,) for i in range(10, 20)])) == 10, "the undone keys are free"


def test_the_broker_server_stopped_then_back(sqlite_url, key_prefix):
    server = RedisServer().start()
    broker = RedisBroker(url=server.url, namespace=f"{key_prefix}-bulk")
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=sqlite_url, redis=server.url, key_prefix=key_prefix,
                                  redriver=False, send_many_batch=50)
    runs = Runs()

    @dramatiq.actor(unique_args=["key"], max_retries=0)
    def job(key):
        runs.add(key)

    try:
        send_many(job, [(i,) for i in range(50)])
        server.stop()
        messages = send_many(job, [(i,) for i in range(25, 150)])
        assert len({m.message_id for m in messages}) == 125
        assert JobModel.select().count() == 150
        server.start()
        assert dramatiq_unique.redrive().sent == 100
        with running_worker(broker, threads=4):
            wait_until(lambda: JobModel.select().where(JobModel.status == "succeeded").count() == 100, timeout=20)
        assert len(runs.counts) == 100 and set(runs.counts.values()) == {1}
    finally:
        broker.close()
        server.stop()
        suite.db.close()


def test_two_senders_of_the_same_keys_make_one_job_per_key(suite, broker):
    @dramatiq.actor(unique_args=["key"], unique_window=60_000)
    def job(key):
        pass

    suite.settings.send_many_batch = 100
    results: dict[int, list] = {}
    barrier = threading.Barrier(2)

    def send(n: int) -> None:
        barrier.wait()
        keys = list(range(n * 100, 1000 + n * 100))
        # the other sender goes the other way: the INSERT takes the keys in one order (no deadlock)
        results[n] = send_many(job, [(i,) for i in (keys if n == 0 else keys[::-1])])
        suite.close()

    threads = [threading.Thread(target=send, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert JobModel.select().count() == 1100 and queue_size(broker) == 1100
    held = {r.unique_key: r.message_id for r in rows("job")}
    for messages in results.values():
        assert len(messages) == 1000
        for m in messages:
            assert m.message_id == held[job_of(m).unique_key]


def test_ten_thousand_items(sqlite_url, broker, key_prefix):
    """Batches of 5000: more parameters than one SQLite statement takes, so each INSERT is split."""
    suite = dramatiq_unique.setup(broker, database=sqlite_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False,
                                  send_many_batch=5_000)

    @dramatiq.actor(unique_args=["key"])
    def job(key):
        pass

    try:
        messages = send_many(job, [(i % 7_000,) for i in range(10_000)])
        assert len(messages) == 10_000 and len({m.message_id for m in messages}) == 7_000
        assert JobModel.select().count() == 7_000 and queue_size(broker) == 7_000
    finally:
        suite.db.close()


def test_two_processes_sending_the_same_keys_make_one_job_per_key(suite, broker, database_url, key_prefix):
    import multiprocessing

    from tests.procs import send_many_burst

    @dramatiq.actor(actor_name="bulk", unique_args=["key"], unique_window=60_000)
    def bulk(key):
        pass

    start_at = time.time() + 3  # after both children have imported and set up
    keys = list(range(1_500))
    jobs = [(REDIS_URL, broker.namespace, database_url, key_prefix, start_at, order) for order in (keys, keys[::-1])]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map_async(send_many_burst, jobs).get(60)
    held = {r.unique_key: r.message_id for r in rows("bulk")}
    assert len(held) == 1_500 and queue_size(broker) == 1_500, "one job per key, published once"
    for result in results:
        by_key = dict(result)
        assert len(by_key) == 1_500
        for key, message_id in by_key.items():
            assert message_id in held.values(), key
    first, second = (dict(r) for r in results)
    assert first == second, "both senders resolve each key to the same job"


def test_inside_a_transaction_of_the_callers_own_the_rows_are_its(suite, broker):
    """In peewee's atomic() (not transaction()): the rows are written in the caller's transaction,
    as single sends' are, so a rollback takes them back (the messages went out: plain Dramatiq's way)."""

    @dramatiq.actor(track=True)
    def job(i):
        pass

    suite.settings.send_many_batch = 5
    with pytest.raises(RuntimeError):
        with suite.db.atomic():
            send_many(job, [(i,) for i in range(12)])
            assert len(rows("job")) == 12
            raise RuntimeError("rolled back")
    assert rows("job") == []


def test_execution_locks_and_slots_park_at_processing_as_for_single_sends(suite, broker):
    runs = Runs()
    running = {"n": 0, "peak": 0}

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", max_retries=0)
    def locked(key, n):
        runs.add(("locked", key, n))

    @dramatiq.actor(concurrency_limit=1, max_retries=0)
    def slotted(n):
        with runs.lock:
            running["n"] += 1
            running["peak"] = max(running["peak"], running["n"])
        time.sleep(0.01)
        with runs.lock:
            running["n"] -= 1
        runs.add(("slotted", n))

    send_many(locked, [(k, n) for n in range(3) for k in range(2)])  # no hold: 6 jobs, 3 per key
    send_many(slotted, [(n,) for n in range(6)])
    assert len(rows("locked")) == 6 and all(r.unique_hold is None and r.unique_key for r in rows("locked"))
    with running_worker(broker, threads=4):
        wait_until(lambda: JobModel.select().where(JobModel.status == "succeeded").count() == 12, timeout=20)
    assert len(runs.counts) == 12 and set(runs.counts.values()) == {1} and running["peak"] == 1

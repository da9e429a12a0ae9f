"""Execution locks (dramatiq_unique.context), on real Redis with SQLite and PostgreSQL."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import defaultdict

import dramatiq
import pytest

import dramatiq_unique
from dramatiq_unique import JobModel, current_job
from dramatiq_unique.parking import lot
from tests.conftest import REDIS_URL
from tests.durable import free_port
from tests.exec_app import WorkerProcess, declare, read_log
from tests.helpers import current_token, wait_until


class Recorder:
    """Start and end times (perf_counter) and tokens of jobs, by key, from any worker thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple] = []

    def start(self, key, i) -> None:
        with self.lock:
            self.events.append(("start", key, i, time.perf_counter(), current_job().fencing_token))

    def end(self, key, i) -> None:
        with self.lock:
            self.events.append(("end", key, i, time.perf_counter(), current_job().fencing_token))

    def count(self, event: str) -> int:
        with self.lock:
            return sum(1 for e in self.events if e[0] == event)

    def intervals(self) -> dict:
        """{key: [(start, end, i, token)]} in start order."""
        starts, ends = {}, {}
        with self.lock:
            for event, key, i, at, token in self.events:
                (starts if event == "start" else ends)[(key, i)] = (at, token)
        by_key = defaultdict(list)
        for (key, i), (at, token) in starts.items():
            by_key[key].append((at, ends.get((key, i), (float("inf"),))[0], i, token))
        return {key: sorted(spans) for key, spans in by_key.items()}


def assert_no_overlap(spans) -> None:
    for (_, e1, i1, _), (s2, _, i2, _) in zip(spans, spans[1:], strict=False):
        assert s2 >= e1, f"job {i2} started {1000 * (e1 - s2):.1f} ms before job {i1} ended"


def rows(actor_name: str) -> list:
    return list(JobModel.select().where(JobModel.actor_name == actor_name).order_by(JobModel.id))


def statuses(actor_name: str) -> list[str]:
    return [str(r.status) for r in rows(actor_name)]


def test_a_job_waits_while_another_of_its_key_runs(suite, broker, worker):
    """Given a running while_executing job of key a, then two more a's sent
    meanwhile run one at a time after it, in the order sent, while a job of
    key b runs beside them."""
    rec = Recorder()

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing")
    def step(key, i):
        rec.start(key, i)
        time.sleep(0.15)
        rec.end(key, i)

    step.send("a", 0)
    wait_until(lambda: rec.count("start") == 1, timeout=10)
    for i in (1, 2):
        step.send("a", i)
    step.send("b", 0)
    wait_until(lambda: rec.count("end") == 4, timeout=15)
    # The outcome is written after the actor returns: wait for the rows too.
    wait_until(lambda: statuses("step") == ["succeeded"] * 4, timeout=10)
    spans = rec.intervals()
    assert_no_overlap(spans["a"])
    assert [i for _, _, i, _ in spans["a"]] == [0, 1, 2]
    b_start, b_end, _, _ = spans["b"][0]
    assert b_start < spans["a"][0][1] and b_end > spans["a"][0][0], "another key is not held up"


def test_until_and_while_executing_hands_the_queue_lock_to_the_execution_lock(suite, broker, worker):
    """Given a running until_and_while_executing job, then one identical job may
    wait (a second send is accepted, a third is skipped), and the waiting one
    starts only after the running one finished."""
    rec = Recorder()
    go = threading.Event()

    @dramatiq.actor(unique_args=["key"])
    def build(key, n):
        rec.start(key, n)
        if n == 1:
            assert go.wait(10)
        rec.end(key, n)

    first = build.send("k", 1)
    wait_until(lambda: dramatiq_unique.get_job(first.message_id).status == "running", timeout=10)
    second = build.send("k", 2)
    assert second.message_id != first.message_id, "the queue lock was handed over at start"
    third = build.send("k", 3)
    assert third.message_id == second.message_id, "one job of the key may wait"
    waiting = wait_until(
        lambda: (j := dramatiq_unique.get_job(second.message_id)).parked_on and j, timeout=10, what="parked"
    )
    assert waiting.status == "pending" and waiting.attempts == 0
    assert rec.count("start") == 1
    go.set()
    # The outcome is written after the actor returns: wait for the rows, not the recorder.
    wait_until(lambda: statuses("build") == ["succeeded", "succeeded"], timeout=10)
    spans = rec.intervals()["k"]
    assert_no_overlap(spans)
    assert [i for _, _, i, _ in spans] == [1, 2]


def test_parked_jobs_hold_no_thread_burn_no_retry_and_run_in_order(suite, broker):
    """Given two worker threads and a running job, then six more jobs of its key
    park (pending, no attempt, no retry), a job of another key still runs at
    once, and the six run in the order they were sent."""
    rec = Recorder()
    go = threading.Event()

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", max_retries=3)
    def sync(key, i):
        rec.start(key, i)
        if (key, i) == ("k", 0):
            assert go.wait(10)
        rec.end(key, i)

    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
    worker.start()
    try:
        sync.send("k", 0)
        wait_until(lambda: rec.count("start") == 1, timeout=10)
        for i in range(1, 7):
            sync.send("k", i)
        wait_until(lambda: sum(1 for r in rows("sync") if r.parked_on) == 6, timeout=10, what="six parked")
        for row in rows("sync")[1:]:
            assert (row.status, row.attempts, row.parked_on) == ("pending", 0, f"lock:{row.unique_key}")
            assert "retries" not in row.options
        sync.send("other", 0)
        wait_until(lambda: "other" in rec.intervals() and rec.intervals()["other"][0][1] < float("inf"), timeout=5)
        assert rec.count("end") == 1, "the key's holder still runs"
        go.set()
        wait_until(lambda: rec.count("end") == 8, timeout=15)
    finally:
        worker.stop(timeout=10_000)
    spans = rec.intervals()["k"]
    assert_no_overlap(spans)
    assert [i for _, _, i, _ in spans] == list(range(7))
    assert [t for *_, t in spans] == sorted(t for *_, t in spans)
    assert all(r.parked_on is None and r.attempts == 1 for r in rows("sync"))


def test_process_after_order_serves_the_first_ready(suite, broker, worker):
    """Given unique_order_by="process_after", a job sent first but due later
    runs after a job sent later but due at once; created_at order does the reverse."""
    rec = Recorder()
    go = threading.Event()

    for order in ("process_after", "created_at"):

        @dramatiq.actor(actor_name=f"order_{order}", unique_args=["key"], unique_lock="while_executing",
                        unique_order_by=order)
        def ordered(key, i):
            rec.start(key, i)
            if i == 0:
                assert go.wait(10)
            rec.end(key, i)

        go.clear()
        ordered.send(order, 0)
        wait_until(lambda: rec.count("start") % 3 == 1, timeout=10)
        late = ordered.send_with_options(args=(order, 1), delay=300)  # sent first, due later
        ordered.send(order, 2)
        wait_until(lambda late=late: dramatiq_unique.get_job(late.message_id).parked_on, timeout=10,
                   what="due and parked")
        wait_until(lambda order=order: sum(1 for r in rows(f"order_{order}") if r.parked_on) == 2, timeout=10)
        go.set()
        wait_until(lambda: rec.count("end") % 3 == 0 and rec.count("end") > 0, timeout=10)
        wait_until(lambda order=order: len(rec.intervals().get(order, [])) == 3, timeout=10)
    assert [i for *_, i, _ in rec.intervals()["process_after"]] == [0, 2, 1]
    assert [i for *_, i, _ in rec.intervals()["created_at"]] == [0, 1, 2]


def test_no_overlap_under_eight_threads(suite, broker):
    """Given 3 keys x 12 short jobs on 8 threads, then no two jobs of a key
    overlap, all succeed, and each key's tokens grow in the order its jobs ran."""
    rec = Recorder()

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing")
    def burst(key, i):
        rec.start(key, i)
        time.sleep(0.005)
        rec.end(key, i)

    lot.of(suite).wake_interval = 60_000  # a stranded waiter would show as a timeout
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=8)
    worker.start()
    try:
        for i in range(12):
            for key in "xyz":
                burst.send(key, i)
        wait_until(lambda: rec.count("end") == 36, timeout=30, what="36 jobs")
    finally:
        worker.stop(timeout=10_000)
    for key, spans in rec.intervals().items():
        assert len(spans) == 12
        assert_no_overlap(spans)
        tokens = [t for *_, t in spans]
        assert tokens == sorted(tokens) and len(set(tokens)) == 12, key
    assert set(statuses("burst")) == {"succeeded"}


def test_no_overlap_across_two_worker_processes(suite, broker, database_url, key_prefix, redis_client):
    """Given a dramatiq worker subprocess running a long job of key a and an
    in-process worker that alone consumes a "side" queue, then:
    a job of key a that the in-process worker receives waits and runs after
    the subprocess's job (the lock is handed across processes), a later one
    runs in the in-process worker, and 3 keys x 6 jobs shared by both
    processes never overlap within a key."""
    proc = WorkerProcess(redis_url=REDIS_URL, namespace=broker.namespace, database_url=database_url,
                         key_prefix=key_prefix, ttl=10_000)
    worker = None

    def side(*args, **kwargs) -> None:  # only this process consumes "side"
        broker.enqueue(job.message(*args, **kwargs).copy(queue_name="side"))

    def ended(key, i) -> bool:
        return any(e[:3] == ["end", key, i] for e in read_log(redis_client, key_prefix))

    try:
        job = declare(REDIS_URL, key_prefix, ttl=10_000)
        job.send("a", 0, run_ms=600)
        wait_until(lambda: read_log(redis_client, key_prefix), timeout=30, what="the subprocess's job")
        broker.declare_queue("side")
        worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=4)
        worker.start()
        side("a", 1, run_ms=10)
        for i in range(6):
            for key in "bcd":
                job.send(key, i, run_ms=10)
        wait_until(lambda: ended("a", 1), timeout=30, what="a1")
        side("a", 2, run_ms=10)
        wait_until(lambda: sum(e[0] == "end" for e in read_log(redis_client, key_prefix)) == 21, timeout=30)
    finally:
        if worker is not None:
            worker.stop(timeout=10_000)
        stderr = proc.stop()
    by_key = defaultdict(dict)
    for event, key, i, at, pid, token in read_log(redis_client, key_prefix):
        by_key[key].setdefault(i, {})[event] = (at, pid, token)
    for jobs in by_key.values():
        spans = sorted((j["start"][0], j["end"][0], i, j["start"][2]) for i, j in jobs.items())
        assert_no_overlap(spans)
        assert [t for *_, t in spans] == sorted(t for *_, t in spans)
    a = by_key["a"]
    here = os.getpid()
    assert a[0]["start"][1] != here and a[1]["start"][1] == here == a[2]["start"][1], stderr[-2000:]
    assert a[1]["start"][0] >= a[0]["end"][0], "a1 waited for a0, across processes"
    assert set(statuses("exec_job")) == {"succeeded"}


def test_the_next_job_starts_at_once_not_after_a_poll(suite, broker):
    """Given an idle consumer that polls once a second (Dramatiq's default
    worker_timeout), then the next waiting job starts within milliseconds of
    the previous one finishing: the releasing worker runs it."""
    rec = Recorder()

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing")
    def chain(key, i):
        rec.start(key, i)
        time.sleep(0.02)
        rec.end(key, i)

    for i in range(8):  # all waiting before the worker starts: a job sent after its predecessor
        chain.send("k", i)  # ended would wait for the consumer's poll, which is not a hand-over
    worker = dramatiq.Worker(broker, worker_timeout=1000, worker_threads=4)
    worker.start()
    try:
        wait_until(lambda: rec.count("end") == 8, timeout=20)
    finally:
        worker.stop(timeout=10_000)
    spans = rec.intervals()["k"]
    assert_no_overlap(spans)
    gaps = [1000 * (s2 - e1) for (_, e1, _, _), (s2, _, _, _) in zip(spans, spans[1:], strict=False)]
    assert statistics.median(gaps) < 50 and max(gaps) < 250, f"handoff gaps {gaps} ms"


def test_fencing_tokens_grow_across_all_executions_and_survive_a_redis_flush(
    suite, broker, worker, redis_client, key_prefix
):
    """Given jobs of one key run one after another, with the suite's Redis keys
    deleted in between, then each execution's token is larger than the last."""
    tokens = []

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing")
    def fenced(key):
        tokens.append(current_job().fencing_token)

    for _round in range(2):
        for _ in range(3):
            message = fenced.send("k")
            wait_until(lambda message=message: dramatiq_unique.get_job(message.message_id).status == "succeeded",
                       timeout=10)
        for name in redis_client.scan_iter(match=f"*{key_prefix}:*"):  # Redis "flushed"
            redis_client.delete(name)
    assert tokens == sorted(tokens) and len(set(tokens)) == 6 and tokens[0] >= 1
    assert [r.fencing_token for r in rows("fenced")] == tokens
    assert current_token(suite.db, rows("fenced")[0].unique_key) == tokens[-1]


def test_a_zombie_whose_lease_ran_out_records_nothing_over_the_newer_job(suite, broker, worker):
    """Given a job that outlives its 300 ms lease without heartbeat() and a
    newer job of the key that took the lock, then the newer job's outcome is
    recorded and stands; the zombie's own row, which no newer attempt of its
    job owns, gets the zombie's outcome, noted (a job that
    finished is never left for the re-drive to call lost)."""
    go = threading.Event()
    ran = []

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", unique_ttl=300, max_retries=0)
    def slow(key, n):
        ran.append((n, current_job().fencing_token))
        if n == 1:
            assert go.wait(10)
        return n

    zombie = slow.send("k", 1)
    wait_until(lambda: ran, timeout=10)
    time.sleep(0.4)  # the lease runs out
    newer = slow.send("k", 2)
    wait_until(lambda: dramatiq_unique.get_job(newer.message_id).status == "succeeded", timeout=10)
    go.set()
    wait_until(lambda: dramatiq_unique.get_job(zombie.message_id).status != "running", timeout=10)
    old = dramatiq_unique.get_job(zombie.message_id)
    new = dramatiq_unique.get_job(newer.message_id)
    assert ran[0][1] < ran[1][1] == new.fencing_token
    assert old.status == "succeeded" and old.result == 1 and old.last_error.startswith("LockLost")
    assert old.fencing_token > ran[0][1], "its row no longer carries the zombie's token"
    assert (new.status, new.result, new.last_error) == ("succeeded", 2, None)


def test_redis_unreachable_means_no_unlocked_run(broker, database_url, key_prefix):
    """Given a suite whose Redis does not answer, then a while_executing job
    does not run: its message fails with RedisUnavailable and Retries sends
    it again later."""
    dead = free_port()  # a port nobody listens on
    suite = dramatiq_unique.setup(broker, database=database_url, redis=f"redis://127.0.0.1:{dead}/0",
                                  key_prefix=key_prefix, redriver=False, check_redis=False)
    ran = []

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", min_backoff=60_000, max_backoff=60_000)
    def guarded(key):
        ran.append(key)

    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
    worker.start()
    try:
        message = guarded.send("k")
        delayed = f"{broker.namespace}:default.DQ.msgs"
        wait_until(lambda: broker.client.hlen(delayed) == 1, timeout=15, what="the retry in the delay queue")
        time.sleep(0.2)
    finally:
        worker.stop(timeout=10_000)
        suite.db.close()
    assert ran == []
    row = dramatiq_unique.get_job(message.message_id)
    assert row.status not in ("running", "succeeded") and row.attempts == 0
    retry = dramatiq.Message.decode(next(iter(broker.client.hvals(delayed))))
    assert retry.options["retries"] == 1 and "RedisUnavailable" in retry.options["traceback"]


@pytest.mark.slow
def test_a_sigkilled_holder_frees_its_lock_after_the_ttl(suite, broker, database_url, key_prefix, redis_client):
    """Given a real dramatiq worker process holding a key's lock (and heartbeating)
    that is SIGKILLed, then the next job of the key, parked meanwhile, runs
    about one unique_ttl after the kill, with a larger fencing token."""
    ttl = 2000
    proc = WorkerProcess(redis_url=REDIS_URL, namespace=broker.namespace, database_url=database_url,
                         key_prefix=key_prefix, ttl=ttl)
    worker = None
    try:
        job = declare(REDIS_URL, key_prefix, ttl=ttl)
        job.send("k", 1, run_ms=60_000, beat_ms=200)
        started = wait_until(lambda: [e for e in read_log(redis_client, key_prefix) if e[0] == "start"],
                             timeout=30, what="the holder to start")[0]
        pid, holder_token = started[4], started[5]
        time.sleep(0.5)  # a few heartbeats: the lease is the holder's, renewed
        worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=2)
        worker.start()
        lot.of(suite).wake_interval = 200
        job.send("k", 2, run_ms=1)
        wait_until(lambda: sum(1 for r in rows("exec_job") if r.parked_on) == 1, timeout=10, what="parked")
        # Parked by the holder's own process and killed before its flag, the job would be the
        # re-drive's (off here): kill once the key is flagged.
        flags = lot.of(suite).wakeups.key
        wait_until(lambda: redis_client.zcard(flags) == 1, timeout=10, what="the key flagged")
        proc.kill_child(pid)
        killed_at = time.time()
        nxt = wait_until(lambda: [e for e in read_log(redis_client, key_prefix) if e[0] == "start" and e[2] == 2],
                         timeout=15, what="the next job")[0]
    finally:
        if worker is not None:
            worker.stop(timeout=10_000)
        proc.stop()
    waited = nxt[3] - killed_at
    assert nxt[4] != pid and nxt[5] > holder_token
    # The last heartbeat was at most 200 ms before the kill; the watchdog looks every 200 ms.
    assert ttl / 1000 - 0.3 <= waited <= ttl / 1000 + 1.2, f"the next job started {waited:.2f}s after the kill"

"""Concurrency slots against Dramatiq's ConcurrentRateLimiter on a skewed load.

    python tests/benchmarks/bench_slots.py [--rounds 5] [--threads 16] [--job-ms 20]

The load: one hot key with 200 jobs and 9 keys with 20 jobs
each, at most 2 jobs per key at once, 16 worker threads, 20 ms jobs,
all sent (shuffled, fixed seed) before the worker starts.  The ideal
makespan is the hot key's: 200 jobs x 20 ms / 2 slots = 2.0 s.

* ``slots``: ``concurrency_limit=2, concurrency_key=["key"]``; jobs over
  the limit are parked and handed a slot as one frees.  Run with the job
  table on SQLite and on PostgreSQL (a fresh schema, dropped afterwards).
* ``ConcurrentRateLimiter``: Dramatiq's documented pattern, ``with
  mutex.acquire(raise_on_failure=True)`` inside the actor; a job that
  finds the key full raises ``RateLimitExceeded`` and Retries sends it
  again after a back-off.  Untracked, on plain Dramatiq, unlimited
  retries (the default 20 would fail jobs of the hot key).  Back-off
  ``min_backoff=20`` ms (one job) to ``max_backoff=500`` ms: short, to give
  the limiter a fair chance (Dramatiq's default back-off, from 15 s up, would
  stretch the run to minutes); and, to show the trade-off, an aggressive
  5 to 100 ms, which polls Redis more and wastes more attempts for a
  shorter makespan.

* ``floor``: for reference, plain Dramatiq running only the hot key's 200
  jobs on exactly 2 threads (no limiter needed, no other key): what
  Dramatiq's own per-message cost leaves of the ideal.

Every variant runs in the same process against the same Redis, one
after the other, ``--rounds`` times; the median round is printed.  Each
run warms its worker up first (64 small jobs, so every thread has its
connections), pauses it, sends the load and resumes it.  The makespan is
from the first job's start to the last job's end, as a ratio to the
ideal; wasted attempts are actor calls beyond one per job.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
import uuid
from typing import Callable, Optional

import dramatiq
import redis
from common import REDIS_URL, pg_database
from dramatiq.brokers.redis import RedisBroker
from dramatiq.rate_limits import ConcurrentRateLimiter
from dramatiq.rate_limits.backends import RedisBackend

import dramatiq_unique

HOT_JOBS, COLD_KEYS, COLD_JOBS, LIMIT = 200, 9, 20, 2
#: Retries' back-off for the ConcurrentRateLimiter (ms): the chosen setting, and an aggressive one.
BACKOFFS = [(20, 500), (5, 100)]


def load(seed: int = 0) -> list[tuple[str, int]]:
    jobs = [("hot", i) for i in range(HOT_JOBS)]
    jobs += [(f"cold{k}", i) for k in range(COLD_KEYS) for i in range(COLD_JOBS)]
    random.Random(seed).shuffle(jobs)
    return jobs


class Tally:
    """Actor calls, concurrency per key (to check the limit held) and the last end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.calls = 0
            self.done = 0
            self.running: dict[str, int] = {}
            self.peak: dict[str, int] = {}
            self.first_start = float("inf")
            self.last_end = 0.0
            self.sent_at: object = None

    def call(self) -> None:
        with self.lock:
            self.calls += 1

    def run(self, key: str, job_ms: int) -> None:
        with self.lock:
            self.first_start = min(self.first_start, time.perf_counter())
            self.running[key] = self.running.get(key, 0) + 1
            self.peak[key] = max(self.peak.get(key, 0), self.running[key])
        time.sleep(job_ms / 1000)
        with self.lock:
            self.running[key] -= 1
            self.done += 1
            self.last_end = time.perf_counter()


def drive(broker: RedisBroker, actor: dramatiq.Actor, tally: Tally, threads: int, jobs: Optional[list] = None) -> float:
    """Warm the worker up, send the load while it is paused, run it until every job is done;
    the makespan in seconds: from the first job's start to the last job's end."""
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=100)
    worker.start()
    try:
        # Warm-up (not measured): every thread opens its connections, scripts get loaded.
        for i in range(4 * threads):
            actor.send(f"warm{i % 8}", i)
        _wait(lambda: tally.done >= 4 * threads, "the warm-up")
        worker.pause()
        tally.reset()
        tally.sent_at = dramatiq_unique.storage.models.utcnow()
        jobs = load() if jobs is None else jobs
        for key, i in jobs:
            actor.send(key, i)
        worker.resume()
        _wait(lambda: tally.done >= len(jobs), "the load")
    finally:
        worker.stop()
    if max(tally.peak.values()) > LIMIT:
        raise RuntimeError(f"the limit was exceeded: {tally.peak}")
    return tally.last_end - tally.first_start


def _wait(done: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not finish in {timeout} s")
        time.sleep(0.005)


def run_slots(database: str, threads: int, job_ms: int) -> tuple[float, float]:
    ns = f"bench-slots-{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=REDIS_URL, namespace=ns)
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=database, redis=REDIS_URL, key_prefix=ns, redriver=False)
    tally = Tally()

    @dramatiq.actor(concurrency_limit=LIMIT, concurrency_key=["key"], max_retries=0)
    def limited(key: str, i: int) -> None:
        tally.call()
        tally.run(key, job_ms)

    try:
        makespan = drive(broker, limited, tally, threads)
        model = dramatiq_unique.JobModel
        load_rows = model.select().where(model.created_at >= tally.sent_at)
        attempts = sum(row.attempts for row in load_rows)
        jobs = load_rows.count()
        assert jobs == len(load()) and attempts == tally.calls, (jobs, attempts, tally.calls)
        return makespan, (tally.calls - jobs) / jobs
    finally:
        broker.flush_all()
        _drop_keys(ns)
        suite.db.close()
        broker.close()


def run_rate_limiter(threads: int, job_ms: int, min_backoff: int, max_backoff: int) -> tuple[float, float]:
    ns = f"bench-crl-{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=REDIS_URL, namespace=ns)
    dramatiq.set_broker(broker)
    backend = RedisBackend(client=redis.Redis.from_url(REDIS_URL))
    tally = Tally()

    @dramatiq.actor(max_retries=None, min_backoff=min_backoff, max_backoff=max_backoff)
    def limited(key: str, i: int) -> None:
        tally.call()
        mutex = ConcurrentRateLimiter(backend, f"{ns}:{key}", limit=LIMIT)
        with mutex.acquire(raise_on_failure=True):
            tally.run(key, job_ms)

    try:
        makespan = drive(broker, limited, tally, threads)
        jobs = HOT_JOBS + COLD_KEYS * COLD_JOBS
        return makespan, (tally.calls - jobs) / jobs
    finally:
        broker.flush_all()
        _drop_keys(ns)
        broker.close()


def run_floor(job_ms: int) -> tuple[float, float]:
    """The reference: plain Dramatiq running only the hot key's jobs on exactly 2 threads
    (a limit no limiter needs to enforce): the makespan Dramatiq itself gets closest to the ideal."""
    ns = f"bench-floor-{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=REDIS_URL, namespace=ns)
    dramatiq.set_broker(broker)
    tally = Tally()

    @dramatiq.actor(max_retries=0)
    def hot_only(key: str, i: int) -> None:
        tally.call()
        tally.run(key, job_ms)

    try:
        return drive(broker, hot_only, tally, LIMIT, [("hot", i) for i in range(HOT_JOBS)]), 0.0
    finally:
        broker.flush_all()
        _drop_keys(ns)
        broker.close()


def _drop_keys(prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    for pattern in (f"{prefix}*", f"redlock:{prefix}*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--job-ms", type=int, default=20)
    args = parser.parse_args()
    ideal = HOT_JOBS * args.job_ms / 1000 / LIMIT
    print(f"load: hot key {HOT_JOBS} jobs, {COLD_KEYS} keys x {COLD_JOBS} jobs, limit {LIMIT}, "
          f"{args.threads} threads, {args.job_ms} ms jobs; ideal makespan {ideal:.2f} s; "
          f"median of {args.rounds} rounds")
    results: dict[str, list[tuple[float, float]]] = {}
    tmp = tempfile.mkdtemp()
    for r in range(args.rounds):
        results.setdefault("slots, SQLite", []).append(
            run_slots(f"sqlite:///{tmp}/jobs-{r}.db", args.threads, args.job_ms))
        with pg_database() as url:
            results.setdefault("slots, PostgreSQL", []).append(run_slots(url, args.threads, args.job_ms))
        for low, high in BACKOFFS:
            results.setdefault(f"CRL, back-off {low}-{high} ms", []).append(
                run_rate_limiter(args.threads, args.job_ms, low, high))
        results.setdefault("floor: hot key alone", []).append(run_floor(args.job_ms))
    print(f"{'variant':<26} {'makespan':>9} {'x ideal':>8} {'wasted attempts/job':>20}  (rounds: x ideal)")
    for name, runs in results.items():
        makespan = statistics.median(m for m, _ in runs)
        wasted = statistics.median(w for _, w in runs)
        each = ", ".join(f"{m / ideal:.2f}" for m, _ in runs)
        print(f"{name:<26} {makespan:>8.2f}s {makespan / ideal:>8.2f} {wasted:>20.2f}  ({each})")


if __name__ == "__main__":
    main()

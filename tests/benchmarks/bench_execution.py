"""Execution locks: throughput on many distinct keys as ratios to plain Dramatiq, and hand-off latency.

    python tests/benchmarks/bench_execution.py [--jobs 2000] [--threads 8] [--chain 200] [--repeat 2]

Runs on the Redis broker with the job table on SQLite and on PostgreSQL
(a fresh schema, dropped afterwards), all in one run.

* throughput: n no-op jobs of n distinct keys, queued first, then run by
  one worker; plain, tracked, ``while_executing`` and
  ``until_and_while_executing`` actors, as jobs/s and ratios to plain;
* hand-off latency: a chain of jobs of one key, all sent at once, so
  each but the first parks and is woken by the one before; the gap from
  one job's end to the next one's start, measured inside the actor.  A
  busy chain (200 jobs of 2 ms: the consumer keeps fetching) and an idle
  consumer (8 jobs of 400 ms: nothing to fetch while a job runs, so its
  poll backs off towards ``worker_timeout``, 1 s as ``dramatiq`` runs
  it).  Each is repeated with the local hand-off off (the woken job goes
  through the broker queue) to show what the local hand-off saves.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import dramatiq
from common import on_each_database, rig

from dramatiq_unique.parking import lot

KINDS = ("plain", "tracked", "while_executing", "until_and_while_executing")


class Run:
    """One broker + suite + the benchmark's actors under a fresh namespace."""

    def __init__(self, database: str) -> None:
        self.ns, self.broker, self.suite = rig(database)
        self.done = 0
        self.lock = threading.Lock()
        self.spans: list[tuple[float, float]] = []

        def finish() -> None:
            with self.lock:
                self.done += 1

        @dramatiq.actor(queue_name="plain")
        def plain(i):
            finish()

        @dramatiq.actor(queue_name="tracked", track=True)
        def tracked(i):
            finish()

        @dramatiq.actor(queue_name="while_executing", unique_args=["i"], unique_lock="while_executing")
        def while_executing(i):
            finish()

        @dramatiq.actor(queue_name="until_and_while_executing", unique_args=["i"])
        def until_and_while_executing(i):
            finish()

        @dramatiq.actor(queue_name="chain", unique_args=["key"], unique_lock="while_executing")
        def chain(key, i, run_ms):
            start = time.perf_counter()
            time.sleep(run_ms / 1000)
            with self.lock:
                self.spans.append((start, time.perf_counter()))

        self.actors = {name: actor for name, actor in locals().items() if isinstance(actor, dramatiq.Actor)}

    def throughput(self, kind: str, n: int, threads: int) -> float:
        """Jobs per second for a worker to run n queued messages of ``kind`` (distinct keys)."""
        actor = self.actors[kind]
        for i in range(n):
            actor.send(i)
        self.suite.close()
        worker = dramatiq.Worker(self.broker, queues={kind}, worker_timeout=20, worker_threads=threads)
        start = time.perf_counter()
        worker.start()
        deadline = start + 300
        while self.done < n and time.perf_counter() < deadline:
            time.sleep(0.005)
        elapsed = time.perf_counter() - start
        worker.stop()
        if self.done < n:
            raise SystemExit(f"{kind}: only {self.done}/{n} jobs ran")
        return n / elapsed

    def handoff(self, n: int, run_ms: int, threads: int, local: bool) -> tuple[list[float], float]:
        """Gaps (ms) between one job of a key ending and the next one starting, and jobs/s of the chain."""
        lot.of(self.suite).delivery.local = local
        for i in range(n):
            self.actors["chain"].send("k", i, run_ms)
        self.suite.close()
        worker = dramatiq.Worker(self.broker, queues={"chain"}, worker_timeout=1000, worker_threads=threads)
        worker.start()
        deadline = time.perf_counter() + 300
        while len(self.spans) < n and time.perf_counter() < deadline:
            time.sleep(0.01)
        worker.stop()
        if len(self.spans) < n:
            raise SystemExit(f"handoff: only {len(self.spans)}/{n} jobs ran")
        spans = sorted(self.spans)
        for (_, e1), (s2, _) in zip(spans, spans[1:], strict=False):
            assert s2 >= e1, "two jobs of one key overlapped"
        gaps = [1000 * (s2 - e1) for (_, e1), (s2, _) in zip(spans, spans[1:], strict=False)]
        return gaps, (n - 1) / (spans[-1][1] - spans[0][1])

    def close(self) -> None:
        self.broker.flush_all()
        keys = list(self.broker.client.scan_iter(match=f"*{self.ns}*", count=1000))
        if keys:
            self.broker.client.delete(*keys)
        self.suite.db.close()
        self.broker.close()


def fresh(database: str, work):
    # A fresh broker each time: a stopped worker leaves its middleware behind.
    run = Run(database)
    try:
        return work(run)
    finally:
        run.close()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def bench(label: str, database: str, args: argparse.Namespace) -> None:
    n = args.jobs
    rates = {
        kind: max(
            fresh(database, lambda run, kind=kind: run.throughput(kind, n, args.threads)) for _ in range(args.repeat)
        )
        for kind in KINDS
    }
    print(f"\n== {label}: {n} no-op jobs of {n} distinct keys, {args.threads} worker threads, Redis broker")
    print(f"{'actor':<28}{'jobs/s':>8}{'ratio to plain':>16}")
    for kind in KINDS:
        print(f"{kind:<28}{rates[kind]:>8.0f}{rates[kind] / rates['plain']:>16.2f}")
    for n_chain, run_ms, what in ((args.chain, 2, "a busy chain"), (args.idle_chain, 400, "an idle consumer")):
        print(f"\n{label}: hand-off latency, {what}: {n_chain} jobs of one key ({run_ms} ms each), "
              f"worker_timeout 1000 ms")
        print(f"{'delivery':<26}{'p50 ms':>8}{'p95 ms':>8}{'p99 ms':>8}{'max ms':>8}{'jobs/s':>8}")
        for local in (True, False):
            def handoff(run, n_chain=n_chain, run_ms=run_ms, local=local):
                return run.handoff(n_chain, run_ms, args.threads, local)

            gaps, rate = fresh(database, handoff)
            name = "local hand-off (default)" if local else "through the broker queue"
            print(f"{name:<26}{statistics.median(gaps):>8.1f}{percentile(gaps, 95):>8.1f}"
                  f"{percentile(gaps, 99):>8.1f}{max(gaps):>8.1f}{rate:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--chain", type=int, default=200)
    parser.add_argument("--idle-chain", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores")
    on_each_database(lambda label, url: bench(label, url, args), args.only)


if __name__ == "__main__":
    main()

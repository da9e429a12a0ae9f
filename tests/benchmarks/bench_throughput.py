"""Throughput of plain, tracked and unique no-op jobs, as ratios to plain Dramatiq.

    python tests/benchmarks/bench_throughput.py [--jobs 2000] [--threads 8] [--producers 4]

Runs on the Redis broker with the job table on SQLite and on PostgreSQL
(a fresh schema, dropped afterwards), all in one run, so the ratios
compare like with like on the same machine at the same moment.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import dramatiq
from common import on_each_database, rig


class Run:
    """One broker + suite + three actors under a fresh namespace."""

    def __init__(self, database: str) -> None:
        self.ns, self.broker, self.suite = rig(database)
        self.done = 0
        self.sent = 0
        self.lock = threading.Lock()

        def finish() -> None:
            with self.lock:
                self.done += 1

        @dramatiq.actor(queue_name="plain")
        def plain(i):
            finish()

        @dramatiq.actor(queue_name="tracked", track=True)
        def tracked(i):
            finish()

        @dramatiq.actor(queue_name="unique", unique_args=["i"], unique_lock="until_executing")
        def unique(i):
            finish()

        self.actors = {"plain": plain, "tracked": tracked, "unique": unique}

    def enqueue(self, kind: str, n: int, producers: int) -> float:
        """Seconds to send n new (distinct) messages from ``producers`` threads."""
        actor = self.actors[kind]
        per = n // producers
        offset, self.sent = self.sent, self.sent + n

        def produce(p: int) -> None:
            for i in range(per):
                actor.send(offset + p * per + i)
            self.suite.close()

        threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start

    def process(self, kind: str, n: int, threads: int) -> float:
        """Seconds for a warmed-up worker to run n messages of ``kind`` queued while it was paused.

        The warm-up (4 jobs per thread, not timed) lets every thread open its
        connections first, so the figure is the steady state, not the start-up.
        """
        worker = dramatiq.Worker(self.broker, queues={kind}, worker_timeout=20, worker_threads=threads)
        worker.start()
        try:
            self.done = 0
            self.enqueue(kind, 4 * threads, 1)
            self._wait(4 * threads, kind)
            worker.pause()
            self.enqueue(kind, n, 1)
            self.done = 0
            start = time.perf_counter()
            worker.resume()
            self._wait(n, kind)
            return time.perf_counter() - start
        finally:
            worker.stop()

    def _wait(self, n: int, kind: str) -> None:
        deadline = time.perf_counter() + 300
        while self.done < n and time.perf_counter() < deadline:
            time.sleep(0.005)
        if self.done < n:
            raise SystemExit(f"{kind}: only {self.done}/{n} jobs ran")

    def skip_cost(self, n: int) -> tuple[float, float]:
        """Seconds per plain send vs per skipped duplicate send."""
        plain, unique = self.actors["plain"], self.actors["unique"]
        unique.send(-1)
        start = time.perf_counter()
        for _ in range(n):
            unique.send(-1)
        skipped = (time.perf_counter() - start) / n
        start = time.perf_counter()
        for i in range(n):
            plain.send(i)
        sent = (time.perf_counter() - start) / n
        return sent, skipped

    def close(self) -> None:
        self.broker.flush_all()
        keys = list(self.broker.client.scan_iter(match=f"*{self.ns}*", count=1000))
        if keys:
            self.broker.client.delete(*keys)
        self.suite.db.close()
        self.broker.close()


def bench(label: str, database: str, args: argparse.Namespace) -> None:
    n = args.jobs
    kinds = ("plain", "tracked", "unique")
    best: dict[tuple, float] = {}

    def keep(key: tuple, secs: float) -> None:
        # Best of the repeats: the machine is shared and noisy.  The kinds take
        # turns within each repeat, so a slow spell hits all of them alike.
        best[key] = min(best.get(key, secs), secs)

    run = Run(database)
    try:
        for _ in range(args.repeat):
            for producers in sorted({1, args.producers}):
                for kind in kinds:
                    keep(("enqueue", producers, kind), run.enqueue(kind, n, producers))
        sent, skipped = run.skip_cost(min(n, 1000))
    finally:
        run.close()
    for _ in range(args.repeat):
        for kind in kinds:
            # A fresh broker each time: a stopped worker leaves its middleware behind.
            run = Run(database)
            try:
                keep(("process", args.threads, kind), run.process(kind, n, args.threads))
            finally:
                run.close()
    results = {key: n / secs for key, secs in best.items()}

    print(f"\n== {label}: {n} no-op jobs, Redis broker")
    print(f"{'measure':<34}{'plain/s':>10}{'tracked/s':>11}{'unique/s':>10}{'tracked':>9}{'unique':>8}")
    for (what, width, _k) in sorted({(w, c, None) for (w, c, _) in results}):
        plain = results[(what, width, "plain")]
        tracked = results[(what, width, "tracked")]
        unique = results[(what, width, "unique")]
        name = f"{what} ({width} {'producer' if what == 'enqueue' else 'worker thread'}{'s' if width > 1 else ''})"
        print(f"{name:<34}{plain:>10.0f}{tracked:>11.0f}{unique:>10.0f}{tracked / plain:>9.2f}{unique / plain:>8.2f}")
    print(f"skipped duplicate send: {skipped * 1e6:.0f} us vs plain send {sent * 1e6:.0f} us "
          f"(ratio {skipped / sent:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores")
    on_each_database(lambda label, url: bench(label, url, args), args.only)


if __name__ == "__main__":
    main()

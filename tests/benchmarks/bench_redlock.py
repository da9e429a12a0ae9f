"""Three Redlock masters, one of them down: throughput as a ratio to all three up.

    python tests/benchmarks/bench_redlock.py [--jobs 300] [--keys 30] [--threads 8] [--ms 5] [--rounds 2]

Starts three private ``redis-server`` processes as the suite's Redlock
masters (the broker stays on the shared Redis, the job table on SQLite),
and one worker of ``--threads`` threads.  Each measure queues ``--jobs``
jobs, half ``until_and_while_executing`` with a key each (a queue lock at
send, handed to an execution lock at start), half ``while_executing`` over
``--keys`` keys (jobs of a key park and are handed on), and times them
from the first start to the last end.  Measures take turns within each round:

* master 2 killed (a refused connection), then started again;
* master 0 killed: it also holds the wake-up flags;
* master 2 stalled with SIGSTOP (a master that takes connections and never
  answers: each call waits ``lock_timeout``), then SIGCONT;
* master 0 stalled, the same way.

Each fault's measure is paired with an all-up measure taken just before it;
prints jobs/s and the median of the per-pair ratios (the target: >= 0.8).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import dramatiq  # noqa: E402
from common import REDIS_URL  # noqa: E402
from dramatiq.brokers.redis import RedisBroker  # noqa: E402

import dramatiq_unique  # noqa: E402
from tests.durable import RedisServer  # noqa: E402


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.servers = [RedisServer().start() for _ in range(3)]
        ns = f"bench-redlock-{uuid.uuid4().hex[:8]}"
        self.broker = RedisBroker(url=REDIS_URL, namespace=ns)
        dramatiq.set_broker(self.broker)
        # Clients as a user would make them: redis-py's defaults (5 s timeouts, retries with back-off).
        self.suite = dramatiq_unique.setup(
            self.broker, database=f"sqlite:///{tempfile.mkdtemp()}/bench.db", key_prefix=ns, redriver=False,
            redis=[f"redis://127.0.0.1:{s.port}/0" for s in self.servers],
        )
        self.lock = threading.Lock()
        self.spans: list[tuple[float, float]] = []
        seconds = args.ms / 1000

        def run() -> None:
            start = time.perf_counter()
            time.sleep(seconds)
            with self.lock:
                self.spans.append((start, time.perf_counter()))

        # A queue lock at send, handed to an execution lock at start: one key per job.
        @dramatiq.actor(unique_args=["key"], unique_lock="until_and_while_executing",
                        max_retries=50, min_backoff=100, max_backoff=500)
        def unique(key):
            run()

        # Execution locks only, few keys: jobs of a key park and are handed on.
        @dramatiq.actor(unique_args=["key"], unique_lock="while_executing",
                        max_retries=50, min_backoff=100, max_backoff=500)
        def serial(key, i):
            run()

        self.unique, self.serial = unique, serial
        self.worker = dramatiq.Worker(self.broker, worker_timeout=50, worker_threads=args.threads)
        self.worker.start()
        self.round = 0

    def measure(self) -> float:
        """Jobs per second for one batch, from the first start to the last end."""
        self.round += 1
        with self.lock:
            self.spans.clear()
        n = self.args.jobs
        for i in range(n):
            if i % 2:
                self.serial.send(f"k{i % self.args.keys}", i)
            else:
                self.unique.send(f"u{i}-{self.round}")
        deadline = time.monotonic() + 120
        while True:
            with self.lock:
                if len(self.spans) >= n:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(self.spans)} of {n} jobs ran in 120 s")
            time.sleep(0.01)
        with self.lock:
            first = min(s for s, _ in self.spans)
            last = max(e for _, e in self.spans)
        return n / (last - first)

    def killed(self, index: int) -> float:
        server = self.servers[index]
        server.stop()
        try:
            return self.measure()
        finally:
            self.servers[index] = RedisServer(server.port).start()

    def stalled(self, index: int) -> float:
        pid = self.servers[index].proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            return self.measure()
        finally:
            os.kill(pid, signal.SIGCONT)

    def close(self) -> None:
        self.worker.stop(timeout=10_000)
        self.broker.flush_all()
        self.suite.db.close()
        for server in self.servers:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--keys", type=int, default=30)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--ms", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    bench = Bench(args)
    faults = {
        "master 2 killed": lambda: bench.killed(2),
        "master 0 killed": lambda: bench.killed(0),
        "master 2 stalled (SIGSTOP)": lambda: bench.stalled(2),
        "master 0 stalled (SIGSTOP)": lambda: bench.stalled(0),
    }
    # Each fault's measure is paired with an all-up measure just before it, and the ratio taken
    # per pair: the machine is shared, and its load drifts more between rounds than within a pair.
    up: list[float] = []
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in faults}
    try:
        bench.measure()  # warm-up: connections, scripts, tables
        for _ in range(args.rounds):
            for name, measure in faults.items():
                base = bench.measure()
                up.append(base)
                results[name].append((measure(), base))
    finally:
        bench.close()
    print(f"{args.jobs} jobs over {args.keys} keys, {args.ms:g} ms each, {args.threads} threads, "
          f"lock_timeout {bench.suite.settings.lock_timeout} ms; medians of {args.rounds} rounds")
    print(f"  {'all up':28s} {statistics.median(up):7.0f} jobs/s")
    for name, pairs in results.items():
        ratios = [value / base for value, base in pairs]
        runs = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"  {name:28s} {statistics.median(v for v, _ in pairs):7.0f} jobs/s  "
              f"ratio {statistics.median(ratios):.2f}   (per round: {runs})")

if __name__ == "__main__":
    main()

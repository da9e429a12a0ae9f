"""What the suite's metrics cost: throughput with metrics off and on, as ratios to plain Dramatiq.

    python tests/benchmarks/bench_metrics.py [--jobs 2000] [--threads 8] [--repeat 3] [--only postgres]

``off``: the suite as it ships, no Prometheus anywhere (its hooks read one
global).  ``on``: Dramatiq's ``Prometheus`` middleware on the broker and
the suite's metrics beside it, in prometheus_client's multiprocess mode (a
temporary directory), as in a worker process.  Both modes take turns in
each repeat, in one process (best of the repeats).  Measured: plain,
tracked and unique no-op jobs (bench_throughput's ``Run``), parked jobs
(one slot of 4 per key, 8 threads: most deliveries park, and every job is
handed its slot), and a skipped duplicate send, with the duplicate's INFO
line written to a handler on /dev/null (its formatting is part of the cost).
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

import dramatiq
from bench_throughput import Run
from common import on_each_database

from dramatiq_unique.observe import disable_metrics


class Counted(Run):
    """bench_throughput's Run, with a slot-limited actor, and Dramatiq's Prometheus when ``metrics``."""

    def __init__(self, database: str, metrics: bool) -> None:
        super().__init__(database)

        @dramatiq.actor(queue_name="parked", concurrency_limit=4, concurrency_key=["k"])
        def parked(i, k=0):  # one group of 4 slots for 8 threads
            with self.lock:
                self.done += 1

        self.actors["parked"] = parked
        disable_metrics()
        if metrics:
            from dramatiq.middleware.prometheus import Prometheus

            self.broker.add_middleware(Prometheus())
            self.broker.emit_after("process_boot")  # what Dramatiq's CLI does in each worker process


def bench(label: str, database: str, args: argparse.Namespace) -> None:
    kinds = ("plain", "tracked", "unique", "parked")
    best: dict[tuple, float] = {}
    for _ in range(args.repeat):
        for mode in ("off", "on"):
            for kind in kinds:
                run = Counted(database, mode == "on")  # a fresh broker each time, as bench_throughput
                try:
                    secs = run.process(kind, args.jobs, args.threads)
                    if kind == "plain":
                        sent, skipped = run.skip_cost(min(args.jobs, 1000))
                        best[(mode, "skip")] = min(best.get((mode, "skip"), skipped), skipped)
                        best[(mode, "send")] = min(best.get((mode, "send"), sent), sent)
                finally:
                    run.close()
                best[(mode, kind)] = min(best.get((mode, kind), secs), secs)
    disable_metrics()
    rate = {key: args.jobs / secs for key, secs in best.items() if key[1] in kinds}
    print(f"\n== {label}: {args.jobs} no-op jobs, {args.threads} worker threads, Redis broker")
    print(f"{'jobs/s':<10}" + "".join(f"{k:>10}" for k in kinds) + "".join(f"{k + '/plain':>14}" for k in kinds[1:]))
    for mode in ("off", "on"):
        plain = rate[(mode, "plain")]
        print(f"{mode:<10}" + "".join(f"{rate[(mode, k)]:>10.0f}" for k in kinds)
              + "".join(f"{rate[(mode, k)] / plain:>14.2f}" for k in kinds[1:]))
    print(f"{'on/off':<10}" + "".join(f"{rate[('on', k)] / rate[('off', k)]:>10.2f}" for k in kinds))
    for mode in ("off", "on"):
        print(f"skipped duplicate send, metrics {mode}: {best[(mode, 'skip')] * 1e6:.0f} us "
              f"(plain send {best[(mode, 'send')] * 1e6:.0f} us)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    args = parser.parse_args()
    # Multiprocess mode, as in a Dramatiq worker: set before prometheus_client is first imported.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.environ["prometheus_multiproc_dir"] = tempfile.mkdtemp()
    from dramatiq.middleware import prometheus

    prometheus.DB_PATH = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    # The duplicate's INFO line is formatted and handled (then dropped), as where INFO is logged.
    events = logging.getLogger("dramatiq_unique.events")
    events.setLevel(logging.INFO)
    events.addHandler(logging.StreamHandler(open(os.devnull, "w")))  # noqa: SIM115
    events.propagate = False
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores")
    on_each_database(lambda label, url: bench(label, url, args), args.only)


if __name__ == "__main__":
    main()

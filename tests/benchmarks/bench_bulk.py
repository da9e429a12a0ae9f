"""send_many against plain Dramatiq's per-message send.

    python tests/benchmarks/bench_bulk.py [--jobs 10000] [--runs 3] [--only postgres]

One producer thread on the Redis broker, with the job table on SQLite and on PostgreSQL (a fresh
schema, dropped afterwards).  Each run times, in turn: plain Dramatiq sending ``--jobs`` messages
one ``send()`` at a time; ``send_many`` of as many tracked jobs (``track=True``); ``send_many``
of as many unique jobs (``unique_args=["i"]``, distinct keys: each row holds its key and each
publish writes its queue lock); and, inside ``transaction()`` (the outbox: rows written pending in
the transaction, claimed and published after its commit), ``send_many`` of tracked jobs and as
many single tracked sends.  Ratios are throughput to plain Dramatiq's in the same run.
Nothing is processed: the queues are flushed between measures.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import dramatiq
from common import REDIS_URL, on_each_database
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import JobModel


def bench(label: str, database: str, jobs: int, runs: int) -> None:
    ns = f"bench-{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=REDIS_URL, namespace=ns)
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=database, redis=REDIS_URL, key_prefix=ns, redriver=False)

    @dramatiq.actor(queue_name="plain")
    def plain(i):
        pass

    @dramatiq.actor(queue_name="tracked", track=True)
    def tracked(i):
        pass

    @dramatiq.actor(queue_name="unique", unique_args=["i"])
    def unique(i):
        pass

    def timed(send) -> float:
        start = time.perf_counter()
        send()
        return jobs / (time.perf_counter() - start)

    def reset() -> None:
        broker.flush_all()
        JobModel.delete().execute()
        if "postgres" in database:
            suite.db.execute_sql(f"ANALYZE {JobModel._meta.table_name}")

    # Warm-up: connections, prepared statements, scripts loaded.
    for i in range(50):
        plain.send(i)
    dramatiq_unique.send_many(tracked, [(i,) for i in range(50)])
    dramatiq_unique.send_many(unique, [(i,) for i in range(50)])
    def in_transaction(send) -> None:
        with dramatiq_unique.transaction():  # held until the commit, then claimed and published in batches
            send()

    kinds = {
        "plain": lambda: [plain.send(i) for i in range(jobs)],
        "tracked": lambda: dramatiq_unique.send_many(tracked, [(i,) for i in range(jobs)]),
        "unique": lambda: dramatiq_unique.send_many(unique, [(i,) for i in range(jobs)]),
        "outbox send_many": lambda: in_transaction(kinds["tracked"]),
        "outbox send": lambda: in_transaction(lambda: [tracked.send(i) for i in range(jobs)]),
    }
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    ratios: dict[str, list[float]] = {kind: [] for kind in kinds if kind != "plain"}
    for run in range(runs):
        for kind, send in kinds.items():
            reset()
            rates[kind].append(timed(send))
        for kind in ratios:
            ratios[kind].append(rates[kind][-1] / rates["plain"][-1])
        print(f"{label} run {run + 1}: plain {rates['plain'][-1]:.0f}/s, " + ", ".join(
            f"{kind} {rates[kind][-1]:.0f}/s ({ratios[kind][-1]:.2f}x)" for kind in ratios), flush=True)
    targets = {"tracked": ", target >= 2", "unique": ", target >= 1.5"}
    print(f"{label}: " + ", ".join(
        f"{kind} {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f}{targets.get(kind, '')})"
        for kind, r in ratios.items()))
    reset()
    broker.close()
    suite.db.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    ns = parser.parse_args()
    on_each_database(lambda label, url: bench(label, url, ns.jobs, ns.runs), ns.only)


if __name__ == "__main__":
    main()

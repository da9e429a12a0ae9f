"""A re-drive pass over 10,000 due jobs, beside no finished rows and beside a million.

    python tests/benchmarks/bench_redrive.py [--due 10000] [--finished 1000000] [--repeat 3] [--lost 2000]

On PostgreSQL (a fresh schema, dropped afterwards) with the Redis broker.
Measures, in one run:

* plain Dramatiq publishing the same number of messages (``broker.enqueue``),
  the floor any re-drive stands on;
* a pass that claims and sends ``--due`` pending jobs, with no finished
  rows in the table, then with ``--finished`` finished rows beside them
  (bulk-inserted with generate_series); the target is a ratio <= 1.5;
* an idle pass (nothing due, nothing overdue), with and without them;
* the two passes that recover ``--lost`` queued jobs whose messages are gone
  (as after a Redis wipe): the first marks them missing, the second re-sends;
* and prints the PostgreSQL plans of the pass's SELECTs, with the big table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import dramatiq
import peewee as pw
from dramatiq.brokers.redis import RedisBroker

sys.path.insert(0, str(Path(__file__).parents[2]))

import dramatiq_unique  # noqa: E402
from dramatiq_unique import JobModel  # noqa: E402
from tests.durable import bulk_insert_pg, pass_selects, wipe_broker  # noqa: E402

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
PG = dict(database="test", host="127.0.0.1", user="postgres")
TABLE = "bench_jobs"


class Side:
    """A job table (own PostgreSQL schema) and a broker (own namespace) with a tracked actor."""

    def __init__(self, admin: pw.PostgresqlDatabase, label: str) -> None:
        self.label = label
        self.admin = admin
        self.schema = f"bench_{uuid.uuid4().hex[:8]}"
        admin.execute_sql(f'CREATE SCHEMA "{self.schema}"')
        self.ns = f"bench-{uuid.uuid4().hex[:8]}"
        self.broker = RedisBroker(url=REDIS_URL, namespace=self.ns)
        dramatiq.set_broker(self.broker)
        url = f"postgresql://{PG['user']}@{PG['host']}/{PG['database']}?options=-csearch_path%3D{self.schema}"
        self.suite = dramatiq_unique.setup(
            self.broker, database=url, redis=REDIS_URL, key_prefix=self.ns, redriver=False
        )
        self.db = self.suite.db
        # Its own model class: the shared JobModel is bound to one database at a time
        # (the last setup()'s), and this process holds two suites on two schemas.
        meta = type("Meta", (), {"table_name": TABLE})
        self.model = type(f"BenchJobs{self.ns.replace('-', '_')}", (JobModel,), {"Meta": meta, "__module__": __name__})

        @dramatiq.actor(track=True, actor_name="report", broker=self.broker, job_model=self.model)
        def report(n):
            pass

        @dramatiq.actor(actor_name="plain", broker=self.broker)
        def plain(n):
            pass

        self.plain = plain

    def plain_publish(self, n: int) -> float:
        messages = [self.plain.message(i) for i in range(n)]
        start = time.perf_counter()
        for message in messages:
            self.broker.enqueue(message)
        elapsed = time.perf_counter() - start
        wipe_broker(self.broker)
        return elapsed

    def due_rows(self, n: int) -> None:
        # Pending and due, as the outbox leaves them when the broker was down at commit.
        self.db.execute_sql(f'DELETE FROM "{TABLE}" WHERE status <> %s AND status <> %s', ("succeeded", "failed"))
        bulk_insert_pg(self.model, n, status="pending", prefix=f"due-{uuid.uuid4().hex[:6]}")
        self.db.execute_sql(f'ANALYZE "{TABLE}"')
        wipe_broker(self.broker)

    def due_pass(self, n: int) -> float:
        self.due_rows(n)
        start = time.perf_counter()
        counts = dramatiq_unique.redrive(self.broker, suite=self.suite)
        elapsed = time.perf_counter() - start
        assert counts.sent == n and self.broker.client.llen(f"{self.ns}:default") == n, counts
        return elapsed

    def idle_pass(self) -> float:
        self.due_rows(0)
        start = time.perf_counter()
        counts = dramatiq_unique.redrive(self.broker, suite=self.suite)
        elapsed = time.perf_counter() - start
        assert counts.sent == counts.missing == counts.pruned == 0, counts
        return elapsed

    def recovery(self, n: int) -> tuple[float, float]:
        """Seconds of the two passes that find ``n`` queued jobs lost (as after a Redis wipe) and re-send them."""
        self.due_rows(0)
        bulk_insert_pg(self.model, n, status="queued", prefix=f"lost-{uuid.uuid4().hex[:6]}", due_ago="1 hour",
                       broker_ref=True)
        self.db.execute_sql(f'ANALYZE "{TABLE}"')
        start = time.perf_counter()
        first = dramatiq_unique.redrive(self.broker, suite=self.suite)
        marked = time.perf_counter() - start
        time.sleep(0.2)
        start = time.perf_counter()
        second = dramatiq_unique.redrive(self.broker, suite=self.suite)
        sent = time.perf_counter() - start
        assert first.missing == n and second.redriven == n, (first, second)
        return marked, sent

    def close(self) -> None:
        wipe_broker(self.broker)
        self.broker.close()
        self.db.close()
        self.admin.execute_sql(f'DROP SCHEMA "{self.schema}" CASCADE')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--due", type=int, default=10_000)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--lost", type=int, default=2_000, help="queued jobs lost in a Redis wipe, to recover")
    args = parser.parse_args()

    admin = pw.PostgresqlDatabase(**PG)
    empty = big = None
    try:
        empty, big = Side(admin, "no finished rows"), Side(admin, f"{args.finished:,} finished rows")
        start = time.perf_counter()
        bulk_insert_pg(big.model, args.finished, status="succeeded", prefix="done")
        big.db.execute_sql(f'ANALYZE "{TABLE}"')
        assert big.model.select().count() == args.finished and empty.model.select().count() == 0
        print(f"PostgreSQL, Redis broker; {args.due:,} due jobs; page {empty.suite.redrive_page_size}; "
              f"median of {args.repeat}, the two tables measured in turn")
        print(f"  (inserted {args.finished:,} finished rows in {time.perf_counter() - start:.1f} s)")
        keys = ("plain", "empty", "big", "idle empty", "idle big")
        keys += ("mark empty", "mark big", "resend empty", "resend big")
        times: dict[str, list[float]] = {k: [] for k in keys}
        for _ in range(args.repeat):
            times["plain"].append(empty.plain_publish(args.due))
            times["empty"].append(empty.due_pass(args.due))
            times["big"].append(big.due_pass(args.due))
            times["idle empty"].append(empty.idle_pass())
            times["idle big"].append(big.idle_pass())
            for key, side in (("empty", empty), ("big", big)):
                marked, sent = side.recovery(args.lost)
                times[f"mark {key}"].append(marked)
                times[f"resend {key}"].append(sent)
        m = {k: statistics.median(v) for k, v in times.items()}
        print(f"  plain Dramatiq, publish {args.due:,} messages: {m['plain']:7.3f} s")
        for key, side in (("empty", empty), ("big", big)):
            print(f"  pass, {side.label:>24}: {m[key]:7.3f} s  ({m[key] / m['plain']:.2f}x plain publishing, "
                  f"{args.due / m[key]:,.0f} jobs/s)")
        for key, side in (("idle empty", empty), ("idle big", big)):
            print(f"  idle pass, {side.label:>19}: {m[key] * 1000:7.1f} ms")
        ratio = m["big"] / m["empty"]
        verdict = "met" if ratio <= 1.5 else "MISSED"
        print(f"  ratio with/without finished rows: {ratio:.2f}  (target <= 1.5: {verdict})")
        print(f"  idle ratio: {m['idle big'] / m['idle empty']:.2f}")
        print(f"  recovery of {args.lost:,} lost queued jobs (first pass marks, second confirms and re-sends):")
        for key, side in (("empty", empty), ("big", big)):
            print(f"    {side.label:>24}: {m['mark ' + key]:6.3f} s + {m['resend ' + key]:6.3f} s")
        print(f"    ratio: {(m['mark big'] + m['resend big']) / (m['mark empty'] + m['resend empty']):.2f}")

        big.due_rows(args.due)
        print(f"\nPlans with {args.finished:,} finished and {args.due:,} due rows:")
        for sql, params in pass_selects(big.suite, big.broker, big.model):
            print(f"-- {sql[:160]}")
            for (line,) in big.db.execute_sql("EXPLAIN " + sql, params).fetchall():
                print(f"   {line}")
        return 0 if ratio <= 1.5 else 1
    finally:
        for side in (empty, big):
            if side is not None:
                side.close()
        admin.close()


if __name__ == "__main__":
    sys.exit(main())

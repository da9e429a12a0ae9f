"""A re-drive pass over 10,000 due jobs, beside no finished rows and beside a million.

    python tests/benchmarks/bench_redrive.py [--due 10000] [--finished 1000000] [--repeat 3]

On PostgreSQL (a fresh schema, dropped afterwards) with the Redis broker.
Measures, in one run:

* plain Dramatiq publishing the same number of messages (``broker.enqueue``),
  the floor any re-drive stands on;
* a pass that claims and sends ``--due`` pending jobs, with no finished
  rows in the table, then with ``--finished`` finished rows beside them
  (bulk-inserted with generate_series); the target is a ratio <= 1.5;
* an idle pass (nothing due, nothing overdue), with and without them;
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
from dramatiq_unique.claims import pass_queries  # noqa: E402
from tests.durable import bulk_insert_pg, wipe_broker  # noqa: E402

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
PG = dict(database="test", host="127.0.0.1", user="postgres")
TABLE = JobModel._meta.table_name


def median_of(repeat: int, measure) -> float:
    return statistics.median(measure() for _ in range(repeat))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--due", type=int, default=10_000)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = pw.PostgresqlDatabase(**PG)
    admin.execute_sql(f'CREATE SCHEMA "{schema}"')
    ns = f"bench-{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=REDIS_URL, namespace=ns)
    dramatiq.set_broker(broker)
    url = f"postgresql://{PG['user']}@{PG['host']}/{PG['database']}?options=-csearch_path%3D{schema}"
    suite = dramatiq_unique.setup(broker, database=url, redis=REDIS_URL, key_prefix=ns, redriver=False)
    db = suite.db
    try:

        @dramatiq.actor(track=True)
        def report(n):
            pass

        @dramatiq.actor
        def plain(n):
            pass

        def plain_publish() -> float:
            messages = [plain.message(i) for i in range(args.due)]
            start = time.perf_counter()
            for message in messages:
                broker.enqueue(message)
            elapsed = time.perf_counter() - start
            wipe_broker(broker)
            return elapsed

        def due_rows() -> None:
            # Pending and due, as the outbox leaves them when the broker was down at commit.
            db.execute_sql(f'DELETE FROM "{TABLE}" WHERE status <> %s AND status <> %s', ("succeeded", "failed"))
            bulk_insert_pg(JobModel, args.due, status="pending", prefix=f"due-{uuid.uuid4().hex[:6]}")
            db.execute_sql(f'ANALYZE "{TABLE}"')
            wipe_broker(broker)

        def due_pass() -> float:
            due_rows()
            start = time.perf_counter()
            counts = dramatiq_unique.redrive()
            elapsed = time.perf_counter() - start
            assert counts.sent == args.due and broker.client.llen(f"{ns}:default") == args.due, counts
            return elapsed

        def idle_pass() -> float:
            start = time.perf_counter()
            counts = dramatiq_unique.redrive()
            elapsed = time.perf_counter() - start
            assert counts.sent == counts.missing == counts.pruned == 0, counts
            return elapsed

        print(f"PostgreSQL, Redis broker; {args.due:,} due jobs; page {suite.redrive_page_size}; "
              f"median of {args.repeat}")
        plain_s = median_of(args.repeat, plain_publish)
        print(f"  plain Dramatiq, publish {args.due:,} messages: {plain_s:7.3f} s")
        empty = median_of(args.repeat, due_pass)
        idle_empty = median_of(args.repeat, idle_pass)
        print(f"  pass, no finished rows:       {empty:7.3f} s  ({empty / plain_s:.2f}x plain publishing)")
        print(f"  idle pass, no finished rows:  {idle_empty * 1000:7.1f} ms")

        start = time.perf_counter()
        db.execute_sql(f'DELETE FROM "{TABLE}"')
        bulk_insert_pg(JobModel, args.finished, status="succeeded", prefix="done")
        db.execute_sql(f'ANALYZE "{TABLE}"')
        print(f"  (inserted {args.finished:,} finished rows in {time.perf_counter() - start:.1f} s)")
        full = median_of(args.repeat, due_pass)
        idle_full = median_of(args.repeat, idle_pass)
        print(f"  pass, {args.finished:,} finished rows: {full:7.3f} s  ({full / plain_s:.2f}x plain publishing)")
        print(f"  idle pass, {args.finished:,} finished:  {idle_full * 1000:7.1f} ms")
        ratio = full / empty
        print(f"  ratio with/without finished rows: {ratio:.2f}  (target <= 1.5: {'met' if ratio <= 1.5 else 'MISSED'})")

        due_rows()
        settings = suite.settings
        print(f"\nPlans with {args.finished:,} finished and {args.due:,} due rows:")
        for name, query in pass_queries(JobModel, lost_after=settings.lost_after, retention=settings.retention).items():
            sql, params = query.sql()
            plan = db.execute_sql("EXPLAIN " + sql, params).fetchall()
            print(f"-- {name}")
            for (line,) in plan:
                print(f"   {line}")
        return 0 if ratio <= 1.5 else 1
    finally:
        wipe_broker(broker)
        broker.close()
        db.close()
        admin.execute_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()


if __name__ == "__main__":
    sys.exit(main())

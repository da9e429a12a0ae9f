"""The operator's views on a job table of a million finished rows: the jobs list and ``job ID``.

    python tests/benchmarks/bench_ops.py [--rows 1000000] [--repeat 20] [--sqlite]

Fills a fresh PostgreSQL schema (dropped afterwards) with ``--rows`` finished jobs in one
``INSERT ... SELECT generate_series`` (four actors, customers and users in the arguments,
one job in 50 failed, created half a second apart), plus a few waiting ones parked on a slot
group; with ``--sqlite`` also a SQLite file (a recursive CTE).  Then times, median and worst
of ``--repeat`` calls after a warm-up, the ops layer (dramatiq_unique.ops) as the command line
and the dashboard call it: the first page, filtered pages, deep pages by cursor, and ``job ID``.
Target: each under 100 ms.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import dramatiq
import peewee as pw

sys.path.insert(0, str(Path(__file__).parents[2]))

from common import rig  # noqa: E402  (this folder is sys.path[0] when run as a script)

import dramatiq_unique  # noqa: E402
from dramatiq_unique import JobModel, ops  # noqa: E402
from dramatiq_unique.unique.keys import canonical, digest  # noqa: E402

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
PG = dict(database="test", host="127.0.0.1", user="postgres")
ACTORS = ("deliver_webhook", "report", "export", "sync")

# One expression per column, of g (1..n); {now}, {ago(seconds)} and {key(g)} are the dialect's.
COLUMNS = {
    "app": "{app}",
    "message_id": "'bench-' || g",
    "actor_name": "CASE g % 4 WHEN 0 THEN 'deliver_webhook' WHEN 1 THEN 'report' WHEN 2 THEN 'export' ELSE 'sync' END",
    "queue_name": "'default'",
    "args": "'[' || ((g / 4) % 1000) || ',\"payload\"]'",
    "kwargs": "'{{}}'",
    "options": "'{{}}'",
    "unique_key": "CASE g % 4 WHEN 1 THEN {key} ELSE NULL END",
    "status": "CASE WHEN g % 50 = 0 THEN 'failed' ELSE 'succeeded' END",
    "attempts": "1", "revision": "0", "fencing_token": "CASE g % 4 WHEN 1 THEN g ELSE 0 END",
    "created_at": "{created}", "enqueued_at": "{created}", "started_at": "{started}", "finished_at": "{finished}",
    "last_error": "CASE WHEN g % 50 = 0 THEN 'RuntimeError: boom' ELSE NULL END",
}


def _pg_sql(n: int, app: str) -> str:
    base = "(now() at time zone 'utc') - ({n} - g) * interval '500 milliseconds'".replace("{n}", str(n))
    key = "'report:' || substr(encode(sha256(('{\"user\":' || ((g / 4) % 1000) || '}')::bytea), 'hex'), 1, 40)"
    values = {c: e.format(app=f"'{app}'", key=key, created=base, started=f"{base} + interval '20 milliseconds'",
                          finished=f"{base} + interval '70 milliseconds'") for c, e in COLUMNS.items()}
    cols = ", ".join(f'"{c}"' for c in values)
    select = ", ".join(values.values()).replace("%", "%%")  # psycopg2 reads % as a placeholder
    return f'INSERT INTO "dramatiq_unique_jobs" ({cols}) SELECT {select} FROM generate_series(1, {n}) AS g'


def _sqlite_sql(n: int, app: str) -> str:
    def at(ms: int) -> str:
        return f"strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || (({n} - g) * 0.5 - {ms / 1000}) || ' seconds')"

    key = "'report:' || du_key((g / 4) % 1000)"
    values = {c: e.format(app=f"'{app}'", key=key, created=at(0), started=at(20), finished=at(70))
              for c, e in COLUMNS.items()}
    cols = ", ".join(f'"{c}"' for c in values)
    return (f"WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {n}) "
            f'INSERT INTO "dramatiq_unique_jobs" ({cols}) SELECT {", ".join(values.values())} FROM s')


class Bench:
    def __init__(self, label: str, database: str, fill: Callable[[pw.Database, int, str], None], rows: int) -> None:
        self.label = label
        self.ns, self.broker, self.suite = rig(database)

        @dramatiq.actor(concurrency_limit=2, concurrency_key=["customer"])
        def deliver_webhook(customer, payload=""):
            pass

        @dramatiq.actor(unique_args=["user"], unique_lock="while_executing")
        def report(user, payload=""):
            pass

        for name in ("export", "sync"):
            dramatiq.actor(track=True, actor_name=name)(lambda n, payload="": None)
        start = time.perf_counter()
        fill(self.suite.db, rows, self.suite.app)
        self.fill_s = time.perf_counter() - start
        self.rows = rows
        # A few waiting jobs: a slot group of customer 42 with two "holders" and parked waiters.
        for i in range(5):
            deliver_webhook.send_with_options(args=(42, f"w{i}"), delay=3_600_000)
        self.waiting = JobModel.select().order_by(JobModel.id.desc()).first()
        JobModel.update(status="pending", parked_on="slot:deliver_webhook:" + digest(canonical({"customer": 42})),
                        process_after=None).where(JobModel.id > rows).execute()

    def time(self, what: str, call: Callable[[], Any], repeat: int) -> tuple[str, float, float, str]:
        result = call()  # warm-up: prepared statements, caches
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            call()
            times.append((time.perf_counter() - start) * 1000)
        rows = getattr(result, "rows", None)
        got = f"{len(rows)} rows" + (", more" if result.cursor else "") if rows is not None else ""
        return what, statistics.median(times), max(times), got

    def run(self, repeat: int) -> list[tuple[str, float, float, str]]:
        s, mid, low = self.suite, self.rows // 2, 1_000
        since = dramatiq_unique.storage.models.utcnow() - __import__("datetime").timedelta(hours=1)
        cases: list[tuple[str, Callable[[], Any]]] = [
            ("first page (50)", lambda: ops.jobs(s)),
            ("status=failed", lambda: ops.jobs(s, status="failed")),
            ("actor=report", lambda: ops.jobs(s, actor="report")),
            ("key=user=7 actor=report (index)", lambda: ops.jobs(s, key="user=7", actor="report")),
            ("key=user=7, any actor (index)", lambda: ops.jobs(s, key="user=7")),
            ("key=customer=42 (scan, sieve)", lambda: ops.jobs(s, key="customer=42", actor="deliver_webhook")),
            ("actor=nobody (scan, no match)", lambda: ops.jobs(s, actor="nobody")),
            ("since=1h", lambda: ops.jobs(s, since=since)),
            (f"deep page: cursor {mid}", lambda: ops.jobs(s, cursor=f"{mid}.0")),
            (f"deep page: cursor {low}", lambda: ops.jobs(s, cursor=f"{low}.0")),
            (f"deep + status=failed: cursor {mid}", lambda: ops.jobs(s, status="failed", cursor=f"{mid}.0")),
            (f"job {mid} (finished)", lambda: ops.job(s, mid)),
            ("job by message id", lambda: ops.job(s, f"bench-{mid + 1}")),
            ("job (parked on a slot)", lambda: ops.job(s, self.waiting.id)),
            ("stats, 15 min", lambda: ops.stats(s)),
        ]
        return [self.time(what, call, repeat) for what, call in cases]


def pg_fill(db: pw.Database, n: int, app: str) -> None:
    db.execute_sql(_pg_sql(n, app))
    db.execute_sql('ANALYZE "dramatiq_unique_jobs"')


def sqlite_fill(db: pw.Database, n: int, app: str) -> None:
    db.register_function(lambda user: digest(canonical({"user": user})), "du_key", 1)
    db.close()  # functions are registered on the next connection
    with db.atomic():
        db.execute_sql(_sqlite_sql(n, app))
    db.execute_sql('ANALYZE')


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--sqlite", action="store_true", help="also on SQLite")
    args = parser.parse_args()
    admin = pw.PostgresqlDatabase(**PG)
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin.execute_sql(f'CREATE SCHEMA "{schema}"')
    results = []
    try:
        url = f"postgresql://{PG['user']}@{PG['host']}/{PG['database']}?options=-csearch_path%3D{schema}"
        results.append(Bench("PostgreSQL", url, pg_fill, args.rows))
        if args.sqlite:
            folder = tempfile.mkdtemp()
            results.append(Bench("SQLite", f"sqlite:///{folder}/jobs.db", sqlite_fill, args.rows))
        for bench in results:
            dramatiq_unique.suite.set_current(bench.suite)
            JobModel.bind(bench.suite.db)
            print(f"\n{bench.label}: {bench.rows:,} finished rows (filled in {bench.fill_s:.1f} s)")
            print(f"{'call':40} {'median ms':>10} {'worst ms':>10}  answer")
            for what, median, worst, got in bench.run(args.repeat):
                flag = "" if median < 100 else "  OVER 100 ms"
                print(f"{what:40} {median:10.1f} {worst:10.1f}  {got}{flag}")
    finally:
        for bench in results:  # its own keys only: its namespace and key prefix
            client = bench.broker.client
            for pattern in (f"{bench.ns}*", f"redlock:{bench.ns}*"):
                keys = list(client.scan_iter(match=pattern, count=1000))
                if keys:
                    client.delete(*keys)
        admin.execute_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

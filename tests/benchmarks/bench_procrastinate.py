"""The suite against Procrastinate, side by side on the same PostgreSQL.

    pip install -e '.[postgres,bench]'
    python tests/benchmarks/bench_procrastinate.py [--jobs 2000] [--rounds 6] [--concurrency 8]

Procrastinate is what a Python user who wants database-backed unique jobs would
pick instead.  Each round measures both, the side that goes first alternating:

* sending ``--jobs`` new jobs from one thread: a ``track=True`` actor against
  ``task.defer()``; a unique actor (``unique_lock="until_and_while_executing"``,
  distinct keys) against ``configure(queueing_lock=k, lock=k).defer()``;
* a refused duplicate (cost per send, µs): of a key this process sent just
  before, and of keys it did not send (sent, then the process's memory of
  recent keys emptied, as for a key sent by another process).  Procrastinate
  has one path for both: the INSERT fails on its unique index;
* processing the jobs just sent, concurrency 8 on both sides: our in-process
  ``dramatiq.Worker`` of 8 threads (warmed up, paused while the jobs are
  queued) against ``app.run_worker_async(concurrency=8, wait=False)`` (its pool
  already open; it returns when the queue is empty).

Both job tables are truncated and ANALYZEd at the start of each round and
ANALYZEd again once a backlog is queued, before it is processed: on a
never-analysed table Procrastinate's fetch plan sorts the whole backlog.
Our side: Redis broker, the job table in a fresh schema; Procrastinate's schema
in another fresh schema of the same database; both dropped afterwards, with
our Redis keys (under this run's own prefix).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import threading
import time
import uuid

import dramatiq
import peewee as pw
import procrastinate
from common import PG, pg_database, rig

from dramatiq_unique.unique import recent


def analyze(db: pw.Database, tables: list[str], truncate: bool = False) -> None:
    for table in tables:
        if truncate and table != "dramatiq_unique_schema":  # the tables' versions: kept, as in any deployment
            db.execute_sql(f'TRUNCATE "{table}" CASCADE')
        db.execute_sql(f'ANALYZE "{table}"')


class Ours:
    """A broker, the suite, a tracked and a unique actor, and a warmed-up paused worker."""

    def __init__(self, database: str, schema: str, threads: int) -> None:
        self.ns, self.broker, self.suite = rig(database)
        self.done = 0
        self.lock = threading.Lock()

        def finish() -> None:
            with self.lock:
                self.done += 1

        @dramatiq.actor(queue_name="tracked", track=True)
        def tracked(i):
            finish()

        @dramatiq.actor(queue_name="unique", unique_args=["i"], unique_lock="until_and_while_executing")
        def unique(i):
            finish()

        self.actors = {"tracked": tracked, "unique": unique}
        self.admin = pw.PostgresqlDatabase(**PG, options=f"-csearch_path={schema}")
        self.tables = [r[0] for r in self.admin.execute_sql(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))]
        analyze(self.admin, self.tables, truncate=True)
        self.worker = dramatiq.Worker(self.broker, queues={"tracked", "unique"}, worker_timeout=20,
                                      worker_threads=threads)
        self.worker.start()
        for actor in self.actors.values():
            for i in range(4 * threads):
                actor.send(-1000 - i)
        self._wait(8 * threads)
        self.worker.pause()
        analyze(self.admin, self.tables)

    def send(self, kind: str, keys: range) -> float:
        actor = self.actors[kind]
        start = time.perf_counter()
        for i in keys:
            actor.send(i)
        return time.perf_counter() - start

    def process(self, n: int) -> float:
        analyze(self.admin, self.tables)
        self.done = 0
        start = time.perf_counter()
        self.worker.resume()
        self._wait(n)
        secs = time.perf_counter() - start
        self.worker.pause()
        return secs

    def refused(self, n: int) -> tuple[float, float]:
        """Seconds per refused send: a key sent just before; keys this process did not send."""
        unique = self.actors["unique"]
        unique.send(-1)
        start = time.perf_counter()
        for _ in range(n):
            unique.send(-1)
        again = (time.perf_counter() - start) / n
        keys = range(10**6, 10**6 + n)
        for i in keys:
            unique.send(i)
        recent._recent = recent._Recent(recent.RECENT_KEYS)  # as in another process
        start = time.perf_counter()
        for i in keys:
            unique.send(i)
        new = (time.perf_counter() - start) / n
        return again, new

    def _wait(self, n: int) -> None:
        deadline = time.perf_counter() + 300
        while self.done < n and time.perf_counter() < deadline:
            time.sleep(0.002)
        if self.done < n:
            raise SystemExit(f"ours: only {self.done}/{n} jobs ran")

    def close(self) -> None:
        self.worker.stop()
        self.broker.flush_all()
        keys = list(self.broker.client.scan_iter(match=f"*{self.ns}*", count=1000))
        if keys:
            self.broker.client.delete(*keys)
        self.suite.db.close()
        self.broker.close()
        self.admin.close()


class Theirs:
    """A Procrastinate app on its own schema: sync defers, its async worker."""

    def __init__(self, schema: str, concurrency: int) -> None:
        self.concurrency = concurrency
        conninfo = f"host={PG['host']} dbname={PG['database']} user={PG['user']} options=-csearch_path={schema}"
        size = concurrency + 2
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=conninfo, min_size=size, max_size=size))

        @self.app.task(queue="bench", name="noop")
        async def noop(i):
            pass

        self.noop = noop
        self.app.open()
        self.app.schema_manager.apply_schema()
        self.admin = pw.PostgresqlDatabase(**PG, options=f"-csearch_path={schema}")
        self.tables = ["procrastinate_jobs", "procrastinate_events"]

    def round_start(self) -> None:
        analyze(self.admin, self.tables, truncate=True)

    def send(self, kind: str, keys: range) -> float:
        noop = self.noop
        start = time.perf_counter()
        if kind == "tracked":
            for i in keys:
                noop.defer(i=i)
        else:
            for i in keys:
                noop.configure(queueing_lock=f"u{i}", lock=f"u{i}").defer(i=i)
        return time.perf_counter() - start

    def process(self, n: int) -> float:
        analyze(self.admin, self.tables)

        async def run() -> float:
            async with self.app.open_async():
                start = time.perf_counter()
                await self.app.run_worker_async(
                    queues=["bench"], concurrency=self.concurrency, wait=False, install_signal_handlers=False)
                return time.perf_counter() - start

        secs = asyncio.run(run())
        self.app.open()  # open_async closed the sync pool the defers use
        left = self.admin.execute_sql("SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'")
        if left.fetchone()[0]:
            raise SystemExit("theirs: jobs left unprocessed")
        return secs

    def refused(self, n: int) -> tuple[float, float]:
        noop = self.noop

        def dup(lock: str) -> None:
            try:
                noop.configure(queueing_lock=lock).defer(i=0)
            except procrastinate.exceptions.AlreadyEnqueued:
                return
            raise SystemExit("theirs: a duplicate was not refused")

        noop.configure(queueing_lock="dup").defer(i=0)
        start = time.perf_counter()
        for _ in range(n):
            dup("dup")
        again = (time.perf_counter() - start) / n
        for i in range(n):
            noop.configure(queueing_lock=f"new{i}").defer(i=0)
        start = time.perf_counter()
        for i in range(n):
            dup(f"new{i}")
        new = (time.perf_counter() - start) / n
        return again, new

    def close(self) -> None:
        self.app.close()
        self.admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--refused", type=int, default=500, help="refused sends timed per round and kind")
    args = parser.parse_args()
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    n, c = args.jobs, args.concurrency
    print(f"{time.strftime('%Y-%m-%d %H:%M')} UTC, {os.cpu_count()} cores, procrastinate "
          f"{procrastinate.__version__ if hasattr(procrastinate, '__version__') else '?'}, {n} jobs, "
          f"concurrency {c}, {args.rounds} rounds")
    rows: dict[str, list[tuple[float, float]]] = {}

    def keep(name: str, ours: float, theirs: float) -> None:
        rows.setdefault(name, []).append((ours, theirs))

    theirs_schema = f"procr_{uuid.uuid4().hex[:8]}"
    admin = pw.PostgresqlDatabase(**PG)
    admin.execute_sql(f'CREATE SCHEMA "{theirs_schema}"')
    try:
        with pg_database() as url:
            schema = url.rsplit("%3D", 1)[1]
            theirs = Theirs(theirs_schema, c)
            try:
                for r in range(args.rounds):
                    ours = Ours(url, schema, c)
                    theirs.round_start()
                    try:
                        base = r * 10 * n
                        sides = [("ours", ours), ("theirs", theirs)]
                        if r % 2:
                            sides.reverse()
                        got: dict[tuple[str, str], float] = {}
                        for kind, offset in (("tracked", 0), ("unique", n)):
                            for side, impl in sides:
                                keys = range(base + offset, base + offset + n)
                                got[(side, f"send {kind}")] = n / impl.send(kind, keys)
                            for side, impl in sides:
                                got[(side, f"process {kind}")] = n / impl.process(n)
                        for side, impl in sides:
                            again, new = impl.refused(args.refused)
                            got[(side, "refused, recent")] = again * 1e6
                            got[(side, "refused, new")] = new * 1e6
                    finally:
                        ours.close()
                    for name in ("send tracked", "send unique", "process tracked", "process unique",
                                 "refused, recent", "refused, new"):
                        keep(name, got[("ours", name)], got[("theirs", name)])
                    print(f"round {r + 1}: " + ", ".join(
                        f"{name} {o:.0f}/{t:.0f}" for name, ((o, t), *_) in
                        ((k, v[-1:]) for k, v in rows.items())), flush=True)
            finally:
                theirs.close()
    finally:
        admin.execute_sql(f'DROP SCHEMA "{theirs_schema}" CASCADE')
        admin.close()

    print(f"\n{'measure':<22}{'ours':>16}{'Procrastinate':>16}{'ratio, median (range)':>28}")
    for name, pairs in rows.items():
        unit = "µs" if name.startswith("refused") else "/s"
        # Speed: ours / theirs (above 1: ours faster).  Cost: ours / theirs (below 1: ours cheaper).
        ratios = sorted(o / t for o, t in pairs)
        o = statistics.median(p[0] for p in pairs)
        t = statistics.median(p[1] for p in pairs)
        print(f"{name:<22}{o:>13.0f} {unit}{t:>13.0f} {unit}"
              f"{statistics.median(ratios):>12.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})")


if __name__ == "__main__":
    main()

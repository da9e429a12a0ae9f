"""Processing by a real ``dramatiq`` worker (the CLI), as ratios to plain Dramatiq.

    python tests/benchmarks/bench_worker.py [--jobs 3000] [--runs 5] [--processes 2] [--threads 8]

Issue 16, part 2: with ``python -m dramatiq worker_app --processes 2 --threads 8``, tracked jobs
at least 0.7 and unique jobs at least 0.6 of plain Dramatiq's processing rate, in every run, on
PostgreSQL.  Each run has a fresh PostgreSQL schema, Redis namespace and worker; the kinds of no-op
job (``worker_app.py``) take turns, in an order that rotates from run to run.  Besides ``plain``,
``tracked`` and ``unique``, ``floor`` is plain Dramatiq whose actor makes the two statements a tracked
job costs the database (start, outcome) by hand: what ``tracked`` could reach on this machine if
nothing of ours but those statements cost anything.

How a kind is timed (fair to both sides, and the worker's start-up left out):

* The worker is started once per run and warmed up on a few jobs of every kind, so its processes
  have booted and opened their connections before anything is timed.
* For each kind, the worker processes are stopped (SIGSTOP) while ``--warm + --jobs`` jobs are
  queued (one producer thread, here), then let go (SIGCONT).  Idle, Dramatiq's Redis consumer
  sleeps up to a second between polls, and the two processes wake at different moments; so the
  clock starts only once the first ``--warm`` jobs are done (by then both are busy), and stops
  when the rest are.
* Progress is read from the broker alone, the same way for every kind: the queue's
  ``<namespace>:<queue>.msgs`` hash holds a message until it is acked, and a message is acked only
  after every ``after_process_message`` hook (the job row's outcome) has run.  The benchmark polls
  its length every 2 ms; the actors do nothing, not even count.
* Not timed: every tracked, unique or floor job's row must then read ``succeeded`` with its start and
  end recorded, and no queue lock of the run may be left in Redis.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import peewee as pw
from common import REDIS_URL, pg_database, rig
from worker_app import declare

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.workers import CliWorker  # noqa: E402

KINDS = ("plain", "tracked", "unique", "floor")
TARGETS = {"tracked": 0.7, "unique": 0.6}
FLOOR_ROWS = """INSERT INTO dramatiq_unique_jobs (app, message_id, actor_name, queue_name, args, kwargs, options,
    status, attempts, revision, created_at, enqueued_at, fencing_token)
SELECT '', md5(random()::text), 'floor', 'floor', '[]', '{}', '{}', 'queued', 0, 0, now(), now(), 0
FROM generate_series(1, %s) RETURNING id"""


class Run:
    """One schema, namespace, suite (for sending) and CLI worker."""

    def __init__(self, database: str, args: argparse.Namespace) -> None:
        self.database = database
        self.ns, self.broker, self.suite = rig(database)
        self.actors = declare()
        self.redis = self.broker.client
        self.sent = 0
        self.counts = dict.fromkeys(KINDS, 0)
        self.log = tempfile.NamedTemporaryFile(prefix="bench_worker_", suffix=".log", delete=False).name
        self.worker = CliWorker("tests.benchmarks.worker_app", {
            "BW_REDIS_URL": REDIS_URL, "BW_NAMESPACE": self.ns, "BW_DATABASE_URL": database,
        }, processes=args.processes, threads=args.threads, stderr_path=self.log)

    def send(self, kind: str, n: int) -> None:
        actor = self.actors[kind]
        self.counts[kind] += n
        if kind == "floor":  # its rows, as a send of a tracked actor would have left them
            for (i,) in self.suite.db.execute_sql(FLOOR_ROWS, (n,)).fetchall():
                actor.send(i)
            return
        for i in range(self.sent, self.sent + n):
            actor.send(i)
        self.sent += n

    def left(self, kind: str) -> int:
        """Messages of ``kind`` not acked yet."""
        return self.redis.hlen(f"{self.ns}:{kind}.msgs")

    def wait(self, kind: str, at_most: int, timeout: float) -> tuple[float, int]:
        """Poll until at most ``at_most`` messages are left: (when, how many were left)."""
        deadline = time.perf_counter() + timeout
        while True:
            left = self.left(kind)
            now = time.perf_counter()
            if left <= at_most:
                return now, left
            if now > deadline:
                raise SystemExit(f"{kind}: {left} messages still queued after {timeout:.0f} s; "
                                 f"worker log {self.log}:\n{self.tail()}")
            time.sleep(0.002)

    def tail(self) -> str:
        with open(self.log) as f:
            return "".join(f.readlines()[-30:])

    def warm_up(self, n: int) -> None:
        for kind in KINDS:
            self.send(kind, n)
        for kind in KINDS:
            self.wait(kind, 0, 120)  # includes the processes' boot

    def signal(self, sig: int) -> None:
        children = self.worker.children()
        if not children:
            raise SystemExit(f"no worker processes; worker log {self.log}:\n{self.tail()}")
        for pid in children:
            self.worker.signal_child(pid, sig)

    def process(self, kind: str, n: int, warm: int) -> float:
        """Jobs per second of ``kind``, over the last ``n`` of ``warm + n`` queued while stopped."""
        self.signal(signal.SIGSTOP)
        try:
            self.send(kind, warm + n)
        finally:
            self.signal(signal.SIGCONT)
        start, left = self.wait(kind, n, 300)
        end, _ = self.wait(kind, 0, 300)
        return left / (end - start)

    def check(self) -> None:
        """Every tracked and unique job's row done, its start and end recorded; no queue lock left."""
        db = pw.PostgresqlDatabase(None)
        db.init(**_pg_params(self.database))
        rows = dict(db.execute_sql(
            "SELECT actor_name, count(*) FROM dramatiq_unique_jobs WHERE status = 'succeeded' "
            "AND started_at IS NOT NULL AND finished_at IS NOT NULL GROUP BY actor_name").fetchall())
        db.close()
        for kind in ("tracked", "unique", "floor"):
            if rows.get(kind, 0) != self.counts[kind]:
                raise SystemExit(f"{kind}: {rows.get(kind)} rows succeeded, of {self.counts[kind]}")
        locks = [k for k in self.redis.scan_iter(match=f"{self.ns}*lock*", count=1000)]
        if locks:
            raise SystemExit(f"queue locks left: {locks[:5]}")

    def close(self) -> None:
        err = self.worker.stop()
        if "Traceback" in err:
            print(f"worker log {self.log} has a traceback (kept):\n{self.tail()}")
        else:
            os.unlink(self.log)
        self.broker.flush_all()
        keys = list(self.redis.scan_iter(match=f"*{self.ns}*", count=1000))
        if keys:
            self.redis.delete(*keys)
        self.suite.db.close()
        self.broker.close()


def _pg_params(url: str) -> dict:
    from common import PG
    schema = url.split("search_path%3D", 1)[1]
    return {**PG, "options": f"-csearch_path={schema}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000, help="timed jobs per kind and run")
    parser.add_argument("--warm", type=int, default=3000, help="jobs done before the clock starts")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; PostgreSQL; "
          f"dramatiq --processes {args.processes} --threads {args.threads}; {args.jobs} jobs timed "
          f"after {args.warm}")
    print(f"{'run':<5}{'order':<30}{'plain/s':>9}{'tracked/s':>11}{'unique/s':>10}{'floor/s':>9}"
          f"{'tracked':>9}{'unique':>8}{'floor':>7}{'load':>6}")
    ratios: dict[str, list[float]] = {kind: [] for kind in (*TARGETS, "floor")}
    for r in range(args.runs):
        order = KINDS[r % len(KINDS):] + KINDS[:r % len(KINDS)]
        load = os.getloadavg()[0]  # the machine is shared: what else ran shows here
        with pg_database() as url:
            run = Run(url, args)
            try:
                run.warm_up(20 * args.threads)
                rate = {kind: run.process(kind, args.jobs, args.warm) for kind in order}
                run.check()
            finally:
                run.close()
        for kind in ratios:
            ratios[kind].append(rate[kind] / rate["plain"])
        print(f"{r + 1:<5}{','.join(order):<30}{rate['plain']:>9.0f}{rate['tracked']:>11.0f}{rate['unique']:>10.0f}"
              f"{rate['floor']:>9.0f}{ratios['tracked'][-1]:>9.2f}{ratios['unique'][-1]:>8.2f}{ratios['floor'][-1]:>7.2f}{load:>6.1f}",
              flush=True)
    for kind, target in TARGETS.items():
        got = ratios[kind]
        met = sum(x >= target for x in got)
        print(f"{kind}: median {statistics.median(got):.2f} (range {min(got):.2f}-{max(got):.2f}); "
              f">= {target} in {met} of {len(got)} runs: {'met' if met == len(got) else 'NOT met'}")
    got = ratios["floor"]
    print(f"floor (plain + the two statements alone): median {statistics.median(got):.2f} "
          f"(range {min(got):.2f}-{max(got):.2f})")


if __name__ == "__main__":
    main()

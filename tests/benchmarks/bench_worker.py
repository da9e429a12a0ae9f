"""Processing by a real ``dramatiq`` worker (the CLI), as ratios to plain Dramatiq, and PostgreSQL's cost per job.

    python tests/benchmarks/bench_worker.py [--jobs 3000] [--runs 5] [--processes 2] [--threads 8] [--shared-pg]
                                            [--ceiling] [--wal-records]

Targets: with ``python -m dramatiq worker_app --processes 2 --threads 8``, tracked jobs
at least 0.75 and unique jobs at least 0.65 of plain Dramatiq's processing rate, in every run, on
PostgreSQL.  Each run has a fresh PostgreSQL schema, Redis namespace and worker; the kinds of no-op
job (``worker_app.py``) take turns, in an order that rotates from run to run.  Besides ``plain``,
``tracked`` and ``unique``, ``floor`` is plain Dramatiq whose actor makes the two statements a tracked
job costs the database (start, outcome) by hand: what ``tracked`` could reach on this machine if
nothing of ours but those statements cost anything.  With ``--ceiling``, ``floor8`` too: the same two
statements, each written for 8 jobs at once by every 8th job of a thread, with no wait for company and
no per-row values: what sharing statements between jobs could reach at best, not a design.

How a kind is timed (fair to both sides, and the worker's start-up left out):

* The worker is started once per run and warmed up on a few jobs of every kind, so its processes
  have booted and opened their connections before anything is timed.
* For each kind, the worker processes are stopped (SIGSTOP) while ``--warm + --jobs`` jobs are
  queued (one producer thread, here), then let go (SIGCONT).  Idle, Dramatiq's Redis consumer
  sleeps up to a second between polls, and the two processes wake at different moments; so the
  clock starts only once the first ``--warm`` jobs are done (by then both are busy), and stops
  when the rest are.
* While they are stopped, the job table is analyzed, as autovacuum would have analyzed it by then in
  production, so that the plans the workers keep are made for the table's size (see the ANALYZE below).
* Progress is read from the broker alone, the same way for every kind: the queue's
  ``<namespace>:<queue>.msgs`` hash holds a message until it is acked, and a message is acked only
  after every ``after_process_message`` hook (the job row's outcome) has run.  The benchmark polls
  its length every 2 ms; the actors do nothing, not even count.
* Not timed: every tracked, unique or floor job's row must then read ``succeeded`` with its start and
  end recorded, and no queue lock of the run may be left in Redis.

The database's cost per job of each kind, over the same timed part (the ``pg µs/job``, ``WAL B/job`` and
``commits/job`` rows): the CPU time (user + system) of all of PostgreSQL's processes, from ``/proc`` (the
postmaster's own and its waited-for children's, plus each live child's: a backend that exits meanwhile is
still counted), the WAL written (``pg_wal_lsn_diff`` of ``pg_current_wal_lsn()``), and the writing
transactions (each draws a transaction id: the next one's advance, ``pg_snapshot_xmax``).  ``plain`` makes no
statement: its figures are what the server spends idle (checkpointer, WAL writer, autovacuum).  So that
the CPU is the benchmark's alone, it runs by default on a throwaway cluster of its own
(``tests.servers.PostgresCluster``: ``initdb`` and ``pg_ctl`` from ``pg_config --bindir``, as the
``postgres`` user when run as root, with ``fsync`` on as in production: a commit waits for its WAL
flush), removed at the end; ``--shared-pg`` runs on the
test services' PostgreSQL (127.0.0.1:5432) instead, whose CPU other clients share (the benchmark must
run on its host, to read ``/proc``).
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
from common import PG, REDIS_URL, pg_database, rig
from worker_app import BATCH, declare

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.workers import CliWorker  # noqa: E402

KINDS = ("plain", "tracked", "unique", "floor")
TARGETS = {"tracked": 0.75, "unique": 0.65}
FLOOR_ROWS = """INSERT INTO dramatiq_unique_jobs (app, message_id, actor_name, queue_name, args, kwargs, options,
    status, attempts, revision, created_at, enqueued_at, fencing_token)
SELECT '', md5(random()::text), %s, %s, '[]', '{}', '{}', 'queued', 0, 0, now(), now(), 0
FROM generate_series(1, %s) RETURNING id"""


class PgCost:
    """A PostgreSQL server's CPU time, all its processes, its WAL position and its next transaction id
    (each writing transaction draws one), sampled together."""

    def __init__(self, pg: dict) -> None:
        self.pg = pg
        self.db = pw.PostgresqlDatabase(**pg)
        backend = self.db.execute_sql("SELECT pg_backend_pid()").fetchone()[0]
        self.postmaster = _stat(backend)[1]
        self.tick = os.sysconf("SC_CLK_TCK")

    def cpu(self) -> float:
        """Seconds of CPU spent by the server so far (ended children included, as the postmaster waited for them)."""
        _, _, utime, stime, cutime, cstime = _stat(self.postmaster)
        ticks = utime + stime + cutime + cstime
        with open(f"/proc/{self.postmaster}/task/{self.postmaster}/children") as f:
            for pid in f.read().split():
                try:
                    ticks += sum(_stat(int(pid))[2:4])
                except OSError:  # ended meanwhile: its time is the postmaster's cutime now
                    pass
        return ticks / self.tick

    def sample(self) -> tuple[float, str, int]:
        lsn, xid = self.db.execute_sql(
            "SELECT pg_current_wal_lsn(), pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()
        return self.cpu(), lsn, xid

    def per_job(self, before: tuple[float, str, int], after: tuple[float, str, int],
                jobs: int) -> tuple[float, float, float]:
        """(µs of server CPU, bytes of WAL, writing transactions) per job between two samples."""
        wal = self.db.execute_sql("SELECT pg_wal_lsn_diff(%s, %s)", (after[1], before[1])).fetchone()[0]
        return (after[0] - before[0]) * 1e6 / jobs, float(wal) / jobs, (after[2] - before[2]) / jobs

    def records(self, before: tuple[float, str, int], after: tuple[float, str, int],
                jobs: int) -> list[tuple[str, float, float, float]]:
        """The WAL between two samples by kind of record: (kind, records, bytes, of which full-page
        images) per job, the largest first (``pg_walinspect``)."""
        self.db.execute_sql("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        rows = self.db.execute_sql(
            "SELECT \"resource_manager/record_type\", count, combined_size, fpi_size "
            "FROM pg_get_wal_stats(%s, %s, true) WHERE count > 0 ORDER BY combined_size DESC",
            (before[1], after[1])).fetchall()
        return [(kind, count / jobs, size / jobs, fpi / jobs) for kind, count, size, fpi in rows]

    def close(self) -> None:
        self.db.close()


def _stat(pid: int) -> tuple[int, int, int, int, int, int]:
    """(pid, parent pid, utime, stime, cutime, cstime) from /proc/PID/stat, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
    return pid, int(fields[1]), int(fields[11]), int(fields[12]), int(fields[13]), int(fields[14])


class Run:
    """One schema, namespace, suite (for sending) and CLI worker."""

    def __init__(self, database: str, args: argparse.Namespace, cost: PgCost, kinds: tuple[str, ...]) -> None:
        self.database = database
        self.kinds = kinds
        self.stray = BATCH * args.processes * args.threads  # floor8 rows all threads may hold unwritten (< BATCH each)
        self.cost = cost
        #: (µs of server CPU, bytes of WAL, writing transactions) per job of each kind, over its timed part.
        self.per_job: dict[str, tuple[float, float, float]] = {}
        self.wal_records: bool = args.wal_records
        #: With --wal-records: the WAL of each kind's timed part by kind of record, per job.
        self.records: dict[str, list[tuple[str, float, float, float]]] = {}
        self.ns, self.broker, self.suite = rig(database)
        self.actors = declare()
        self.redis = self.broker.client
        self.sent = 0
        self.counts = dict.fromkeys(kinds, 0)
        self.log = tempfile.NamedTemporaryFile(prefix="bench_worker_", suffix=".log", delete=False).name
        self.worker = CliWorker("tests.benchmarks.worker_app", {
            "BW_REDIS_URL": REDIS_URL, "BW_NAMESPACE": self.ns, "BW_DATABASE_URL": database,
        }, processes=args.processes, threads=args.threads, stderr_path=self.log)

    def send(self, kind: str, n: int) -> None:
        actor = self.actors[kind]
        self.counts[kind] += n
        if kind.startswith("floor"):  # its rows, as a send of a tracked actor would have left them
            for (i,) in self.suite.db.execute_sql(FLOOR_ROWS, (kind, kind, n)).fetchall():
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
        for kind in self.kinds:
            self.send(kind, n)
        for kind in self.kinds:
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
            # As autovacuum has by then in production: statistics of the table as it is, so that the
            # plans the workers' connections keep are made anew for its size (not for the empty table
            # of the run's start: a statement over arrays of rows would read it whole).
            self.suite.db.execute_sql("ANALYZE dramatiq_unique_jobs")
        finally:
            self.signal(signal.SIGCONT)
        start, left = self.wait(kind, n, 300)
        before = self.cost.sample()
        end, _ = self.wait(kind, 0, 300)
        after = self.cost.sample()
        self.per_job[kind] = self.cost.per_job(before, after, left)
        if self.wal_records and after[1] != before[1]:  # plain writes none
            self.records[kind] = self.cost.records(before, after, left)
        return left / (end - start)

    def check(self) -> None:
        """Every tracked and unique job's row done, its start and end recorded; no queue lock left."""
        db = pw.PostgresqlDatabase(None)
        db.init(**_pg_params(self.database, self.cost.pg))
        rows = dict(db.execute_sql(
            "SELECT actor_name, count(*) FROM dramatiq_unique_jobs WHERE status = 'succeeded' "
            "AND started_at IS NOT NULL AND finished_at IS NOT NULL GROUP BY actor_name").fetchall())
        db.close()
        for kind in self.kinds[1:]:
            if not 0 <= self.counts[kind] - rows.get(kind, 0) <= (self.stray if kind == "floor8" else 0):
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


def _pg_params(url: str, pg: dict) -> dict:
    schema = url.split("search_path%3D", 1)[1]
    return {**pg, "options": f"-csearch_path={schema}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000, help="timed jobs per kind and run")
    parser.add_argument("--warm", type=int, default=3000, help="jobs done before the clock starts")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--ceiling", action="store_true",
                        help="also floor8: the floor's two statements each written for 8 jobs at once")
    parser.add_argument("--shared-pg", action="store_true",
                        help="the test services' PostgreSQL (5432), not a cluster of the benchmark's own: "
                             "its CPU figures count other clients' work too")
    parser.add_argument("--wal-records", action="store_true",
                        help="also each kind's WAL per job by kind of record (pg_walinspect)")
    args = parser.parse_args()
    cluster = None
    if args.shared_pg:
        pg = PG
    else:
        from tests.servers import PostgresCluster

        cluster = PostgresCluster(fsync=True).start()
        pg = dict(database="postgres", host="127.0.0.1", port=cluster.port, user="postgres")
    cost = PgCost(pg)
    try:
        bench(args, pg, cost, "shared, 5432" if cluster is None else f"own cluster, port {cluster.port}")
    finally:
        cost.close()
        if cluster is not None:
            cluster.remove()


def bench(args: argparse.Namespace, pg: dict, cost: PgCost, where: str) -> None:
    kinds = KINDS + (("floor8",) if args.ceiling else ())
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; PostgreSQL ({where}); "
          f"dramatiq --processes {args.processes} --threads {args.threads}; {args.jobs} jobs timed "
          f"after {args.warm}")
    print(f"{'run':<5}{'order':<36}" + "".join(f"{kind + '/s':>11}" for kind in kinds)
          + "".join(f"{kind:>9}" for kind in kinds[1:]) + f"{'load':>6}")
    ratios: dict[str, list[float]] = {kind: [] for kind in kinds[1:]}
    costs: dict[str, list[tuple[float, float, float]]] = {kind: [] for kind in kinds}
    for r in range(args.runs):
        order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
        load = os.getloadavg()[0]  # the machine is shared: what else ran shows here
        with pg_database(pg) as url:
            run = Run(url, args, cost, kinds)
            try:
                run.warm_up(20 * args.threads)
                rate = {kind: run.process(kind, args.jobs, args.warm) for kind in order}
                run.check()
            finally:
                run.close()
        for kind in ratios:
            ratios[kind].append(rate[kind] / rate["plain"])
        for kind in kinds:
            costs[kind].append(run.per_job[kind])
        print(f"{r + 1:<5}{','.join(order):<36}" + "".join(f"{rate[kind]:>11.0f}" for kind in kinds)
              + "".join(f"{ratios[kind][-1]:>9.2f}" for kind in kinds[1:]) + f"{load:>6.1f}")
        for at, label, digits in ((0, "pg µs/job", 0), (1, "WAL B/job", 0), (2, "commits/job", 2)):
            print(f"{'':<5}{label:<36}" + "".join(f"{run.per_job[kind][at]:>11.{digits}f}" for kind in kinds),
                  flush=True)
        for kind, records in run.records.items():
            print(f"{'':<5}WAL of {kind} by record: per job, count / bytes (of which full-page images)")
            for name, count, size, fpi in records[:10]:
                print(f"{'':<9}{name:<32}{count:>7.2f}{size:>9.0f}{fpi:>9.0f}")
    for kind, target in TARGETS.items():
        got = ratios[kind]
        met = sum(x >= target for x in got)
        print(f"{kind}: median {statistics.median(got):.2f} (range {min(got):.2f}-{max(got):.2f}); "
              f">= {target} in {met} of {len(got)} runs: {'met' if met == len(got) else 'NOT met'}")
    for kind, what in (("floor", "plain + the two statements alone"),
                       ("floor8", f"plain + the two statements, each for {BATCH} jobs at once")):
        if kind in ratios:
            got = ratios[kind]
            print(f"{kind} ({what}): median {statistics.median(got):.2f} (range {min(got):.2f}-{max(got):.2f})")
    for kind in kinds:
        cpu, wal, xacts = ([c[at] for c in costs[kind]] for at in (0, 1, 2))
        print(f"{kind}: PostgreSQL CPU median {statistics.median(cpu):.0f} µs/job "
              f"(range {min(cpu):.0f}-{max(cpu):.0f}), "
              f"WAL median {statistics.median(wal):.0f} B/job (range {min(wal):.0f}-{max(wal):.0f}), "
              f"commits median {statistics.median(xacts):.2f}/job (range {min(xacts):.2f}-{max(xacts):.2f})")


if __name__ == "__main__":
    main()

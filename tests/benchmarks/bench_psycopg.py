"""psycopg 3's own statement preparation against our psycopg2 layer (storage/queries.py).

    python tests/benchmarks/bench_psycopg.py [--calls 200] [--rounds 15] [--jobs 2000] [--repeat 5]

On a fresh PostgreSQL schema (dropped afterwards), in one run:

* statement level, one thread: the hot statements through the project's own functions
  (the tracked send's INSERT, an attempt's start ``UPDATE ... RETURNING``, its outcome
  UPDATE, the unique holder SELECT), µs per call, on four kinds of connection that take
  turns within each round (the first round is a warm-up, not counted); the CPU time of the
  client thread and of the connection's server process (/proc/PID/schedstat: the server runs
  on this machine) as well as the wall time, since the machine is shared and its wall times noisy:

  - ``pg2+prepared``: psycopg2 with storage/queries.py's PREPARE/EXECUTE (the suite's default);
  - ``pg2 text``: psycopg2, statements sent as text (what a given psycopg2 database now gets);
  - ``pg3``: psycopg 3 (peewee's ``prefer_psycopg3``), its default ``prepare_threshold`` (5);
  - ``pg3 no-prep``: psycopg 3 with ``prepare_threshold=None`` (what a pooler needs);

  every connection has the connection parameters ``open_database`` gives a URL (timeouts,
  keepalives); our preparing is off on the psycopg 3 ones (psycopg 3 prepares by itself).
* end to end, as bench_throughput.py does (its ``Run``): tracked and unique enqueue
  (1 producer) and processing (an in-process worker of ``--threads``), psycopg2+prepared
  against psycopg 3, taking turns, ``--repeat`` times.

Prints figures and ratios; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

import dramatiq
import peewee as pw

sys.path.insert(0, str(Path(__file__).parents[2]))

from bench_throughput import Run  # noqa: E402  (this folder is sys.path[0] when run as a script)
from common import pg_database  # noqa: E402

from dramatiq_unique import JobModel  # noqa: E402
from dramatiq_unique.durable.outcome import outcome  # noqa: E402
from dramatiq_unique.storage import database as databases  # noqa: E402
from dramatiq_unique.storage import jobs, queries  # noqa: E402
from dramatiq_unique.storage.schema import create_or_migrate  # noqa: E402
from dramatiq_unique.unique.enqueue import row_fields  # noqa: E402

#: Connection kinds: label: (psycopg 3?, its prepare_threshold, or psycopg2 with our preparing on/off).
KINDS: dict[str, tuple[bool, Any]] = {
    "pg2+prepared": (False, True),
    "pg2 text": (False, False),
    "pg3": (True, 5),
    "pg3 no-prep": (True, None),
}
STATEMENTS = ("insert", "start", "outcome", "holder")


def open_kind(url: str, kind: str) -> pw.Database:
    """A database of ``kind`` on ``url``, with the parameters the suite gives a URL."""
    pg3, setting = KINDS[kind]
    given = databases.open_database(url, connect_timeout=10_000, timeout=60_000)
    params = {name: value for name, value in given.connect_params.items() if name != "prepare_threshold"}
    if pg3:
        params["prepare_threshold"] = setting
    db = databases.ReconnectingPostgresqlDatabase(given.database, prefer_psycopg3=pg3, **params)
    assert (type(db._adapter).__name__ == "Psycopg3Adapter") is pg3
    queries.enable(db, setting is True)
    return db


class Statements:
    """The four hot statements through storage/jobs.py, on one database."""

    def __init__(self, db: pw.Database, label: str) -> None:
        self.db, self.label = db, label
        self.config = types.SimpleNamespace(app="", extra_fields=(), fn=None)
        self.holds: list[str] = []
        JobModel.bind(db, bind_refs=False, bind_backrefs=False)
        #: The server process of this thread's connection, whose CPU time /proc tells to the ns.
        self.backend = db.execute_sql("SELECT pg_backend_pid()").fetchone()[0]

    def fields(self, i: int, hold: Optional[str] = None) -> dict[str, Any]:
        message = dramatiq.Message(queue_name="default", actor_name="noop", args=(i,), kwargs={}, options={})
        fields = row_fields(self.config, message, None)
        if hold is not None:
            fields["unique_hold"] = hold
        return fields

    def server_cpu(self) -> float:
        """Seconds of CPU the connection's server process has used (/proc/PID/schedstat, in ns)."""
        with open(f"/proc/{self.backend}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9

    def round(self, n: int) -> dict[str, tuple[float, float, float]]:
        """(wall, this thread's CPU, the server process's CPU) µs per call of each statement, n calls each."""
        JobModel.bind(self.db, bind_refs=False, bind_backrefs=False)
        out: dict[str, tuple[float, float, float]] = {}
        clock: list[float] = []

        def tick() -> None:
            clock[:] = [time.perf_counter(), time.thread_time(), self.server_cpu()]

        def tock(name: str) -> None:
            now = (time.perf_counter(), time.thread_time(), self.server_cpu())
            took = [(b - a) / n * 1e6 for a, b in zip(clock, now, strict=True)]
            out[name] = (took[0], took[1], took[2])

        rows = [self.fields(i) for i in range(n)]
        tick()
        ids = [jobs.adopt(JobModel, f)[0] for f in rows]
        tock("insert")
        tick()
        started = [jobs.start(JobModel, i, revision=0, lease_ms=60_000, worker="bench:1", release_hold=False)
                   for i in ids]
        tock("start")
        assert all(job is not None for job in started)
        done = types.SimpleNamespace(failed=False)
        fields = [outcome(done, None, None, retries=True, retry_enqueued=False)[0] for _ in started]
        tick()
        for job, f in zip(started, fields, strict=True):
            assert jobs.finish(JobModel, job, release_hold=False, lease_until=None, **f)
        tock("outcome")
        if not self.holds:  # the rows whose holds the lookups find (not timed)
            self.holds = [f"bench-{self.label}-{uuid.uuid4().hex}" for _ in range(n)]
            for i, hold in enumerate(self.holds):
                jobs.adopt(JobModel, self.fields(i, hold))
        tick()
        for hold in self.holds:
            assert jobs.read_holder(JobModel, hold) is not None
        tock("holder")
        return out


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, statistics.median(values), q3


def bench_statements(url: str, args: argparse.Namespace) -> None:
    dbs = {kind: open_kind(url, kind) for kind in KINDS}
    base = next(iter(KINDS))  # the ratios' base: psycopg2, prepared
    JobModel.bind(dbs[base], bind_refs=False, bind_backrefs=False)
    create_or_migrate(JobModel)
    benches = {kind: Statements(db, kind) for kind, db in dbs.items()}
    rows = (*STATEMENTS, "sum")
    # figures[measure][kind][statement]: one value per round; measures: wall, client CPU, server CPU, CPU.
    figures: dict[str, dict[str, dict[str, list[float]]]] = {
        m: {k: {s: [] for s in rows} for k in KINDS} for m in ("wall", "client", "server", "cpu")
    }
    order = list(KINDS)
    for r in range(args.rounds + 1):
        if r == 1:
            # Statistics for the rows the warm-up wrote (and plans made again on them): on the empty table's,
            # a generic plan of the holder lookup chosen in the warm-up read every row of the app, by kind
            # at random (the lookups grew to over 1 ms).  A deployed table is analysed by autovacuum.
            dbs[base].execute_sql(f'ANALYZE "{JobModel._meta.table_name}"')
        for kind in order if r % 2 else reversed(order):  # alternate the order: no kind always goes first
            got = benches[kind].round(args.calls)
            if not r:  # round 0 warms up: connections, prepared statements, caches
                continue
            for s in STATEMENTS:
                wall, client, server = got[s]
                for m, v in (("wall", wall), ("client", client), ("server", server), ("cpu", client + server)):
                    figures[m][kind][s].append(v)
            for m in figures:
                figures[m][kind]["sum"].append(sum(figures[m][kind][s][-1] for s in STATEMENTS))
    # Check that each kind did as it says: the statements prepared on its connection (and it is the same one).
    JobModel.bind(dbs[base], bind_refs=False, bind_backrefs=False)
    held = {k: db.execute_sql("SELECT count(*), pg_backend_pid() FROM pg_prepared_statements").fetchone()
            for k, db in dbs.items()}
    assert all(pid == benches[k].backend for k, (_n, pid) in held.items())
    for db in dbs.values():
        db.close()
    med = {m: {k: {s: statistics.median(v) for s, v in per.items()} for k, per in kinds.items()}
           for m, kinds in figures.items()}
    print(f"\n== statements, one thread, {args.calls} calls x {args.rounds} rounds, kinds taking turns: median µs "
          f"per call: CPU (client + server process), wall; the ratio to {base}: of the CPU medians, and of the wall "
          "time paired by round, median [quartiles]; above 1 is slower")
    print(f"{'statement':<10}" + "".join(f"{k:>38}" for k in KINDS))
    for s in rows:
        cells = []
        for k in KINDS:
            ratios = [a / b for a, b in zip(figures["wall"][k][s], figures["wall"][base][s], strict=True)]
            q1, q2, q3 = quartiles(ratios)
            cpu = f"{med['client'][k][s]:.0f}+{med['server'][k][s]:.0f}"
            cells.append(f"{cpu} {med['cpu'][k][s] / med['cpu'][base][s]:.2f}, "
                         f"{med['wall'][k][s]:.0f} {q2:.2f} [{q1:.2f}-{q3:.2f}]")
        print(f"{s:<10}" + "".join(f"{c:>38}" for c in cells))
    print("prepared statements on each connection: " + ", ".join(f"{k} {n}" for k, (n, _pid) in held.items()))


def bench_end_to_end(url: str, args: argparse.Namespace) -> None:
    """Rates of tracked and unique enqueue and processing, psycopg2 (prepared) vs
    psycopg 3 (default)."""
    kinds = (next(iter(KINDS)), "pg3")
    secs: dict[tuple, list[float]] = {}

    def run_on(kind: str) -> Run:
        run = Run(open_kind(url, kind))
        queries.enable(run.suite.db, KINDS[kind][1] is True)  # setup() turns our preparing on: as the kind says
        return run

    def keep(key: tuple, took: float) -> None:
        secs.setdefault(key, []).append(took)

    for r in range(args.repeat):
        for kind in kinds if r % 2 else reversed(kinds):
            run = run_on(kind)
            try:
                run.enqueue("tracked", 20, 1)  # warm-up
                for job in ("tracked", "unique"):
                    keep(("enqueue", job, kind), run.enqueue(job, args.jobs, 1))
            finally:
                run.close()
            for job in ("tracked", "unique"):
                run = run_on(kind)  # a fresh broker each time: a stopped worker leaves its middleware behind
                try:
                    keep(("process", job, kind), run.process(job, args.jobs, args.threads))
                finally:
                    run.close()
    print(f"\n== end to end, {args.jobs} no-op jobs, Redis broker, {args.repeat} repeats: best jobs/s, and the "
          f"ratio pg3 / {kinds[0]} of the best, and paired by repeat: median [min-max]; above 1 is faster")
    print(f"{'measure':<36}{kinds[0]:>14}{'pg3':>8}{'best':>7}{'paired':>20}")
    for what, width in (("enqueue", "1 producer"), ("process", f"{args.threads} worker threads")):
        for job in ("tracked", "unique"):
            a, b = (secs[(what, job, k)] for k in kinds)
            paired = [x / y for x, y in zip(a, b, strict=True)]
            spread = f"{statistics.median(paired):.2f} [{min(paired):.2f}-{max(paired):.2f}]"
            print(f"{f'{job} {what} ({width})':<36}{args.jobs / min(a):>14.0f}{args.jobs / min(b):>8.0f}"
                  f"{min(a) / min(b):>7.2f}{spread:>20}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls of each statement per round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", choices=["statements", "end-to-end"])
    args = parser.parse_args()
    import psycopg
    import psycopg2

    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; psycopg2 {psycopg2.__version__.split()[0]}, "
          f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__}), peewee {pw.__version__}")
    steps: list[Callable[[str, argparse.Namespace], Any]] = []
    if args.only != "end-to-end":
        steps.append(bench_statements)
    if args.only != "statements":
        steps.append(bench_end_to_end)
    for step in steps:
        with pg_database() as url:
            step(url, args)


if __name__ == "__main__":
    main()

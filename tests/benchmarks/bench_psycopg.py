"""psycopg 3's own statement preparation against our psycopg2 layer (storage/prepared.py), issue 16 part 3.

    python tests/benchmarks/bench_psycopg.py [--calls 500] [--rounds 6] [--jobs 2000] [--repeat 3]

On a fresh PostgreSQL schema (dropped afterwards), in one run:

* statement level, one thread: the hot statements through the project's own functions
  (the tracked send's INSERT, an attempt's start ``UPDATE ... RETURNING``, its outcome
  UPDATE, the unique holder SELECT), µs per call, on four kinds of connection that take
  turns within each round (the first round is a warm-up, not counted):

  - ``pg2+prepared``: psycopg2 with prepared.py's PREPARE/EXECUTE (the default today);
  - ``pg2 text``: psycopg2, statements sent as text (``prepared_statements=False``);
  - ``pg3``: psycopg 3 (peewee's ``prefer_psycopg3``), its default ``prepare_threshold`` (5);
  - ``pg3 no-prep``: psycopg 3 with ``prepare_threshold=None`` (what a pooler needs);

  every connection has the connection parameters ``open_database`` gives a URL (timeouts,
  keepalives); prepared.py is off on the psycopg 3 ones (its EXECUTE takes no bound parameters).
* end to end, as bench_throughput.py does (its ``Run``): tracked and unique enqueue
  (1 producer) and processing (an in-process worker of ``--threads``), psycopg2+prepared
  against psycopg 3, taking turns, best of ``--repeat``.

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
from dramatiq_unique.storage import jobs, prepared, statements  # noqa: E402
from dramatiq_unique.storage.models import create_tables  # noqa: E402
from dramatiq_unique.unique.enqueue import row_fields  # noqa: E402

#: Connection kinds: (label, psycopg 3?, prepare_threshold or prepared.py on/off).
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
    db = databases.open_database(url, connect_timeout=10_000, timeout=60_000)
    if pg3:
        params = dict(db.connect_params, prefer_psycopg3=True, prepare_threshold=setting)
        db = databases.ReconnectingPostgresqlDatabase(db.database, **params)
        assert type(db._adapter).__name__ == "Psycopg3Adapter"
    prepared.enable(db, setting is True)
    return db


class Statements:
    """The four hot statements through storage/jobs.py and storage/statements.py, on one database."""

    def __init__(self, db: pw.Database, label: str) -> None:
        self.db, self.label = db, label
        self.config = types.SimpleNamespace(app="", extra_fields=(), fn=None)
        self.holds: list[str] = []

    def fields(self, i: int, hold: Optional[str] = None) -> dict[str, Any]:
        message = dramatiq.Message(queue_name="default", actor_name="noop", args=(i,), kwargs={}, options={})
        fields = row_fields(self.config, message, None)
        if hold is not None:
            fields["unique_hold"] = hold
        return fields

    def round(self, n: int) -> dict[str, float]:
        """µs per call of each statement, n calls each."""
        JobModel.bind(self.db, bind_refs=False, bind_backrefs=False)
        out: dict[str, float] = {}
        rows = [self.fields(i) for i in range(n)]
        t = time.perf_counter()
        ids = [jobs.insert(JobModel, f) for f in rows]
        out["insert"] = (time.perf_counter() - t) / n * 1e6
        t = time.perf_counter()
        started = [jobs.start(JobModel, i, revision=0, lease_ms=60_000, worker="bench:1", release_hold=False)
                   for i in ids]
        out["start"] = (time.perf_counter() - t) / n * 1e6
        assert all(job is not None for job in started)
        done = types.SimpleNamespace(failed=False)
        fields = [outcome(done, None, None, retries=True, retry_enqueued=False)[0] for _ in started]
        t = time.perf_counter()
        for job, f in zip(started, fields, strict=True):
            assert jobs.finish(JobModel, job, release_hold=False, lease_until=None, **f)
        out["outcome"] = (time.perf_counter() - t) / n * 1e6
        if not self.holds:  # the rows whose holds the lookups find (not timed)
            self.holds = [f"bench-{self.label}-{uuid.uuid4().hex}" for _ in range(n)]
            for i, hold in enumerate(self.holds):
                jobs.insert(JobModel, self.fields(i, hold))
        t = time.perf_counter()
        for hold in self.holds:
            assert statements.holder(JobModel, hold) is not None
        out["holder"] = (time.perf_counter() - t) / n * 1e6
        return out


def bench_statements(url: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    dbs = {kind: open_kind(url, kind) for kind in KINDS}
    JobModel.bind(dbs["pg2+prepared"], bind_refs=False, bind_backrefs=False)
    create_tables(dbs["pg2+prepared"], [JobModel])
    benches = {kind: Statements(db, kind) for kind, db in dbs.items()}
    figures: dict[str, dict[str, list[float]]] = {k: {s: [] for s in STATEMENTS} for k in KINDS}
    order = list(KINDS)
    for r in range(args.rounds + 1):
        for kind in order if r % 2 else reversed(order):  # alternate the order: no kind always goes first
            got = benches[kind].round(args.calls)
            if r:  # round 0 warms up: connections, prepared statements, caches
                for s in STATEMENTS:
                    figures[kind][s].append(got[s])
    # Check that each kind did as it says: the statements prepared on its connection.
    JobModel.bind(dbs["pg2+prepared"], bind_refs=False, bind_backrefs=False)
    held = {k: db.execute_sql("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] for k, db in dbs.items()}
    for db in dbs.values():
        db.close()
    medians = {k: {s: statistics.median(v) for s, v in per.items()} for k, per in figures.items()}
    base = medians["pg2+prepared"]
    print(f"\n== statements, one thread, {args.calls} calls x {args.rounds} rounds: median µs per call "
          "(ratio to pg2+prepared; above 1 is slower)")
    print(f"{'statement':<10}" + "".join(f"{k:>24}" for k in KINDS))
    for s in STATEMENTS:
        cells = [f"{medians[k][s]:7.0f} ({medians[k][s] / base[s]:.2f}) "
                 f"[{min(figures[k][s]):.0f}-{max(figures[k][s]):.0f}]" for k in KINDS]
        print(f"{s:<10}" + "".join(f"{c:>24}" for c in cells))
    total = {k: sum(medians[k].values()) for k in KINDS}
    print(f"{'sum':<10}" + "".join(f"{f'{total[k]:7.0f} ({total[k] / total[order[0]]:.2f})':>24}" for k in KINDS))
    print("prepared statements on each connection: " + ", ".join(f"{k} {n}" for k, n in held.items()))
    return medians


def bench_end_to_end(url: str, args: argparse.Namespace) -> None:
    """Rates of tracked and unique enqueue and processing, psycopg2+prepared vs psycopg 3 (default)."""
    kinds = ("pg2+prepared", "pg3")
    best: dict[tuple, float] = {}

    def run_on(kind: str) -> Run:
        run = Run(open_kind(url, kind))  # setup() turns prepared.py on: set it back for psycopg 3
        prepared.enable(run.suite.db, KINDS[kind][1] is True)
        return run

    def keep(key: tuple, secs: float) -> None:
        best[key] = min(best.get(key, secs), secs)

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
    print(f"\n== end to end, {args.jobs} no-op jobs, Redis broker, best of {args.repeat}: jobs/s")
    print(f"{'measure':<36}{'pg2+prepared':>14}{'pg3':>10}{'pg3 / pg2':>11}")
    for what, width in (("enqueue", "1 producer"), ("process", f"{args.threads} worker threads")):
        for job in ("tracked", "unique"):
            a, b = (args.jobs / best[(what, job, k)] for k in kinds)
            print(f"{f'{job} {what} ({width})':<36}{a:>14.0f}{b:>10.0f}{b / a:>11.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="calls of each statement per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
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

"""What the fault scenarios share: their own servers, a fleet of `dramatiq` workers to kill or
freeze, re-drive passes in the test process, bounded waits, and the figures line."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

import dramatiq_unique
from dramatiq_unique import JobModel
from tests import fault_app
from tests.durable import RedisServer
from tests.faults import events as ev
from tests.servers import PostgresCluster
from tests.workers import CliWorker

logger = logging.getLogger(__name__)


def prefix() -> str:
    return f"dufault_{uuid.uuid4().hex[:10]}"


def fault_env(*, broker_url: str, database_url: str, key_prefix: str, lock_url: Optional[str] = None,
              log_url: Optional[str] = None, ttl: int = 1_000, limit: int = 2, heartbeat_timeout: int = 3_000,
              lost_after: int = 300, maintenance_chance: int = 1_000) -> dict[str, str]:
    """The ``DU_*`` variables of tests/fault_app.py, for the test's own build() and its workers."""
    env = {
        "DU_REDIS_URL": broker_url,
        "DU_NAMESPACE": f"{key_prefix}-broker",
        "DU_DATABASE_URL": database_url,
        "DU_KEY_PREFIX": key_prefix,
        "DU_TTL": str(ttl),
        "DU_LIMIT": str(limit),
        # Idle consumers poll at least every second (each poll is a heartbeat): 3 s without one
        # is a dead worker, whose unacknowledged messages go back to the queue.
        "DU_HEARTBEAT_TIMEOUT": str(heartbeat_timeout),
        "DU_LOST_AFTER": str(lost_after),
        "DU_MAINTENANCE_CHANCE": str(maintenance_chance),
    }
    if lock_url:
        env["DU_LOCK_REDIS_URL"] = lock_url
    if log_url:
        env["DU_LOG_REDIS_URL"] = log_url
    return env


class Fleet:
    """`dramatiq tests.fault_app` worker groups (one worker process each), kept at ``size``.

    :meth:`kill` SIGKILLs a worker process (its parent, seeing it die, stops, as
    Dramatiq's CLI does) and starts a replacement, as a process supervisor would;
    :meth:`stop` / :meth:`cont` freeze and resume one.  Every fault is written to the
    event log, after the signal was delivered.
    """

    def __init__(self, env: dict[str, str], log: fault_app.EventLog, log_dir: Path, *, size: int = 2,
                 threads: int = 3) -> None:
        self.env = {**env, "DU_FAULT_APP": "1"}
        self.log = log
        self.log_dir = log_dir
        self.threads = threads
        self.workers: list[CliWorker] = []
        self.retired: list[CliWorker] = []
        self.frozen: set[int] = set()
        for _ in range(size):
            self.spawn()

    def spawn(self) -> CliWorker:
        worker = CliWorker("tests.fault_app", self.env, processes=1, threads=self.threads,
                           stderr_path=self.log_dir / f"worker-{len(self.workers) + len(self.retired)}.log")
        self.workers.append(worker)
        return worker

    def pids(self) -> list[int]:
        return [pid for w in self.workers for pid in w.children()]

    def _find(self, pid: int) -> Optional[CliWorker]:
        """The live worker whose process ``pid`` is, or None once it exited."""
        return next((w for w in self.workers if pid in w.children()), None)

    def _owner(self, pid: int) -> CliWorker:
        owner = self._find(pid)
        if owner is None:
            raise StopIteration(f"process {pid} is no worker of this fleet")
        return owner

    def kill(self, pid: int) -> int:
        """SIGKILL worker process ``pid``, record it, start a replacement; returns the kill's seq."""
        owner = self._owner(pid)
        owner.kill_child(pid)
        wait_gone(pid)
        time.sleep(0.05)  # what the process sent before it died reached Redis before the kill's record
        seq = self.log.record("kill", pid=pid)
        self.workers.remove(owner)
        self.retired.append(owner)
        self.spawn()
        return seq

    def stop(self, pid: int) -> Optional[int]:
        """SIGSTOP worker process ``pid`` and record it; returns the stop's seq, or None when the
        process exited before it stopped (a worker that cannot reach PostgreSQL at start exits)."""
        owner = self._find(pid)
        if owner is None or not owner.signal_child(pid, signal.SIGSTOP) or not _wait_state(pid, "T"):
            return None
        time.sleep(0.05)
        self.frozen.add(pid)
        return self.log.record("stop", pid=pid)

    def cont(self, pid: int) -> int:
        seq = self.log.record("cont", pid=pid)
        assert self._owner(pid).signal_child(pid, signal.SIGCONT)
        self.frozen.discard(pid)
        return seq

    def close(self) -> str:
        """Stop every worker (resumed first, so that it can shut down); returns their stderr."""
        for worker in self.workers + self.retired:
            for pid in worker.children():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        out = []
        for worker in self.workers + self.retired:
            out.append(worker.stop(timeout=15))
        self.workers, self.retired = [], []
        return "\n".join(out)


def wait_gone(pid: int, timeout: float = 10) -> None:
    """Wait (bounded) for process ``pid`` to be gone or a zombie."""
    deadline = time.monotonic() + timeout
    while _state(pid) not in (None, "Z"):
        assert time.monotonic() < deadline, f"process {pid} still alive after SIGKILL"
        time.sleep(0.01)


def _wait_state(pid: int, state: str, timeout: float = 10) -> bool:
    """Wait for ``pid`` to reach ``state``; False if it exited first."""
    deadline = time.monotonic() + timeout
    while (now := _state(pid)) != state:
        if now in (None, "Z"):
            return False
        assert time.monotonic() < deadline, f"process {pid} not in state {state} but {now}"
        time.sleep(0.01)
    return True


def _state(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


class Redriver:
    """Re-drive passes in the test process, every ``interval`` seconds, until closed.

    A pass that fails (the database or the broker down) is counted and the next one tries again.
    """

    def __init__(self, app: fault_app.App, interval: float = 0.25) -> None:
        self.app = app
        self.interval = interval
        self.passes = 0
        self.errors = 0
        self.counts: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redriver", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                counts = dramatiq_unique.redrive(self.app.broker, suite=self.app.suite)
                self.passes += 1
                for name, value in dict(counts).items():
                    if isinstance(value, int) and not isinstance(value, bool):
                        self.counts[name] = self.counts.get(name, 0) + value
            except Exception as e:  # noqa: BLE001 - a fault in progress; the next pass tries again
                self.errors += 1
                logger.info("re-drive pass failed: %r", e)
        with contextlib.suppress(Exception):
            self.app.suite.close()  # this thread's connection

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "a re-drive pass hung"


def start_rig(cleanup: contextlib.ExitStack, env: dict[str, str], directory: Path, *,
              threads: int) -> tuple[fault_app.App, Fleet, Redriver]:
    """The app in the test process, a fleet of two worker processes and re-drive passes, each
    closed by ``cleanup`` (last started, first closed)."""
    app = fault_app.build(env)
    cleanup.callback(app.close)
    fleet = Fleet(env, app.log, directory, size=2, threads=threads)
    cleanup.callback(fleet.close)
    redriver = Redriver(app)
    cleanup.callback(redriver.close)
    return app, fleet, redriver


def postgres_rig(cleanup: contextlib.ExitStack, directory: Path, *, threads: int) -> tuple[
        PostgresCluster, fault_app.App, Fleet]:
    """:func:`start_rig` with the job table on a PostgreSQL cluster of the test's own, and broker, locks
    and event log on a redis-server of its own, each closed by ``cleanup``."""
    cluster = PostgresCluster()
    cleanup.callback(cluster.remove)
    cluster.start()
    server = RedisServer().start()
    cleanup.callback(server.stop)
    env = fault_env(broker_url=server.url, database_url=cluster.url, key_prefix=prefix())
    app, fleet, _ = start_rig(cleanup, env, directory, threads=threads)
    return cluster, app, fleet


def rows(app: fault_app.App) -> list[JobModel]:
    return list(JobModel.select())


def wait_all_succeeded(app: fault_app.App, timeout: float, expected: Optional[int] = None) -> list[JobModel]:
    """Wait, bounded, until every row of the test's job table succeeded; returns them."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = rows(app)
        except dramatiq_unique.DatabaseUnavailable:
            got = None
        if got and all(str(r.status) == "succeeded" for r in got) and (expected is None or len(got) == expected):
            return got
        if time.monotonic() > deadline:
            summary: dict[str, int] = {}
            for r in got or []:
                summary[str(r.status)] = summary.get(str(r.status), 0) + 1
            waiting = [f"{r.message_id[:8]} {r.status} attempts={r.attempts} {r.last_error!r}"[:200]
                       for r in got or [] if str(r.status) != "succeeded"][:10]
            raise AssertionError(f"not every job succeeded within {timeout}s: {summary}\n" + "\n".join(waiting))
        time.sleep(0.1)


def finish(app: fault_app.App, fleet: Fleet, directory: Path, *, timeout: float, linger: float = 1.0,
           expected: Optional[int] = None) -> tuple[list[JobModel], ev.Log]:
    """Wait, bounded, until every job succeeded; then ``linger`` seconds, so that a job that would
    run again after it succeeded (a copy, a zombie's retry) has the time to show it, and look
    again; stop the workers and read the event log.  Returns the rows and the parsed log."""
    wait_all_succeeded(app, timeout=timeout, expected=expected)
    time.sleep(linger)
    rows = wait_all_succeeded(app, timeout=10, expected=expected)
    fleet.close()
    return rows, ev.parse(read_events(app, directory))


def open_runs_by_pid(log: fault_app.EventLog, pids: list[int], kind: Optional[str] = None,
                     ) -> dict[int, list[ev.Run]]:
    """Runs in progress (started, no end yet) in each of ``pids``, from the event log."""
    parsed = ev.parse(log.read())
    out: dict[int, list[ev.Run]] = {pid: [] for pid in pids}
    for run in parsed.runs:
        if run.pid in out and run.end is None and run.lost is None and run.killed is None \
                and (kind is None or run.kind == kind):
            out[run.pid].append(run)
    return out


def read_events(app: fault_app.App, directory: Path) -> list[dict]:
    """The event log, also written to ``directory/events.txt`` (one event a line) for a post-mortem."""
    events = app.log.read()
    with open(directory / "events.txt", "w") as f:
        for e in events:
            f.write(" ".join(f"{k}={v}" for k, v in e.items()) + "\n")
    return events


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def report(line: str) -> None:
    """The figures of a scenario: on stdout (pytest -s shows it) and in the figures file if asked."""
    print("\n" + line, flush=True)
    path = os.environ.get("DU_FAULT_FIGURES")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")

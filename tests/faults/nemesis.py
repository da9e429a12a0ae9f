"""The nemesis: random faults from a seed, under a stream of sends, judged from a history.

A run starts servers of its own on free ports (a redis-server for the broker and the suite, a
throwaway PostgreSQL cluster for the job table: tests/servers.py), a fleet of `dramatiq` worker
processes (tests/faults/nemesis_app.py: every kind of actor), re-drive passes, and producer threads
that send jobs of every kind, duplicates among them.  Meanwhile the nemesis picks, every 2 to 6
seconds, one of these faults, which may overlap (a worker frozen while Redis is down):

- ``kill``: SIGKILL a worker process (a supervisor starts another);
- ``stop``: SIGSTOP a worker process for 0.5 to 8 s (past its leases and the broker's heartbeat
  timeout, or not), then SIGCONT;
- ``redis-kill``: kill -9 the redis-server, and start it again, empty, 0.5 to 3 s later;
- ``redis-pause``: ``DEBUG SLEEP`` or SIGSTOP the redis-server for 0.5 to 4 s;
- ``pg-restart``: crash PostgreSQL (every process of it SIGKILLed) and start it 0.5 to 3 s later;
- ``pg-pause``: SIGSTOP every process of PostgreSQL for 0.5 to 4 s (a storage stall), then SIGCONT;
- ``pg-link-stall``: hold up everything between one worker and PostgreSQL, or the replies only, for
  0.5 to 12 s (each worker reaches the servers through proxies of its own), as a network that stops
  getting packets through: a statement that reached the server commits, and its reply comes late;
- ``redis-link-stall``: the same on a worker's link to Redis: a fetch of Dramatiq's consumer that timed
  out meanwhile still moves messages into the worker's ack set.

Every job is sent with a ``time_limit`` of its run's length plus ``TIME_LIMIT_MARGIN``: a pause makes
Dramatiq's TimeLimit interrupt runs, in their bodies or in the hooks that record them.

Then every fault is healed, the sends stop, and the run waits (bounded) for every job to finish, then
sends a probe of jobs that keeps every worker busy a while; tests/faults/checker.py judges the history
with the job table.  The seed decides the faults, their
times, lengths and targets, and the sends; the machine decides the rest, so a replay repeats the
schedule, not every interleaving.

    python3 -m tests.faults.nemesis --minutes 30 --seed 1234    # a soak; prints its figures

``tests/faults/test_nemesis.py`` runs it for about three minutes in the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import secrets
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

from dramatiq_unique import JobModel
from tests.faults import checker
from tests.faults import history as hist
from tests.faults.harness import Redriver, prefix
from tests.faults.nemesis_app import KINDS, SHORT_MS, App, build
from tests.faults.nemesis_faults import FAULTS, Nemesis, NemesisFleet, debuggable_redis
from tests.servers import PostgresCluster

#: ms of the actors' run, drawn per send.
RUN_MS = (100, 300, 600, 1_000, 2_000)
#: ms of a probe job's run (see :func:`probe`).
PROBE_MS = 500
#: Seconds a worker process must have been up to be probed.
PROBE_MIN_AGE = 20.0
#: ms a run may take past its own ``run_ms`` before Dramatiq's TimeLimit (checking once a second) interrupts it:
#: a pause of Redis or PostgreSQL pushes runs past their limits, in their bodies or in the hooks after them.
TIME_LIMIT_MARGIN = 300
#: The leases a seed draws from (ms).
LEASES = (2_000, 3_000, 5_000)
#: The broker heartbeat timeouts a seed draws from (ms): shorter than most leases, or longer.
HEARTBEAT_TIMEOUTS = (2_000, 4_000, 8_000)

@dataclasses.dataclass
class Settings:
    """A run's settings; ``seconds`` is the length of the fault phase."""

    seconds: float
    seed: int
    workers: int = 3
    threads: int = 3
    producers: int = 2
    #: Seconds the jobs have, once every fault is healed, to finish (the run fails past it).
    recovery: float = 150
    #: Every lease (ms); None: drawn from the seed (LEASES).
    ttl: Optional[int] = None
    #: The broker's heartbeat_timeout (ms): a frozen worker's messages go to another worker after it,
    #: while its leases still run or after they ran out; None: drawn from the seed (HEARTBEAT_TIMEOUTS).
    heartbeat_timeout: Optional[int] = None
    maintenance_chance: int = 50_000
    lost_after: int = 1_000
    #: The kinds of fault drawn (None: all of them, nemesis_faults.FAULTS).
    faults: Optional[tuple[str, ...]] = None

    def __post_init__(self) -> None:
        rng = random.Random(f"{self.seed}-settings")
        if self.ttl is None:
            self.ttl = rng.choice(LEASES)
        if self.heartbeat_timeout is None:
            self.heartbeat_timeout = rng.choice(HEARTBEAT_TIMEOUTS)

    def replay(self) -> str:
        drawn = Settings(seconds=self.seconds, seed=self.seed)
        given = "".join(f" --{name.replace('_', '-')} {getattr(self, name)}" for name in ("ttl", "heartbeat_timeout")
                        if getattr(self, name) != getattr(drawn, name))
        if self.faults is not None:
            given += f" --faults {','.join(self.faults)}"
        return f"python3 -m tests.faults.nemesis --seed {self.seed} --minutes {self.seconds / 60:g}{given}"


def fresh_seed() -> int:
    return secrets.randbelow(1_000_000)


class Producers:
    """Threads sending jobs of every kind, with duplicates, each from a seeded stream."""

    def __init__(self, app: App, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), name=f"producer-{i}", daemon=True)
                        for i in range(settings.producers)]
        for thread in self.threads:
            thread.start()

    def _run(self, i: int) -> None:
        rng = random.Random(f"{self.settings.seed}-sends-{i}")
        names = list(KINDS)
        weights = [KINDS[name].weight for name in names]
        n = 0
        try:
            while not self.stop.is_set():
                kind = rng.choices(names, weights=weights)[0]
                key = f"k{rng.randrange(KINDS[kind].keys)}"
                run_ms = rng.choice(RUN_MS if KINDS[kind].beats else SHORT_MS)
                fail_until = rng.randint(1, 2) if kind in ("retry", "steps") else 0
                for _ in range(2 if rng.random() < 0.2 else 1):  # now and then the same job sent twice
                    n += 1
                    self.send(kind, (key, i * 1_000_000 + n, run_ms, fail_until), run_ms + TIME_LIMIT_MARGIN)
                self.stop.wait(rng.uniform(0.2, 0.8))
        finally:
            self.app.suite.close()  # this thread's connection

    def send(self, kind: str, args: tuple, time_limit: int) -> str:
        return send(self.app, kind, args, time_limit)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
            assert not thread.is_alive(), "a producer hung"


def send(app: App, kind: str, args: tuple, time_limit: int) -> str:
    """Send one job of ``kind``, recorded in the history; the id it was built with."""
    message = app.actors[kind].message_with_options(args=args, time_limit=time_limit)
    history = app.history
    history.record("send", built=message.message_id, kind=kind)
    try:
        sent = app.broker.enqueue(message)
    except Exception as e:  # noqa: BLE001 - a fault in progress: the checker accounts for it
        history.record("refused", built=message.message_id, error=f"{type(e).__name__}: {str(e)[:120]}")
    else:
        history.record("sent", built=message.message_id, returned=sent.message_id)
    return str(message.message_id)


def probe(app: App, fleet: NemesisFleet, settings: Settings, timeout: float = 60) -> None:
    """Once every job finished: enough jobs of half a second to keep every worker busy for a while, recorded
    as a ``probe`` with the live worker processes; the checker finds a worker that took none of them (its
    threads or its consumer ended while it went on heartbeating)."""
    live = fleet.live()
    pids = [pid for pid in live if _age(pid) > PROBE_MIN_AGE]  # a worker still booting may miss it
    # Enough for every live process, the young ones too: sized for the probed ones alone, the probe was
    # done by the others in two rounds while an idle consumer of a probed one slept between polls.
    jobs = [send(app, "retry", ("probe", 9_000_000 + n, PROBE_MS, 0), PROBE_MS + TIME_LIMIT_MARGIN)
            for n in range(4 * settings.threads * len(live))]
    app.history.record("probe", pids=pids, jobs=jobs)
    deadline = time.monotonic() + timeout
    while (unfinished(app) or 0) > 0 and time.monotonic() < deadline:
        time.sleep(0.5)


def _age(pid: int) -> float:
    """Seconds since process ``pid`` started (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time, in clock ticks
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return uptime - started / os.sysconf("SC_CLK_TCK")


def env_of(settings: Settings, *, redis_url: str, database_url: str, directory: Path) -> dict[str, str]:
    key_prefix = prefix()
    return {
        "DU_NEMESIS_APP": "1",
        "DU_REDIS_URL": redis_url,
        "DU_NAMESPACE": f"{key_prefix}-broker",
        "DU_DATABASE_URL": database_url,
        "DU_KEY_PREFIX": key_prefix,
        "DU_HISTORY_DIR": str(directory),
        "DU_TTL": str(settings.ttl),
        "DU_HEARTBEAT_TIMEOUT": str(settings.heartbeat_timeout),
        "DU_MAINTENANCE_CHANCE": str(settings.maintenance_chance),
        "DU_LOST_AFTER": str(settings.lost_after),
    }


def unfinished(app: App) -> Optional[int]:
    """Job rows not finished yet (None: the database does not answer)."""
    try:
        return JobModel.select().where(JobModel.status.not_in(["succeeded", "failed", "cancelled"])).count()
    except Exception:  # noqa: BLE001 - still recovering
        return None
    finally:
        app.suite.close()


def run(settings: Settings, directory: Path, say: Callable[[str], None] = print) -> tuple[list[str], dict]:
    """One run in ``directory`` (its histories and the workers' logs stay there); returns the
    checker's ``(violations, figures)``."""
    say(f"nemesis seed={settings.seed} for {settings.seconds:.0f}s of faults, in {directory} "
        f"(replay: {settings.replay()})")
    history_dir = directory / "history"
    history_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as cleanup:
        cluster = PostgresCluster()
        cleanup.callback(cluster.remove)
        cluster.start()
        server = debuggable_redis().start()
        cleanup.callback(server.stop)
        env = env_of(settings, redis_url=server.url, database_url=cluster.url, directory=history_dir)
        app = build(env)
        cleanup.callback(app.close)
        fleet = NemesisFleet(env, app.history, directory, size=settings.workers, threads=settings.threads)  # type: ignore[arg-type]
        cleanup.callback(fleet.close)
        redriver = Redriver(app, interval=0.5)  # type: ignore[arg-type]
        cleanup.callback(redriver.close)
        nemesis = Nemesis(settings.seed, app.history, fleet, server, cluster, kinds=settings.faults)
        cleanup.callback(nemesis.heal_all)
        producers = Producers(app, settings)
        cleanup.callback(producers.stop.set)

        end = time.monotonic() + settings.seconds
        while time.monotonic() < end:
            nemesis.tick()
            time.sleep(0.05)
        # Healed before the producers are joined: a send into a server a late fault froze (SIGSTOP) waits
        # for it to resume, as no client timeout ends a wait on a stopped server.
        producers.stop.set()
        nemesis.heal_all()
        producers.close()
        healed = app.history.record("healed")
        deadline = healed + settings.recovery
        left = unfinished(app)
        while (left is None or left > 0) and time.monotonic() < deadline:
            fleet.supervise()
            time.sleep(1)
            left = unfinished(app)
        app.history.record("settled", left=left)
        probe(app, fleet, settings)
        time.sleep(3)  # a job that would run again after it finished has the time to show it
        fleet.close()
        redriver.close()
        rows = [row_of(job) for job in JobModel.select().where(JobModel.app == env["DU_KEY_PREFIX"])]
        app.suite.close()
    with open(directory / "rows.json", "w") as f:  # with the history: --recheck judges the run again
        json.dump({"ttl": settings.ttl, "rows": [vars(row) for row in rows]}, f)
    problems, figures = checker.check(hist.read(history_dir), rows, ttl_ms=settings.ttl)
    figures.update(seed=settings.seed, fault_phase_s=settings.seconds, ttl_ms=settings.ttl,
                   heartbeat_timeout_ms=settings.heartbeat_timeout, redrive_passes=redriver.passes,
                   redrive_counts={k: v for k, v in sorted(redriver.counts.items()) if v})
    if left:
        figures["unfinished_after_recovery"] = left
    repaired = redriver.counts.get("repaired", 0)
    if repaired:  # a path left a row in a state no state allows: the re-drive set it right, but it is a defect
        problems.append(f"the re-drive repaired {repaired} rows left in a state with no way out (see its ERROR "
                        f"lines, 'a state nothing takes it out of', in the output)")
    return problems, figures


#: The columns of a job row the checker reads.
ROW_COLUMNS = ("message_id", "actor_name", "status", "result", "parked_on", "lease_until", "attempts", "worker",
               "last_error", "fencing_token", "history")


def row_of(job: JobModel) -> SimpleNamespace:
    return SimpleNamespace(**{name: _plain(getattr(job, name)) for name in ROW_COLUMNS})


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, (int, float, list, dict)) else str(value)


def recheck(directory: Path) -> tuple[list[str], dict]:
    """Judge a finished run again from what it left in ``directory`` (its history and rows.json)."""
    with open(directory / "rows.json") as f:
        saved = json.load(f)
    rows = [SimpleNamespace(**row) for row in saved["rows"]]
    return checker.check(hist.read(directory / "history"), rows, ttl_ms=saved["ttl"])


def summary(problems: list[str], figures: dict) -> str:
    text = "NEMESIS " + json.dumps(figures, sort_keys=False)
    if problems:
        text += f"\n{len(problems)} violations:\n" + "\n".join(problems[:30])
    return text


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.faults.nemesis", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="length of the fault phase")
    parser.add_argument("--seed", type=int, default=None, help="the seed to replay (default: a fresh one)")
    parser.add_argument("--dir", default=None, help="where the histories and logs go (default: a new temp dir)")
    parser.add_argument("--ttl", type=int, default=None, help="every lease, ms (default: drawn from the seed)")
    parser.add_argument("--heartbeat-timeout", type=int, default=None,
                        help="the broker's heartbeat_timeout, ms (default: drawn from the seed)")
    parser.add_argument("--faults", default=None, type=lambda text: tuple(text.split(",")),
                        help=f"the kinds of fault to draw, comma-separated (default: all: {','.join(FAULTS)})")
    parser.add_argument("--recheck", metavar="DIR", default=None,
                        help="judge the run left in DIR again (after a change to the checker), run nothing")
    args = parser.parse_args(argv)
    if args.recheck:
        problems, figures = recheck(Path(args.recheck))
        print(summary(problems, figures), flush=True)
        return 1 if problems else 0
    settings = Settings(seconds=args.minutes * 60, seed=fresh_seed() if args.seed is None else args.seed,
                        recovery=max(150.0, args.minutes * 10), ttl=args.ttl, heartbeat_timeout=args.heartbeat_timeout,
                        faults=args.faults)
    unknown = set(settings.faults or ()) - set(FAULTS)
    if unknown:
        parser.error(f"no such fault: {', '.join(sorted(unknown))}")
    directory = Path(args.dir or tempfile.mkdtemp(prefix="du-nemesis-"))
    problems, figures = run(settings, directory)
    print(summary(problems, figures), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

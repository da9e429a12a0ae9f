"""PostgreSQL restarting under load, and workers SIGKILLed while many of their writes are in flight.

The job table lives on a PostgreSQL cluster of the test's own (tests/servers.py); broker, locks and
the event log on a redis-server of its own.  Producer threads send tracked and while_executing jobs
while two `dramatiq` worker groups run them.  Re-drive passes run in the test process.  Scenarios:

* ``restart``: two producers, three threads a worker, jobs of 100 ms; when ten ran, the cluster
  restarts (``pg_ctl restart -m fast``: every session is ended, as in a restart or a fail-over) and the
  producers go on sending.
* ``fail-over``: as ``restart``, with the job table reached through a proxy (the address a fail-over
  moves) on a primary that a synchronous standby follows; when ten ran, the primary is stopped at once
  (``-m immediate``), the standby promoted, and the proxy sends new connections there.
* ``burst-stop`` and ``burst-sigkill``: four producers sending as fast as they can, eight threads a
  worker, jobs of 20 ms, so that many of the workers' starts and outcomes, and the producers' sends, are
  in flight at any moment; while they run, the cluster is stopped at once (``-m immediate``) and
  started again, or three busy worker processes are SIGKILLed one after another.

Asserted: every send returned or raised DatabaseUnavailable, and none hung; every job whose send
returned has its row, and every row succeeded (no process restarted by the fault: every connection
recovered by itself); no key had two holders and no job ran beside itself; no job ran again after its
success was recorded; the runs beyond one per job are no more than the runs the faults could cut
(those in progress while the server was down or their process was killed).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Callable

import pytest

from dramatiq_unique import DatabaseUnavailable
from tests.durable import RedisServer
from tests.faults import events as ev
from tests.faults.harness import fault_env, finish, open_runs_by_pid, postgres_rig, prefix, report, start_rig, wait_for
from tests.faults.test_shape_pgbouncer import database
from tests.proxy import Proxy
from tests.servers import PostgresCluster
from tests.shape_servers import Standby

pytestmark = pytest.mark.slow


# Each attack returns the event log's seq of its faults.


def restart(app, fleet, cluster) -> list[int]:
    wait_for(lambda: sum(1 for e in app.log.read() if e["event"] == "done") >= 10, timeout=30, what="ten jobs to run")
    fault = app.log.record("fault", what="pg_ctl restart -m fast")
    cluster.restart()
    app.log.record("back", what="PostgreSQL answers again")
    return [fault]


@dataclass(frozen=True)
class FailOverRig:
    primary: PostgresCluster
    standby: Standby
    proxy: Proxy


def failover_rig(cleanup: contextlib.ExitStack, directory, *, threads: int):
    """postgres_rig's shape, the job table on a primary with a synchronous standby, reached through a proxy."""
    primary = PostgresCluster()
    cleanup.callback(primary.remove)
    primary.start()
    name = database(primary)  # before the base backup: the standby has it too
    standby = Standby(primary)
    cleanup.callback(standby.remove)
    standby.start()
    standby.make_synchronous()
    proxy = Proxy(primary.port)
    cleanup.callback(proxy.close)
    server = RedisServer().start()
    cleanup.callback(server.stop)
    env = fault_env(broker_url=server.url, database_url=f"postgresql://postgres@127.0.0.1:{proxy.port}/{name}",
                    key_prefix=prefix())
    app, fleet, _ = start_rig(cleanup, env, directory, threads=threads)
    return FailOverRig(primary, standby, proxy), app, fleet


def fail_over(app, fleet, rig: FailOverRig) -> list[int]:
    wait_for(lambda: sum(1 for e in app.log.read() if e["event"] == "done") >= 10, timeout=30, what="ten jobs to run")
    fault = app.log.record("fault", what="fail-over: the primary stopped at once, its synchronous standby promoted")
    rig.proxy.down()
    rig.primary.stop(mode="immediate")
    rig.standby.promote()
    rig.proxy.target_port = rig.standby.port
    rig.proxy.up()
    app.log.record("back", what="the promoted standby answers at the same address")
    return [fault]


def stop_at_once(app, fleet, cluster) -> list[int]:
    wait_for(lambda: sum(len(runs) for runs in open_runs_by_pid(app.log, fleet.pids()).values()) > 2, timeout=30,
             what="jobs running in both workers")
    fault = app.log.record("fault", what="pg_ctl stop -m immediate")
    cluster.stop(mode="immediate")
    time.sleep(0.5)
    cluster.start()
    app.log.record("back", what="PostgreSQL answers again")
    return [fault]


def sigkill(app, fleet, cluster) -> list[int]:
    kills = []
    for _ in range(3):
        busy = wait_for(lambda: [pid for pid, runs in open_runs_by_pid(app.log, fleet.pids()).items() if len(runs) > 1],
                        timeout=30, what="a worker process running several jobs")
        kills.append(fleet.kill(busy[0]))
        time.sleep(0.5)
    return kills


@dataclass(frozen=True)
class Scenario:
    attack: Callable[..., list[int]]
    producers: int
    threads: int
    run_ms: int
    pause_s: float
    keys: int
    rig: Callable[..., tuple] = postgres_rig


SCENARIOS = {
    "restart": Scenario(restart, producers=2, threads=3, run_ms=100, pause_s=0.08, keys=6),
    "fail-over": Scenario(fail_over, producers=2, threads=3, run_ms=100, pause_s=0.08, keys=6, rig=failover_rig),
    "burst-stop": Scenario(stop_at_once, producers=4, threads=8, run_ms=20, pause_s=0.005, keys=12),
    "burst-sigkill": Scenario(sigkill, producers=4, threads=8, run_ms=20, pause_s=0.005, keys=12),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_postgresql_restarts_under_load(name, tmp_path):
    scenario = SCENARIOS[name]
    sent: list[str] = []
    refused: list[BaseException] = []
    failed: list[BaseException] = []
    stop = threading.Event()
    with contextlib.ExitStack() as cleanup:
        cluster, app, fleet = scenario.rig(cleanup, tmp_path, threads=scenario.threads)

        def produce(base: int) -> None:
            i = base
            try:
                while not stop.is_set():
                    actor = app.while_executing if i % 2 else app.tracked
                    began = time.monotonic()
                    try:
                        sent.append(actor.send(f"k{i % scenario.keys}", i, run_ms=scenario.run_ms,
                                               beat_ms=50).message_id)
                    except DatabaseUnavailable as e:
                        refused.append(e)
                    except Exception as e:  # noqa: BLE001 - judged below
                        failed.append(e)
                    if time.monotonic() - began > 15:
                        failed.append(AssertionError(f"a send took {time.monotonic() - began:.1f}s"))
                    i += scenario.producers
                    time.sleep(scenario.pause_s)
            finally:
                app.suite.close()

        producers = [threading.Thread(target=produce, args=(k,), daemon=True) for k in range(scenario.producers)]
        cleanup.callback(stop.set)
        for p in producers:
            p.start()
        faults = scenario.attack(app, fleet, cluster)
        time.sleep(1.5)  # sends after the fault
        stop.set()
        for p in producers:
            p.join(30)
            assert not p.is_alive(), "a producer hung"
        rows, log = finish(app, fleet, tmp_path, timeout=90)

    assert not failed, f"a send raised something else than DatabaseUnavailable: {failed[0]!r}"
    assert set(sent) <= {r.message_id for r in rows}, "every send that returned has its row"
    ev.check_holders(log, {"while": 1})  # tracked jobs: only "never beside itself"
    figures = ev.check_reruns(log, {r.message_id for r in rows})
    ev.check_no_run_after_success(log)
    last_done = max(r.t_done for r in log.runs if r.t_done is not None)
    report(figures.line(f"postgres-{name}", len(faults), last_done - log.seq_time(faults[-1]), sends=len(sent),
                        refused=len(refused)))

"""Group commit (storage/writer.py) under attack: workers SIGKILLed, and PostgreSQL stopped, while
batches of starts and outcomes are in flight.

The job table lives on a PostgreSQL cluster of the test's own (tests/servers.py); broker, locks and the
event log on a redis-server of its own.  Two `dramatiq` worker groups of eight threads each run short
tracked and while_executing jobs, which four producer threads send in a burst: their threads start and
finish at once, so their writes go in batches.  Re-drive passes run in the test process.

Asserted from the event log: every job whose send returned has its row, and every row succeeded; no key
had two holders and no job ran beside itself; no job ran again after its success was recorded; the runs
beyond one per job are no more than the runs the faults cut.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable

import pytest

from dramatiq_unique import DatabaseUnavailable
from tests.durable import RedisServer
from tests.faults import events as ev
from tests.faults.harness import fault_env, finish, open_runs_by_pid, prefix, report, start_rig, wait_for
from tests.servers import PostgresCluster

pytestmark = pytest.mark.slow

KEYS = 12
PRODUCERS = 4
THREADS = 8


def sigkill(app, fleet, cluster) -> list:
    """Three worker processes killed, each while it runs jobs (its batches in flight)."""
    kills = []
    for _ in range(3):
        busy = wait_for(lambda: [pid for pid, runs in open_runs_by_pid(app.log, fleet.pids()).items() if len(runs) > 1],
                        timeout=30, what="a worker process running several jobs")
        kills.append(fleet.kill(busy[0]))
        time.sleep(0.5)
    return kills


def stop_postgres(app, fleet, cluster) -> list:
    """PostgreSQL stopped (every session ended) while the workers run jobs, and started again."""
    wait_for(lambda: sum(len(runs) for runs in open_runs_by_pid(app.log, fleet.pids()).values()) > 2, timeout=30,
             what="jobs running in both workers")
    fault = app.log.record("fault", what="pg_ctl stop -m immediate")
    cluster.stop(mode="immediate")
    time.sleep(0.5)
    cluster.start()
    app.log.record("back", what="PostgreSQL answers again")
    return [fault]


@pytest.mark.parametrize("attack", [sigkill, stop_postgres], ids=["sigkill", "stop-postgres"])
def test_batches_in_flight_lose_nothing_and_run_nothing_twice(attack: Callable, tmp_path):
    sent: list[str] = []
    refused: list[BaseException] = []
    failed: list[BaseException] = []
    stop = threading.Event()
    with contextlib.ExitStack() as cleanup:
        cluster = PostgresCluster()
        cleanup.callback(cluster.remove)
        cluster.start()
        server = RedisServer().start()
        cleanup.callback(server.stop)
        env = fault_env(broker_url=server.url, database_url=cluster.url, key_prefix=prefix())
        app, fleet, redriver = start_rig(cleanup, env, tmp_path, threads=THREADS)

        def produce(base: int) -> None:
            i = base
            try:
                while not stop.is_set():
                    actor = app.while_executing if i % 3 == 0 else app.tracked
                    try:
                        sent.append(actor.send(f"k{i % KEYS}", i, run_ms=20).message_id)
                    except DatabaseUnavailable as e:
                        refused.append(e)
                    except Exception as e:  # noqa: BLE001 - judged below
                        failed.append(e)
                    i += PRODUCERS
                    time.sleep(0.005)
            finally:
                app.suite.close()

        producers = [threading.Thread(target=produce, args=(k,), daemon=True) for k in range(PRODUCERS)]
        cleanup.callback(stop.set)
        for p in producers:
            p.start()
        faults = attack(app, fleet, cluster)
        time.sleep(0.5)
        stop.set()
        for p in producers:
            p.join(30)
            assert not p.is_alive(), "a producer hung"
        rows, log = finish(app, fleet, tmp_path, timeout=90)

    assert not failed, f"a send raised something else than DatabaseUnavailable: {failed[0]!r}"
    assert set(sent) <= {r.message_id for r in rows}, "every send that returned has its row"
    ev.check_holders(log, {"while": 1})
    figures = ev.check_reruns(log, {r.message_id for r in rows})
    ev.check_no_run_after_success(log)
    last_done = max(r.t_done for r in log.runs if r.t_done is not None)
    report(figures.line(f"group-commit-{attack.__name__}", len(faults), last_done - log.seq_time(faults[-1]),
                        sends=len(sent), refused=len(refused)))

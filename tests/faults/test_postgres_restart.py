"""PostgreSQL restarting under load.

The job table lives on a PostgreSQL cluster of the test's own (tests/servers.py); broker, locks and
the event log on a redis-server of its own.  Two producer threads send tracked and while_executing
jobs while two `dramatiq` worker groups run them; when ten ran, the test restarts the cluster
(``pg_ctl restart -m fast``: every session is ended, as in a restart or a fail-over) and the
producers go on sending.  Re-drive passes run in the test process.

Asserted: every send returned or raised DatabaseUnavailable, and none hung; every job whose send
returned has its row, and every row succeeded (no process restarted: every connection recovered by
itself); no key had two holders and no job ran beside itself; the runs beyond one per job are no
more than the runs the restart could cut (those in progress while the server was down, whose
outcome could not be written).
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from dramatiq_unique import DatabaseUnavailable
from tests.durable import RedisServer
from tests.faults import events as ev
from tests.faults.harness import fault_env, finish, prefix, report, start_rig, wait_for
from tests.servers import PostgresCluster

pytestmark = pytest.mark.slow

KEYS = 6


def test_postgresql_restarts_under_load(tmp_path):
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
        app, fleet, redriver = start_rig(cleanup, env, tmp_path, threads=3)

        def produce(base: int) -> None:
            i = base
            try:
                while not stop.is_set():
                    actor = app.while_executing if i % 2 else app.tracked
                    began = time.monotonic()
                    try:
                        sent.append(actor.send(f"k{i % KEYS}", i, run_ms=100, beat_ms=50).message_id)
                    except DatabaseUnavailable as e:
                        refused.append(e)
                    except Exception as e:  # noqa: BLE001 - judged below
                        failed.append(e)
                    if time.monotonic() - began > 15:
                        failed.append(AssertionError(f"a send took {time.monotonic() - began:.1f}s"))
                    i += 2
                    time.sleep(0.08)
            finally:
                app.suite.close()

        producers = [threading.Thread(target=produce, args=(k,), daemon=True) for k in range(2)]
        cleanup.callback(stop.set)
        for p in producers:
            p.start()
        wait_for(lambda: sum(1 for e in app.log.read() if e["event"] == "done") >= 10, timeout=30,
                 what="ten jobs to run")
        fault = app.log.record("fault", what="pg_ctl restart -m fast")
        cluster.restart()
        back = app.log.record("back", what="PostgreSQL answers again")
        time.sleep(1.5)  # sends after the restart
        stop.set()
        for p in producers:
            p.join(30)
            assert not p.is_alive(), "a producer hung"
        rows, log = finish(app, fleet, tmp_path, timeout=60)

    assert not failed, f"a send raised something else than DatabaseUnavailable: {failed[0]!r}"
    assert set(sent) <= {r.message_id for r in rows}, "every send that returned has its row"
    ev.check_holders(log, {"while": 1})  # tracked jobs: only "never beside itself"
    figures = ev.check_reruns(log, {r.message_id for r in rows})
    ev.check_no_run_after_success(log)
    last_done = max(r.t_done for r in log.runs if r.t_done is not None)
    report(figures.line("postgres-restart", 1, last_done - log.seq_time(fault), refused=len(refused),
                        down_s=round(log.seq_time(back) - log.seq_time(fault), 1)))

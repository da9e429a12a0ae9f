"""Worker processes SIGKILLed again and again under load, for unique, while_executing and slot actors.

Two `dramatiq` worker groups (one process, three threads each) run jobs of a few keys (tenants, for
the slot actor; the unique actor's job table on PostgreSQL, the others' on SQLite) while a producer
sends them; the test SIGKILLs a worker process that is running a job, four times, and starts a
replacement each time.  Re-drive passes run in the test process.

Asserted from the event log: every job's row succeeded; no key ever had more runs holding it than
its lock or slot limit allows, and no job ran beside itself; every run that never finished was cut
by a kill, and the runs beyond one per job are no more than the kills cut.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from tests.durable import RedisServer
from tests.faults import events as ev
from tests.faults.harness import fault_env, finish, open_runs_by_pid, prefix, report, start_rig, wait_for

pytestmark = pytest.mark.slow

LIMIT = 2
SENDS = 48
KEYS = 4
KILLS = 4
TTL = 1_000

#: actor attribute of the app, its kind in the log, how many runs may hold one key at once, keys
#: (until_and_while_executing accepts one waiting job per key: more keys, so that most sends are
#: jobs), and the job table: PostgreSQL (a schema of the test's own) for one, SQLite for the others
KINDS = {
    "unique": ("unique", "unique", 1, 16, "postgres"),
    "while_executing": ("while_executing", "while", 1, KEYS, "sqlite"),
    "slot": ("slot", "slot", LIMIT, KEYS, "sqlite"),
}


@pytest.mark.parametrize("name", list(KINDS))
def test_workers_sigkilled_again_and_again_under_load(name, tmp_path, request):
    attr, kind, allowed, keys, database = KINDS[name]
    database_url = request.getfixturevalue("pg_url") if database == "postgres" else f"sqlite:///{tmp_path / 'jobs.db'}"
    sent: list[str] = []
    errors: list[BaseException] = []
    with contextlib.ExitStack() as cleanup:
        server = RedisServer().start()
        cleanup.callback(server.stop)
        env = fault_env(broker_url=server.url, database_url=database_url, key_prefix=prefix(), ttl=TTL, limit=LIMIT)
        app, fleet, redriver = start_rig(cleanup, env, tmp_path, threads=3)
        actor = getattr(app, attr)

        def produce() -> None:
            try:
                for i in range(SENDS):
                    sent.append(actor.send(f"k{i % keys}", i, run_ms=150, beat_ms=50).message_id)
                    time.sleep(0.06)
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)
            finally:
                app.suite.close()

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        kills = []
        for _ in range(KILLS):
            busy = wait_for(lambda: [pid for pid, runs in open_runs_by_pid(app.log, fleet.pids(), kind).items()
                                     if runs], timeout=30, what="a worker process running a job")
            kills.append(fleet.kill(busy[0]))
            time.sleep(0.7)
        producer.join(60)
        assert not producer.is_alive(), "the producer hung"
        assert not errors, f"a send failed: {errors[0]!r}"
        rows, log = finish(app, fleet, tmp_path, timeout=60)
    jobs = {r.message_id for r in rows}
    ev.check_holders(log, {kind: allowed})
    figures = ev.check_reruns(log, jobs)
    ev.check_no_run_after_success(log)
    last_done = max(r.t_done for r in log.runs if r.t_done is not None)
    report(figures.line(f"sigkill-{name}", len(kills), last_done - log.seq_time(kills[-1]), sends=len(sent),
                        db=database))

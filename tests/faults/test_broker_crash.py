"""The broker's Redis crashing under load, and coming back empty.

The broker runs on a redis-server of the test's own, without persistence; the event log on a
second one that stays up, and the suite's locks, slots and parking on either (two cases).  Forty
tracked and while_executing jobs are sent at once, and a producer sends thirty more one by one,
while two `dramatiq` worker groups run them; when ten ran, the test SIGKILLs the broker's
redis-server and starts it again, empty, on the same port, a second later.  Every
message it held is gone: queued, delayed, prefetched and unacknowledged alike.  Re-drive passes
(``lost_after`` 300 ms) run in the test process.

Asserted: every send either returned or raised a connection error (none hung); every job whose
row exists succeeded, the lost ones re-sent by the re-drive; no key had two holders and no job ran
beside itself; the runs beyond one per job are no more than the runs the crash cut.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from tests.durable import RedisServer
from tests.faults import events as ev
from tests.faults.harness import fault_env, finish, prefix, report, start_rig, wait_for

pytestmark = pytest.mark.slow

BACKLOG = 40  # sent at once before the crash: most of them wait in the broker when it dies
SENDS = 30  # sent one by one across the crash
KEYS = 6


@pytest.mark.parametrize("locks", ["apart", "on-the-broker"])
def test_the_brokers_redis_crashes_under_load_and_comes_back_empty(locks, tmp_path):
    """``apart``: the suite's locks on the Redis that stays up.  ``on-the-broker``: one Redis for
    the broker and the suite (the usual set-up), so the crash loses the held execution locks too;
    the event log stays on the other server."""
    sent: list[str] = []
    refused: list[BaseException] = []
    with contextlib.ExitStack() as cleanup:
        broker_server = RedisServer().start()
        cleanup.callback(broker_server.stop)
        lock_server = RedisServer().start()
        cleanup.callback(lock_server.stop)
        env = fault_env(broker_url=broker_server.url,
                        lock_url=lock_server.url if locks == "apart" else broker_server.url, log_url=lock_server.url,
                        database_url=f"sqlite:///{tmp_path / 'jobs.db'}", key_prefix=prefix())
        app, fleet, redriver = start_rig(cleanup, env, tmp_path, threads=3)

        def send(i: int) -> None:
            actor = app.while_executing if i % 2 else app.tracked
            sent.append(actor.send(f"k{i % KEYS}", i, run_ms=150, beat_ms=50).message_id)

        for i in range(BACKLOG):
            send(i)

        def produce() -> None:
            for i in range(BACKLOG, BACKLOG + SENDS):
                began = time.monotonic()
                try:
                    send(i)
                except Exception as e:  # noqa: BLE001 - judged below
                    refused.append(e)
                assert time.monotonic() - began < 15, "a send hung"
                time.sleep(0.05)
            app.suite.close()

        wait_for(lambda: sum(1 for e in app.log.read() if e["event"] == "done") >= 10, timeout=30,
                 what="ten jobs to run")
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        time.sleep(0.2)
        broker_server.stop()  # SIGKILL: a crash
        crash = app.log.record("fault", what="broker redis-server killed")
        time.sleep(1.0)
        broker_server.start()  # the same port, empty
        back = app.log.record("back", what="broker redis-server started again, empty")
        producer.join(60)
        assert not producer.is_alive(), "the producer hung"
        rows, log = finish(app, fleet, tmp_path, timeout=60)
        redriven = redriver.counts.get("redriven", 0)

    for e in refused:
        assert isinstance(e, (ConnectionError, OSError)) or "onnect" in type(e).__name__ + str(e), repr(e)
    assert set(sent) <= {r.message_id for r in rows}, "every send that returned has its row"
    ev.check_holders(log, {"while": 1})  # tracked jobs: only "never beside itself"
    figures = ev.check_reruns(log, {r.message_id for r in rows})
    ev.check_no_run_after_success(log)
    last_done = max(r.t_done for r in log.runs if r.t_done is not None)
    report(figures.line(f"broker-redis-crash-locks-{locks}", 1, last_done - log.seq_time(crash), refused=len(refused),
                        refused_as="/".join(sorted({type(e).__name__ for e in refused})) or "-",
                        redriven=redriven, down_s=round(log.seq_time(back) - log.seq_time(crash), 1)))

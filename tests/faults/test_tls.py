"""The broker, the suite and the event log on a Redis that speaks TLS only, and the job table on a
PostgreSQL that takes TLS only, both with client certificates.

One redis-server of the test's own (``--port 0``, ``--tls-port``, ``--tls-auth-clients yes``) with
a CA and certificates made by ``openssl``; every process reaches it through a ``rediss://`` URL that
names the CA and the client's certificate and key.  A PostgreSQL cluster of the test's own takes
``hostssl`` connections only, with a client certificate of that CA (``clientcert=verify-ca``); the URL
asks ``sslmode=verify-full`` and names the same files.  Two `dramatiq` worker groups run unique
(``until_and_while_executing``: the start frees the queue lock with a posted call) and
while_executing jobs that a producer sends one by one, and tracked jobs sent in one ``send_many``
batch; the test SIGKILLs a worker process that is running a job, twice, so that new worker
processes connect over TLS mid-run.

Asserted from the event log: every job's row succeeded; no key had two holders and no job ran beside
itself; the runs beyond one per job are no more than the kills cut.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

import dramatiq_unique
from tests.faults import events as ev
from tests.faults.harness import fault_env, finish, open_runs_by_pid, prefix, report, start_rig, wait_for
from tests.servers import Certificates, PostgresCluster, PrivateRedis

pytestmark = pytest.mark.slow

SENDS = 30
BATCH = 20
KEYS = 6
KILLS = 2


def test_every_process_over_tls_with_client_certificates(tmp_path):
    sent: list[str] = []
    errors: list[BaseException] = []
    with contextlib.ExitStack() as cleanup:
        certs = Certificates(tmp_path)
        server = PrivateRedis(tls=certs, client_certs=True).start()
        cleanup.callback(server.stop)
        assert server.url.startswith("rediss://")
        cluster = PostgresCluster()
        cleanup.callback(cluster.remove)
        tls = cluster.require_tls(certs)
        cluster.start()
        env = fault_env(broker_url=server.url, database_url=f"{cluster.url}?{tls}", key_prefix=prefix())
        app, fleet, redriver = start_rig(cleanup, env, tmp_path, threads=3)
        batch = dramatiq_unique.send_many(app.tracked, [(f"b{i}", i) for i in range(BATCH)])
        sent += [m.message_id for m in batch]

        def produce() -> None:
            try:
                for i in range(SENDS):
                    actor = app.unique if i % 2 else app.while_executing
                    sent.append(actor.send(f"k{i % KEYS}", i, run_ms=150, beat_ms=50).message_id)
                    time.sleep(0.06)
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)
            finally:
                app.suite.close()

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        kills = []
        for _ in range(KILLS):
            busy = wait_for(lambda: [pid for pid, runs in open_runs_by_pid(app.log, fleet.pids()).items() if runs],
                            timeout=30, what="a worker process running a job")
            kills.append(fleet.kill(busy[0]))
            time.sleep(0.7)
        producer.join(60)
        assert not producer.is_alive(), "the producer hung"
        assert not errors, f"a send failed: {errors[0]!r}"
        ssl = app.suite.db.execute_sql("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
        assert ssl == (True,), "the job table over TLS"
        rows, log = finish(app, fleet, tmp_path, timeout=60)
    jobs = {r.message_id for r in rows}
    assert set(sent) <= jobs
    ev.check_holders(log, {"unique": 1, "while": 1})
    figures = ev.check_reruns(log, jobs)
    ev.check_no_run_after_success(log)
    last_done = max(r.t_done for r in log.runs if r.t_done is not None)
    report(figures.line("tls-client-certs", len(kills), last_done - log.seq_time(kills[-1]), sends=len(sent)))

"""A gevent worker (``dramatiq-gevent``, greenlets for threads) with more greenlets than PostgreSQL takes
connections.

peewee keeps a connection per thread, which gevent makes one per greenlet: a worker of 40 greenlets opens
up to 40 connections to PostgreSQL.  The cluster (the test's own) takes 30.  Straight to it, the worker
warns at boot, naming the fix; through PgBouncer in transaction mode (a pool of 5), it does not, and 120
mixed jobs (tracked, unique, slot-limited) each run once and succeed on at most 5 server connections.
"""

from __future__ import annotations

import contextlib
import time

import dramatiq
import psycopg2
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import JobModel
from tests.durable import RedisServer
from tests.faults.harness import prefix
from tests.faults.test_shape_pgbouncer import database
from tests.helpers import wait_until
from tests.servers import PostgresCluster
from tests.shape_servers import PgBouncer
from tests.workers import CliWorker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

GREENLETS = 40
MAX_CONNECTIONS = 30
POOL = 5
JOBS = 40  # of each actor


def server_connections(cluster: PostgresCluster, name: str) -> int:
    conn = psycopg2.connect(host="127.0.0.1", port=cluster.port, user="postgres", dbname="postgres")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,))
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def booted(worker: CliWorker, log, timeout: float = 30) -> str:
    """The worker's log once its processes booted (Dramatiq logs "is ready for action")."""
    deadline = time.monotonic() + timeout
    while "is ready for action" not in (text := log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, f"the gevent worker did not boot:\n{text[-2000:]}"
        assert worker.process.poll() is None, f"the gevent worker exited:\n{text[-2000:]}"
        time.sleep(0.1)
    return text


def test_a_gevent_worker_with_more_greenlets_than_connections(tmp_path):
    with contextlib.ExitStack() as cleanup:
        cluster = PostgresCluster()
        cleanup.callback(cluster.remove)
        cluster.start()
        admin = psycopg2.connect(host="127.0.0.1", port=cluster.port, user="postgres", dbname="postgres")
        admin.autocommit = True
        admin.cursor().execute(f"ALTER SYSTEM SET max_connections = {MAX_CONNECTIONS}")
        admin.close()
        cluster.restart()
        name = database(cluster)
        server = RedisServer().start()
        cleanup.callback(server.stop)
        bouncer = PgBouncer("127.0.0.1", cluster.port, mode="transaction", pool_size=POOL).start()
        cleanup.callback(bouncer.remove)
        key_prefix = prefix()
        env = {"DU_REDIS_URL": server.url, "DU_NAMESPACE": f"{key_prefix}-broker", "DU_KEY_PREFIX": key_prefix}

        # Straight to PostgreSQL: the warning at boot.
        direct = f"postgresql://postgres@127.0.0.1:{cluster.port}/{name}"
        log = tmp_path / "direct.log"
        worker = CliWorker("tests.gevent_app", {**env, "DU_DATABASE_URL": direct}, threads=GREENLETS,
                           stderr_path=log, gevent=True)
        try:
            text = booted(worker, log)
        finally:
            worker.stop()
        assert f"{GREENLETS} gevent greenlets each open a connection of their own" in text
        assert "PgBouncer in transaction mode" in text

        # Through PgBouncer in transaction mode: no warning, every job once, on the pool's connections.
        pooled = bouncer.url(name)
        log = tmp_path / "pooled.log"
        worker = CliWorker("tests.gevent_app", {**env, "DU_DATABASE_URL": pooled}, threads=GREENLETS,
                           stderr_path=log, gevent=True)
        cleanup.callback(worker.stop)
        booted(worker, log)
        broker = RedisBroker(url=server.url, namespace=env["DU_NAMESPACE"])
        dramatiq.set_broker(broker)
        cleanup.callback(broker.close)
        suite = dramatiq_unique.setup(broker, database=pooled, redis=server.url, key_prefix=key_prefix,
                                      redriver=False)
        cleanup.callback(suite.close)
        from tests import gevent_app  # the actors, declared on this broker

        for i in range(JOBS):
            gevent_app.tracked.send(i)
            gevent_app.unique.send(i)
            gevent_app.limited.send(i)
        peak = 0

        def all_succeeded() -> bool:
            nonlocal peak
            peak = max(peak, server_connections(cluster, name))
            return JobModel.select().where(JobModel.status == "succeeded").count() == 3 * JOBS

        wait_until(all_succeeded, timeout=60, what="every job to succeed")
        text = worker.stop()
        runs = {k.decode(): int(v) for k, v in redis.Redis.from_url(server.url).hgetall(f"{key_prefix}:runs").items()}
        assert len(runs) == 3 * JOBS and set(runs.values()) == {1}, runs
        assert "greenlets each open a connection" not in text
        assert "too many clients" not in text
        assert peak <= POOL + 1, f"{peak} server connections (the pool has {POOL}; +1: this test's own reads)"

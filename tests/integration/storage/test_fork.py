"""A process that set the suite up and then forks, as a web server does that imports the app before its
workers (gunicorn's ``--preload``, uWSGI without ``lazy-apps``): each child opens connections of its own.

Parent and children send tracked and unique jobs at once, after the parent has used its connection (on SQLite,
psycopg2, psycopg 3, and peewee's pool, whose idle connections a child inherits too).  On the
parent's inherited connection they read each other's results (a send saw another's row, or hung); now every
send returns, each job has its row, each unique key one, and the parent's session survives its children.
"""

from __future__ import annotations

import os
import signal
import time

import dramatiq
import pytest
from playhouse.db_url import parse
from playhouse.pool import PooledDatabase

import dramatiq_unique
from dramatiq_unique import JobModel
from tests.conftest import REDIS_URL

CHILDREN, SENDS, KEYS = 3, 60, 10


@pytest.fixture(params=["sqlite", "psycopg2", "psycopg3", "pooled"])
def database(request):
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    import peewee as pw
    from playhouse.pool import PooledPostgresqlDatabase

    params = parse(request.getfixturevalue("pg_url"))
    if request.param == "pooled":  # peewee's pool: its idle connections are inherited too
        return PooledPostgresqlDatabase(params.pop("database"), max_connections=8, **params)
    return pw.PostgresqlDatabase(params.pop("database"), prefer_psycopg3=request.param == "psycopg3", **params)


def _exit_status(pid: int, timeout: float = 30) -> int:
    """The child's exit status; a child still running after ``timeout`` seconds (hung on a shared connection) is
    killed and counts as failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -1


def test_forked_children_open_their_own_connections(broker, database, key_prefix):
    suite = dramatiq_unique.setup(broker, database=database, redis=REDIS_URL, key_prefix=key_prefix,
                                  redriver=False)

    @dramatiq.actor(track=True)
    def tracked(name):
        return name

    @dramatiq.actor(unique_args=["key"], unique_lock="until_executed")
    def unique(key):
        return key

    def send_all(who: str) -> None:
        for i in range(SENDS):
            tracked.send(f"{who}-{i}")
            unique.send(f"{who}-{i % KEYS}")

    tracked.send("parent-warm")  # the parent's connection is open and used when it forks
    if isinstance(database, PooledDatabase):
        database.close()  # back in the pool, idle: where the parent and each child would take it from
    children = []
    for number in range(CHILDREN):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's outcome is its exit status
            code = 1
            try:
                assert suite.worker_id.endswith(f":{os.getpid()}")
                send_all(f"child{number}")
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    try:
        send_all("parent")
    finally:
        statuses = [_exit_status(pid) for pid in children]
    assert statuses == [0] * CHILDREN
    rows = list(JobModel.select(JobModel.actor_name, JobModel.args).where(JobModel.app == suite.app))
    assert sum(r.actor_name == "tracked" for r in rows) == (CHILDREN + 1) * SENDS + 1
    keys = [r.args[0] for r in rows if r.actor_name == "unique"]
    assert len(keys) == len(set(keys)) == (CHILDREN + 1) * KEYS
    assert suite.db.execute_sql("SELECT 1").fetchone()[0] == 1  # the parent's own session is still there

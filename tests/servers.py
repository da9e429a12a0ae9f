"""Servers of a test's own, on free ports, for fault tests: the shared services are never disturbed.

:class:`PostgresCluster` is a throwaway PostgreSQL cluster (``initdb`` and
``pg_ctl`` from ``pg_config --bindir``, run as the ``postgres`` user when
the tests run as root) that a test may stop, restart or kill.  The Redis
counterpart is :class:`tests.durable.RedisServer`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from typing import Optional

import psycopg2

from tests.durable import free_port

#: Seconds any server start or stop may take before the test fails.
START_TIMEOUT = 30


def _bindir() -> str:
    out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _as_postgres(argv: list[str]) -> list[str]:
    """Run ``argv`` as the postgres user when we are root (PostgreSQL refuses to run as root)."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


class PostgresCluster:
    """A PostgreSQL cluster of the test's own: ``start()``, ``stop()``, ``restart()``, ``kill()``, ``remove()``.

    Trust authentication, user ``postgres``, database ``postgres``; ``url``
    is a URL the suite accepts.  No fsync: nothing here must survive a
    power cut, and the cluster starts faster.
    """

    def __init__(self, port: int = 0) -> None:
        self.port = port or free_port()
        self.bindir = _bindir()
        self.dir = tempfile.mkdtemp(prefix="du-pg-")
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "server.log")
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(
            [f"{self.bindir}/initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"],
            "initdb",
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, argv: list[str], what: str) -> None:
        done = subprocess.run(_as_postgres(argv), capture_output=True, text=True, timeout=START_TIMEOUT)
        if done.returncode != 0:
            raise AssertionError(f"{what} failed ({done.returncode}): {done.stderr or done.stdout}")

    def start(self) -> "PostgresCluster":
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run([f"{self.bindir}/pg_ctl", "-D", self.data, "-l", self.log, "-o", options, "-w",
                   "-t", str(START_TIMEOUT), "start"], "pg_ctl start")
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                                 connect_timeout=2).close()
                return
            except psycopg2.OperationalError as e:
                if time.monotonic() > deadline:
                    raise AssertionError(f"PostgreSQL on port {self.port} did not answer") from e
                time.sleep(0.05)

    def stop(self, mode: str = "fast") -> None:
        """``fast`` ends every session (as a restart or a fail-over does); ``immediate`` is a crash."""
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            self._run([f"{self.bindir}/pg_ctl", "-D", self.data, "-m", mode, "-w",
                       "-t", str(START_TIMEOUT), "stop"], "pg_ctl stop")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def kill(self) -> None:
        """A crash: the server dies at once, every session with it."""
        self.stop("immediate")

    def terminate_backends(self, database: Optional[str] = None) -> int:
        """Kill every other session (as an idle-connection killer does); returns how many."""
        with psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres") as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
                    + (" AND datname = %s" if database else ""),
                    (database,) if database else None,
                )
                killed = cur.fetchone()[0]
        conn.close()
        return int(killed)

    def schema_url(self) -> str:
        """A URL of a new schema of the caller's own on this cluster, started first if a test left it stopped."""
        try:
            self.wait_ready(timeout=0.1)
        except AssertionError:
            self.start()
        schema = f"du_{uuid.uuid4().hex[:10]}"
        with psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres") as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE SCHEMA "{schema}"')
        conn.close()
        return f"{self.url}?options=-csearch_path%3D{schema}"

    def remove(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

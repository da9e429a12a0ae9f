"""Servers of the production shapes (tests/faults/test_shape_*.py), each a test's own on free ports.

- :class:`PgBouncer`: Debian's ``pgbouncer`` in front of a PostgreSQL (a :class:`tests.servers.PostgresCluster`),
  in transaction or session mode, run as the ``postgres`` user (PgBouncer refuses root);
- :class:`SentinelGroup`: a Redis master, a replica and three ``redis-server --sentinel``;
- :class:`Hosts`: worker "hosts" in network namespaces, each joined to the host's namespace by a veth pair.

Redis over TLS and with ACL users: :class:`tests.servers.PrivateRedis`.  Nothing here installs anything:
``.ci/run`` installs PgBouncer.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

import psycopg2
import redis

from tests.durable import free_port
from tests.servers import START_TIMEOUT, PostgresCluster


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _wait(predicate, what: str, timeout: float = START_TIMEOUT, proc: Optional[subprocess.Popen] = None,
          log: Optional[Path] = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
            error: Optional[BaseException] = None
        except Exception as e:  # noqa: BLE001 - not up yet
            error = e
        if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
            tail = log.read_text()[-2000:] if log is not None and log.exists() else ""
            raise AssertionError(f"{what} did not start ({error!r})\n{tail}")
        time.sleep(0.05)


# -- PgBouncer ------------------------------------------------------------------------------------


class PgBouncer:
    """PgBouncer in front of the PostgreSQL at ``server_host:server_port`` (every database name passes
    through), trusting every user of ``users``; ``url(dbname)`` is a URL through it.

    ``mode``: ``transaction`` or ``session``; ``pool_size``: server connections per database and user
    (``default_pool_size``); ``settings``: more lines of its ``[pgbouncer]`` section, e.g.
    ``{"ignore_startup_parameters": "options"}`` or ``{"query_wait_timeout": "5"}``.
    """

    def __init__(self, server_host: str, server_port: int, *, mode: str = "transaction", pool_size: int = 20,
                 listen: str = "127.0.0.1", port: int = 0, users: Sequence[str] = ("postgres",),
                 settings: Optional[dict[str, str]] = None) -> None:
        self.binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        assert os.path.exists(self.binary), "pgbouncer is needed (Debian's package; .ci/run installs it)"
        self.listen, self.port, self.mode = listen, port or free_port(), mode
        self.dir = Path(tempfile.mkdtemp(prefix="du-pgbouncer-"))
        self.log = self.dir / "pgbouncer.log"
        (self.dir / "userlist.txt").write_text("".join(f'"{user}" ""\n' for user in users))
        lines = {
            "listen_addr": listen, "listen_port": str(self.port), "unix_socket_dir": "",
            "auth_type": "trust", "auth_file": str(self.dir / "userlist.txt"), "admin_users": "postgres",
            "pool_mode": mode, "default_pool_size": str(pool_size), "max_client_conn": "1000",
            "logfile": str(self.log), "pidfile": str(self.dir / "pgbouncer.pid"),
            # Its own default, said here so that a reader sees what the tests run with.
            "server_reset_query": "DISCARD ALL",
            **(settings or {}),
        }
        config = "[databases]\n" f"* = host={server_host} port={server_port}\n\n[pgbouncer]\n"
        config += "".join(f"{key} = {value}\n" for key, value in lines.items())
        (self.dir / "pgbouncer.ini").write_text(config)
        if os.geteuid() == 0:
            for path in [self.dir, *self.dir.iterdir()]:
                shutil.chown(path, "postgres", "postgres")
        self.proc: Optional[subprocess.Popen] = None

    def url(self, dbname: str = "postgres", query: str = "") -> str:
        return f"postgresql://postgres@{self.listen}:{self.port}/{dbname}" + (f"?{query}" if query else "")

    def start(self) -> "PgBouncer":
        self.proc = subprocess.Popen(_as_postgres([self.binary, str(self.dir / "pgbouncer.ini")]),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(lambda: self.admin("SHOW VERSION") is not None, f"pgbouncer on {self.listen}:{self.port}",
              proc=self.proc, log=self.log)
        return self

    def admin(self, command: str) -> list[tuple]:
        """A command of PgBouncer's admin console (``SHOW POOLS``...): its rows."""
        conn = psycopg2.connect(host=self.listen, port=self.port, user="postgres", dbname="pgbouncer",
                                connect_timeout=2)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(command)
                return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                # As root the process is runuser's child: signal the group runuser runs in.
                with contextlib.suppress(ProcessLookupError):
                    pid = int((self.dir / "pgbouncer.pid").read_text().strip())
                    os.kill(pid, signal.SIGKILL)
                self.proc.kill()
            self.proc.wait(timeout=START_TIMEOUT)
            self.proc = None
            # Killed, it leaves its pid file, and a start on it would refuse ("is another instance running?").
            (self.dir / "pgbouncer.pid").unlink(missing_ok=True)

    def remove(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


# -- Redis ----------------------------------------------------------------------------------------


class Standby(PostgresCluster):
    """A streaming standby of ``primary`` (``pg_basebackup -R``), on a port of its own: ``start()``, ``promote()``,
    ``remove()``.  The primary waits for it at every commit once :meth:`make_synchronous` ran."""

    def __init__(self, primary: PostgresCluster) -> None:  # no initdb: the data directory is the primary's copy
        self.port, self.fsync, self.bindir, self.primary = free_port(), primary.fsync, primary.bindir, primary
        self.tls = False
        self.dir = tempfile.mkdtemp(prefix="du-pg-standby-")
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "server.log")
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run([f"{self.bindir}/pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                   "-D", self.data, "-R", "-X", "stream", "--no-sync", "--checkpoint=fast"], "pg_basebackup")

    def make_synchronous(self) -> None:
        """Every commit on the primary waits for this standby's flush (``synchronous_standby_names``)."""
        conn = psycopg2.connect(host="127.0.0.1", port=self.primary.port, user="postgres", dbname="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                cur.execute("SELECT pg_reload_conf()")

            def synchronous() -> bool:
                with conn.cursor() as cur:
                    cur.execute("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
                    return cur.fetchone()[0] == 1

            _wait(synchronous, f"the standby on {self.port} to be synchronous")
        finally:
            conn.close()

    def promote(self) -> None:
        self._run([f"{self.bindir}/pg_ctl", "-D", self.data, "-w", "-t", str(START_TIMEOUT), "promote"],
                  "pg_ctl promote")


class SentinelGroup:
    """A Redis master, a replica of it and three sentinels watching them as ``service``.

    ``down_after`` (ms): how long the master must fail to answer before the sentinels agree that
    it is down and fail over.  :meth:`failover` asks for a fail-over as an operator does;
    :meth:`kill_master` SIGKILLs the master of the moment (and it stays down).
    """

    SERVICE = "du-master"

    def __init__(self, *, down_after: int = 1_000) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="du-sentinel-"))
        self.down_after = down_after
        self.redis_ports = [free_port(), free_port()]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.procs: dict[int, subprocess.Popen] = {}

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", port) for port in self.sentinel_ports]

    @property
    def url(self) -> str:
        """The suite's Sentinel URL of the service (dramatiq_unique.redis.sentinel)."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.SERVICE}/0"

    def _redis(self, port: int, *extra: str) -> None:
        self.procs[port] = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.dir), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=port, socket_connect_timeout=1, socket_timeout=1)
        try:
            _wait(client.ping, f"redis-server on port {port}", proc=self.procs[port])
        finally:
            client.close()

    def start(self) -> "SentinelGroup":
        master, replica = self.redis_ports
        self._redis(master)
        self._redis(replica, "--replicaof", "127.0.0.1", str(master))
        for port in self.sentinel_ports:
            config = self.dir / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {self.SERVICE} 127.0.0.1 {master} 2\n"
                f"sentinel down-after-milliseconds {self.SERVICE} {self.down_after}\n"
                f"sentinel failover-timeout {self.SERVICE} 10000\n"
                f"sentinel parallel-syncs {self.SERVICE} 1\n"
            )
            self.procs[port] = subprocess.Popen(
                [shutil.which("redis-server") or "redis-server", str(config), "--sentinel"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(lambda: self._replica_synced(replica), "the replica's first sync")
        _wait(lambda: all(self._sees_replica(port) for port in self.sentinel_ports), "the sentinels")
        return self

    def _replica_synced(self, port: int) -> bool:
        client = redis.Redis(port=port, socket_timeout=1)
        try:
            return client.info("replication").get("master_link_status") == "up"
        finally:
            client.close()

    def _sees_replica(self, port: int) -> bool:
        client = redis.Redis(port=port, socket_timeout=1, decode_responses=True)
        try:
            return len(client.sentinel_slaves(self.SERVICE)) >= 1 and len(client.sentinel_sentinels(self.SERVICE)) >= 2
        finally:
            client.close()

    def master_port(self) -> int:
        for port in self.sentinel_ports:
            client = redis.Redis(port=port, socket_timeout=1)
            try:
                return int(client.sentinel_get_master_addr_by_name(self.SERVICE)[1])
            except (redis.RedisError, TypeError):
                continue
            finally:
                client.close()
        raise AssertionError("no sentinel names a master")

    def client(self, **kwargs) -> redis.Redis:
        """A plain client of the master of the moment."""
        return redis.Redis(port=self.master_port(), **kwargs)

    def failover(self, timeout: float = START_TIMEOUT) -> int:
        """``SENTINEL FAILOVER``: the replica is promoted in order; returns the new master's port."""
        before = self.master_port()
        client = redis.Redis(port=self.sentinel_ports[0], socket_timeout=5)
        try:
            client.execute_command("SENTINEL", "FAILOVER", self.SERVICE)
        finally:
            client.close()
        return self.wait_new_master(before, timeout)

    def kill_master(self) -> int:
        """SIGKILL the master of the moment; returns its port."""
        port = self.master_port()
        self.procs[port].kill()
        self.procs[port].wait(timeout=START_TIMEOUT)
        return port

    def wait_new_master(self, old: int, timeout: float = START_TIMEOUT) -> int:
        def promoted() -> bool:
            port = self.master_port()
            if port == old:
                return False
            client = redis.Redis(port=port, socket_timeout=1)
            try:
                return client.info("replication").get("role") == "master"
            finally:
                client.close()

        _wait(promoted, "a new master", timeout=timeout)
        return self.master_port()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=START_TIMEOUT)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


# -- hosts in network namespaces ------------------------------------------------------------------


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def namespaces_unavailable() -> Optional[str]:
    """Why network namespaces cannot be made here (None if they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "the ip command (iproute2) is missing"
    name = f"du-probe-{os.getpid()}"
    done = _ip("netns", "add", name, check=False)
    if done.returncode != 0:
        return f"ip netns add failed: {done.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


class Hosts:
    """``count`` hosts in network namespaces ``du-<tag>-<i>``, each joined to the host's namespace by two
    veth pairs, each pair a /24 of its own in a test range of ours: the *link* (host side
    ``10.233.<subnet + i>.1``, the namespace's ``.2``), which :meth:`cut` takes down and :meth:`heal` brings
    back, and an *observer* link (``10.233.<subnet + 100 + i>.x``) that stays up, for the test's own
    event log: what a cut-off host does is recorded in the order it happens, not when its packets get
    through.  Servers listen on the host-side addresses.  :meth:`remove` deletes everything (veths go
    with their namespace), whatever state a failed test left.
    """

    def __init__(self, count: int, *, tag: str, subnet: int = 10) -> None:
        self.names = [f"du-{tag}-{i}" for i in range(count)]
        self.veths = [f"du{tag[:6]}{i}h" for i in range(count)]
        self.subnets = [subnet + i for i in range(count)]

    def host_address(self, index: int) -> str:
        """The host namespace's address on host ``index``'s link (servers listen there)."""
        return f"10.233.{self.subnets[index]}.1"

    def observer_address(self, index: int) -> str:
        """The host namespace's address on host ``index``'s observer link."""
        return f"10.233.{self.subnets[index] + 100}.1"

    def create(self) -> "Hosts":
        self.remove()  # a run that died earlier
        for name, veth, subnet in zip(self.names, self.veths, self.subnets, strict=True):
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
            for outer, net in ((veth, subnet), (veth[:-1] + "o", subnet + 100)):
                inner = outer + "n"
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", name)
                _ip("addr", "add", f"10.233.{net}.1/24", "dev", outer)
                _ip("link", "set", outer, "up")
                _ip("-n", name, "addr", "add", f"10.233.{net}.2/24", "dev", inner)
                _ip("-n", name, "link", "set", inner, "up")
        return self

    def prefix(self, index: int) -> list[str]:
        """The argv prefix that runs a command on host ``index``."""
        return ["ip", "netns", "exec", self.names[index]]

    def cut(self, index: int) -> None:
        """The host's link down, on both ends: its packets go nowhere, as with a pulled cable."""
        _ip("link", "set", self.veths[index], "down")
        _ip("-n", self.names[index], "link", "set", self.veths[index] + "n", "down")

    def heal(self, index: int) -> None:
        _ip("link", "set", self.veths[index], "up")
        _ip("-n", self.names[index], "link", "set", self.veths[index] + "n", "up")

    def remove(self) -> None:
        existing = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line]
        for name, veth in zip(self.names, self.veths, strict=True):
            if name in existing:
                _ip("netns", "del", name, check=False)
            for outer in (veth, veth[:-1] + "o"):
                if _ip("link", "show", outer, check=False).returncode == 0:
                    _ip("link", "del", outer, check=False)


@contextlib.contextmanager
def hosts(count: int, *, tag: str, subnet: int = 10) -> Iterator[Hosts]:
    made = Hosts(count, tag=tag, subnet=subnet)
    try:
        yield made.create()
    finally:
        made.remove()

"""Servers of a test's own, on free ports, for fault tests: the shared services are never disturbed.

:class:`PostgresCluster` is a throwaway PostgreSQL cluster (``initdb`` and
``pg_ctl`` from ``pg_config --bindir``, run as the ``postgres`` user when
the tests run as root) that a test may stop, restart or kill.  The Redis
counterpart is :class:`tests.durable.RedisServer`; :class:`PrivateRedis` is
one with what the shared Redis lacks: TLS only (with :class:`Certificates`
made by the ``openssl`` command), a password, ACL users.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional, Sequence
from urllib.parse import quote, urlencode

import psycopg2
import redis

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
    is a URL the suite accepts.  No fsync by default: nothing here must
    survive a power cut, and the cluster starts faster; a benchmark of
    commits asks for ``fsync=True``, as a production server has it.
    """

    def __init__(self, port: int = 0, *, fsync: bool = False) -> None:
        self.port = port or free_port()
        self.fsync = fsync
        self.tls = False
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

    def require_tls(self, certs: "Certificates") -> str:
        """Before :meth:`start`: connections over TLS only, each showing a client certificate of ``certs``'
        CA (``clientcert=verify-ca``); returns the query a URL needs for that (verify-full, the client's
        certificate and key)."""
        for name, source in (("server.crt", certs.server_cert), ("server.key", certs.server_key),
                             ("root.crt", certs.ca)):
            target = os.path.join(self.data, name)
            shutil.copy(source, target)
            os.chmod(target, 0o600)
            if os.geteuid() == 0:
                shutil.chown(target, "postgres", "postgres")
        with open(os.path.join(self.data, "postgresql.conf"), "a") as conf:
            conf.write("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n"
                       "ssl_ca_file = 'root.crt'\n")
        with open(os.path.join(self.data, "pg_hba.conf"), "w") as hba:
            hba.write("local all all trust\nhostssl all all 127.0.0.1/32 trust clientcert=verify-ca\n"
                      "hostssl replication all 127.0.0.1/32 trust clientcert=verify-ca\n")
        os.chmod(certs.client_key, 0o600)  # libpq refuses a key others may read
        self.tls = True
        return urlencode({"sslmode": "verify-full", "sslrootcert": str(certs.ca), "sslcert": str(certs.client_cert),
                          "sslkey": str(certs.client_key)})

    def start(self) -> "PostgresCluster":
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200"
        options += "" if self.fsync else " -c fsync=off"
        self._run([f"{self.bindir}/pg_ctl", "-D", self.data, "-l", self.log, "-o", options, "-w",
                   "-t", str(START_TIMEOUT), "start"], "pg_ctl start")
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                # Over TLS only, its TCP port wants a client certificate: the socket then.
                psycopg2.connect(host=self.dir if self.tls else "127.0.0.1", port=self.port, user="postgres",
                                 dbname="postgres", connect_timeout=2).close()
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


def _openssl(*args: object) -> None:
    done = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, timeout=START_TIMEOUT)
    if done.returncode != 0:
        raise AssertionError(f"openssl {args[0]} failed ({done.returncode}): {done.stderr}")


#: Keys on the P-256 curve: made at once, where RSA keys take a while on a busy machine.
_NEW_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


class Certificates:
    """A certificate authority of the test's own and, signed by it, a server certificate (for
    127.0.0.1 and localhost) and a client certificate, made with ``openssl`` in ``directory``."""

    def __init__(self, directory: "str | os.PathLike[str]") -> None:
        self.dir = Path(directory)
        self.ca, self.ca_key = self.dir / "ca.crt", self.dir / "ca.key"
        _openssl("req", "-x509", *_NEW_KEY, "-keyout", self.ca_key, "-out", self.ca, "-days", "2",
                 "-subj", "/CN=dramatiq_unique test CA",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        self.server_cert, self.server_key = self._sign(
            "server", ["subjectAltName=IP:127.0.0.1,DNS:localhost", "extendedKeyUsage=serverAuth"])
        self.client_cert, self.client_key = self._sign("client", ["extendedKeyUsage=clientAuth"])

    def _sign(self, name: str, extensions: list[str]) -> tuple[Path, Path]:
        key, request, cert = (self.dir / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
        ext_file = self.dir / f"{name}.ext"
        extensions += ["basicConstraints=CA:FALSE", "subjectKeyIdentifier=hash", "authorityKeyIdentifier=keyid"]
        ext_file.write_text("\n".join(extensions) + "\n")
        _openssl("req", *_NEW_KEY, "-keyout", key, "-out", request, "-subj", f"/CN=dramatiq_unique test {name}")
        _openssl("x509", "-req", "-in", request, "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial",
                 "-days", "2", "-extfile", ext_file, "-out", cert)
        return cert, key


class PrivateRedis:
    """A redis-server of the test's own, without persistence: ``start()``, ``stop()`` (a SIGKILL),
    ``url``, ``client()``; started again on the same port with the same settings.

    ``tls``: it speaks TLS only (``--port 0``, ``--tls-port``), with the server certificate of these
    :class:`Certificates`; ``client_certs``: clients must show one signed by their CA (``url``
    then names the client certificate).  ``password``: ``requirepass`` (the default user's).
    ``args``: more settings, as on redis-server's command line.
    """

    def __init__(self, *, tls: Optional[Certificates] = None, client_certs: bool = False,
                 password: Optional[str] = None, args: Sequence[str] = (), port: int = 0) -> None:
        self.port = port or free_port()
        self.tls, self.client_certs, self.password, self.args = tls, client_certs, password, list(args)
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        """A URL of the server as its default user (with its password, if any)."""
        return self.url_as(None, self.password)

    def url_as(self, username: Optional[str], password: Optional[str]) -> str:
        """A URL of the server for ``username`` (None: the default user) with ``password``; over TLS,
        with the client's TLS settings in its query, as redis-py reads them."""
        who = ""
        if password is not None:
            who = f"{quote(username or '', safe='')}:{quote(password, safe='')}@"
        if self.tls is None:
            return f"redis://{who}127.0.0.1:{self.port}/0"
        query = {"ssl_ca_certs": str(self.tls.ca)}
        if self.client_certs:
            query.update(ssl_certfile=str(self.tls.client_cert), ssl_keyfile=str(self.tls.client_key))
        return f"rediss://{who}127.0.0.1:{self.port}/0?{urlencode(query)}"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis.from_url(self.url, **kwargs)

    def start(self) -> "PrivateRedis":
        binary = shutil.which("redis-server")
        assert binary, "redis-server is needed on PATH"
        argv = [binary, "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"]
        if self.tls is None:
            argv += ["--port", str(self.port)]
        else:
            argv += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(self.tls.server_cert),
                     "--tls-key-file", str(self.tls.server_key), "--tls-ca-cert-file", str(self.tls.ca),
                     "--tls-auth-clients", "yes" if self.client_certs else "no"]
        if self.password is not None:
            argv += ["--requirepass", self.password]
        self.proc = subprocess.Popen(argv + self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        probe = self.client(socket_connect_timeout=1, socket_timeout=1)
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while True:
                try:
                    probe.ping()
                    return self
                except redis.ConnectionError as e:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        self.stop()
                        raise AssertionError(f"redis-server on port {self.port} did not start") from e
                    time.sleep(0.05)
        finally:
            probe.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=START_TIMEOUT)
            self.proc = None

"""The nemesis's faults: a Redis that takes ``DEBUG SLEEP``, a supervised fleet of workers each behind
links of its own to the servers, and the schedule of faults that a seed draws (tests/faults/nemesis.py
runs them)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
import urllib.parse
from typing import Any, Callable, Optional

import redis

from tests.faults import history as hist
from tests.faults.harness import Fleet, wait_gone
from tests.proxy import Proxy
from tests.servers import PostgresCluster, PrivateRedis
from tests.workers import CliWorker

#: Faults by weight: worker faults are the common ones.
FAULTS = {"kill": 3, "stop": 3, "pg-link-stall": 1, "redis-link-stall": 1, "redis-kill": 1, "redis-pause": 1,
          "pg-restart": 1, "pg-pause": 1}
#: The variables that name the servers a worker reaches through its links.
LINKED = ("DU_REDIS_URL", "DU_DATABASE_URL")


def debuggable_redis() -> PrivateRedis:
    """A throwaway redis-server that takes ``DEBUG SLEEP`` (Redis 7 refuses DEBUG by default)."""
    return PrivateRedis(args=["--enable-debug-command", "local"])


def through(url: str, port: int) -> str:
    """``url`` with its port replaced by ``port`` (a proxy's on the same loopback address)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rsplit(":", 1)[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{host}:{port}"))


class NemesisFleet(Fleet):
    """The fault suite's fleet of `dramatiq tests.faults.nemesis_app` workers, supervised: a worker
    group that ended by itself (its process died at boot while a server was down, say) is
    recorded (``died``) and replaced.  Each worker group reaches Redis and PostgreSQL through links
    of its own (tests/proxy.py), which :meth:`stall` holds up as a host's network does."""

    def spawn(self) -> CliWorker:
        self._known = getattr(self, "_known", {})
        self._links: dict[int, list[Proxy]] = getattr(self, "_links", {})
        links = [Proxy(urllib.parse.urlsplit(self.env[name]).port or 0) for name in LINKED]
        env = dict(self.env)
        for name, link in zip(LINKED, links, strict=True):
            env[name] = through(env[name], link.port)
        worker = CliWorker("tests.faults.nemesis_app", env, processes=1, threads=self.threads,
                           stderr_path=self.log_dir / f"worker-{len(self.workers) + len(self.retired)}.log")
        self.workers.append(worker)
        self._known[id(worker)] = []
        self._links[id(worker)] = links
        return worker

    def links_of(self, pid: int) -> Optional[list[Proxy]]:
        """The links of the live worker group whose process ``pid`` is; None once it exited."""
        owner = self._find(pid)
        return None if owner is None else self._links[id(owner)]

    def close(self) -> str:
        out = super().close()
        for links in getattr(self, "_links", {}).values():
            for link in links:
                link.close()
        return out

    def supervise(self) -> None:
        for worker in list(self.workers):
            children = worker.children()
            if children:
                self._known[id(worker)] = children
            if worker.process.poll() is None:
                continue
            for pid in self._known.get(id(worker), []):
                self.frozen.discard(pid)
                self.log.record("died", pid=pid, code=worker.process.returncode)
            self.workers.remove(worker)
            self.retired.append(worker)
            self.spawn()

    def live(self) -> list[int]:
        """Worker processes neither frozen nor on their way out."""
        return sorted(pid for pid in self.pids() if pid not in self.frozen)


class Nemesis:
    """The faults of one run: :meth:`tick` starts the next one when due and heals those whose time came."""

    def __init__(self, seed: int, history: hist.History, fleet: NemesisFleet, server: PrivateRedis,
                 cluster: PostgresCluster, kinds: Optional[tuple[str, ...]] = None) -> None:
        self.rng = random.Random(f"{seed}-faults")
        self.weights = {kind: weight for kind, weight in FAULTS.items() if kinds is None or kind in kinds}
        self.history = history
        self.fleet = fleet
        self.server = server
        self.cluster = cluster
        self.heals: list[tuple[float, str, Callable[[], None]]] = []
        self.busy: set[str] = set()  # "redis", "pg": one fault of a server at a time
        self.count = 0
        self.next_at = time.monotonic() + self.rng.uniform(2, 6)

    def tick(self) -> None:
        now = time.monotonic()
        for heal in [h for h in self.heals if h[0] <= now]:
            self.heals.remove(heal)
            heal[2]()
        self.fleet.supervise()
        if now >= self.next_at:
            kind = self.rng.choices(list(self.weights), weights=list(self.weights.values()))[0]
            getattr(self, "_" + kind.replace("-", "_"))()
            self.next_at = time.monotonic() + self.rng.uniform(2, 6)

    def heal_all(self) -> None:
        for heal in sorted(self.heals):
            heal[2]()
        self.heals = []

    def _begin(self, kind: str, **fields: Any) -> int:
        self.count += 1
        self.history.record("fault", kind=kind, id=self.count, phase="begin", **fields)
        return self.count

    def _end(self, kind: str, ident: int) -> None:
        self.history.record("fault", kind=kind, id=ident, phase="end")

    def _later(self, seconds: float, what: str, fn: Callable[[], None]) -> None:
        self.heals.append((time.monotonic() + seconds, what, fn))

    def _kill(self) -> None:
        live = self.fleet.live()
        if live:
            # A worker that exited on its own (it could not reach PostgreSQL at start) is not killed.
            with contextlib.suppress(StopIteration):
                self.fleet.kill(self.rng.choice(live))

    def _stop(self) -> None:
        live = self.fleet.live()
        if not live:
            return
        pid = self.rng.choice(live)
        seconds = self.rng.uniform(0.5, 8)
        if self.fleet.stop(pid) is None:
            return

        def cont() -> None:
            with contextlib.suppress(StopIteration, AssertionError):
                self.fleet.cont(pid)

        self._later(seconds, "cont", cont)

    def _pg_link_stall(self) -> None:
        self._stall_link("DU_DATABASE_URL", "pg-link-stall")

    def _redis_link_stall(self) -> None:
        self._stall_link("DU_REDIS_URL", "redis-link-stall")

    def _stall_link(self, server: str, kind: str) -> None:
        """Hold up everything one worker and ``server`` send each other (or the server's replies only,
        half the time), for 0.5 to 12 s: what reached the server is run, and its reply comes late; the
        other workers go on, and take over the worker's jobs once their leases ran out."""
        live = self.fleet.live()
        if not live:
            return
        pid = self.rng.choice(live)
        links = self.fleet.links_of(pid)
        if links is None:
            return
        link = links[LINKED.index(server)]
        seconds = self.rng.uniform(0.5, 12)
        replies_only = self.rng.random() < 0.5
        link.stall(replies_only=replies_only)
        ident = self._begin(kind, target=pid, how="replies" if replies_only else "both ways")

        def flow() -> None:
            self._end(kind, ident)  # before the bytes go, as Fleet.cont records first
            link.flow()

        self._later(seconds, "link", flow)

    def _redis_kill(self) -> None:
        if "redis" in self.busy:
            return
        self.busy.add("redis")
        seconds = self.rng.uniform(0.5, 3)
        ident = self._begin("redis-kill")
        self.server.stop()

        def restart() -> None:
            self.server.start()
            self._end("redis-kill", ident)
            self.busy.discard("redis")

        self._later(seconds, "redis", restart)

    def _redis_pause(self) -> None:
        if "redis" in self.busy:
            return
        self.busy.add("redis")
        seconds = self.rng.uniform(0.5, 4)
        if self.rng.random() < 0.5:
            ident = self._begin("redis-pause", how="DEBUG SLEEP")
            client = redis.Redis(port=self.server.port, socket_timeout=seconds + 30, socket_connect_timeout=5)

            def sleep() -> None:
                try:
                    client.execute_command("DEBUG", "SLEEP", f"{seconds:.2f}")
                finally:
                    client.close()
                    self._end("redis-pause", ident)
                    self.busy.discard("redis")

            threading.Thread(target=sleep, name="redis-sleep", daemon=True).start()
            return
        assert self.server.proc is not None
        pid = self.server.proc.pid
        os.kill(pid, signal.SIGSTOP)
        ident = self._begin("redis-pause", how="SIGSTOP")

        def cont() -> None:
            self._end("redis-pause", ident)  # before the signal, as Fleet.cont does
            os.kill(pid, signal.SIGCONT)
            self.busy.discard("redis")

        self._later(seconds, "redis", cont)

    def _pg_restart(self) -> None:
        if "pg" in self.busy:
            return
        self.busy.add("pg")
        seconds = self.rng.uniform(0.5, 3)
        ident = self._begin("pg-restart")
        crash(self.cluster)

        def start() -> None:
            self.cluster.start()
            self._end("pg-restart", ident)
            self.busy.discard("pg")

        self._later(seconds, "pg", start)

    def _pg_pause(self) -> None:
        if "pg" in self.busy:
            return
        pids = cluster_pids(self.cluster)
        if not pids:
            return
        self.busy.add("pg")
        seconds = self.rng.uniform(0.5, 4)
        for pid in pids:  # the whole server at once: a storage stall, a frozen VM
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        ident = self._begin("pg-pause")

        def cont() -> None:
            self._end("pg-pause", ident)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            self.busy.discard("pg")

        self._later(seconds, "pg", cont)


def crash(cluster: PostgresCluster) -> None:
    """Stop ``cluster`` as a crash does: every process of it SIGKILLed at once (the next start recovers).  Not
    ``pg_ctl stop -m immediate``: once, with a worker's link stalled, that waited past its 30 s for the server to
    go, and the nemesis's loop, waiting with it, could not heal the stall."""
    pids = cluster_pids(cluster)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        wait_gone(pid)
    # A killed postmaster may stay a zombie (nobody here reaps it), which its lock files' check counts as
    # running: they go, as the server they name is gone.
    for lock in (os.path.join(cluster.data, "postmaster.pid"),
                 os.path.join(cluster.dir, f".s.PGSQL.{cluster.port}.lock")):
        with contextlib.suppress(FileNotFoundError):
            os.remove(lock)


def cluster_pids(cluster: PostgresCluster) -> list[int]:
    """The postmaster of ``cluster`` and its children (backends, checkpointer, WAL writer...); none if it is
    not running."""
    try:
        with open(os.path.join(cluster.data, "postmaster.pid")) as f:
            postmaster = int(f.readline())
    except (OSError, ValueError):
        return []
    pids = [postmaster]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat") as f:
                    # The parent's pid is the 2nd field after the command, which is in parentheses.
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == postmaster:
                        pids.append(int(entry))
    return pids

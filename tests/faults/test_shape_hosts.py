"""Worker processes on several hosts: three network namespaces, one cut off under load and healed.

Each "host" is a network namespace of the test's own with a veth pair into this one (10.233.x.0/24,
a range of ours); a `dramatiq` worker runs in each (``ip netns exec``), against one Redis and one
PostgreSQL through PgBouncer (transaction mode), both listening on the host-side addresses; the
producers and the re-drive passes run here.  The event log has a Redis and a link of its own to each
host, never cut: the judge sees what the cut host did while it was away, in the order it did it.
Under a few hundred mixed sends, one host's link is
taken down for longer than the documented recovery time (the lease, ``lost_after``, the broker's
``heartbeat_timeout`` and two passes), then brought up again.

The cut host is judged as a frozen one (events.py ``stop``/``cont``): whatever it wrote after it came
back counts, so a run that went on under its lock while it was away would show beside its successor.
Asserted: every job succeeded; no key had more holders than allowed, no job ran beside itself, the
reruns are no more than the cut cut; and every job that was running on the cut host ran to its end
on another host before the cut host came back.

Where network namespaces cannot be made (not root, no ``ip``), the test is skipped, saying why; never
under CI (``CI=true``), where it fails instead.  Namespaces and veths are removed whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Optional

import pytest

from tests import fault_app
from tests.faults.harness import (
    Fleet,
    Redriver,
    fault_env,
    open_runs_by_pid,
    prefix,
    report,
    wait_all_succeeded,
    wait_for,
)
from tests.faults.shape_load import LIMIT, Load, judge, ran
from tests.faults.test_shape_pgbouncer import database
from tests.servers import PostgresCluster, PrivateRedis
from tests.shape_servers import Hosts, PgBouncer, namespaces_unavailable
from tests.workers import CliWorker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

HOSTS = 3
THREADS = 3
SENDS = 300
TTL = 1_000
LOST_AFTER = 2_000
HEARTBEAT_TIMEOUT = 3_000
#: Jobs of each measure of the cost per job, and the idle time measured before them (s).
JOBS = 300
IDLE_S = 2.0
#: How long the host stays cut off: twice the documented recovery time (docs/operations/deploying.md: a running
#: job's lease and lost_after, or the broker's heartbeat_timeout for the messages it had fetched, and
#: two re-drive passes).
CUT_S = 2 * (max(TTL + LOST_AFTER, HEARTBEAT_TIMEOUT) + 2 * 250) / 1000


#: Each test's namespaces and subnets (10.233.<subnet + i>.0/24): xdist may run both tests at once.
NETWORKS = {"test_three_hosts_one_cut_off_then_healed": ("hcut", 10),
            "test_cost_per_job_from_one_to_three_hosts": ("hcost", 20)}


@pytest.fixture
def hosts(request):
    reason = namespaces_unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"network namespaces are needed under CI: {reason}")
        pytest.skip(reason)
    tag, subnet = NETWORKS[request.node.originalname]
    made = Hosts(HOSTS, tag=tag, subnet=subnet)
    try:
        yield made.create()
    finally:
        made.remove()


class HostFleet(Fleet):
    """One `dramatiq` worker group per host, each run in its namespace with its host's URLs."""

    def __init__(self, envs: list[dict[str, str]], hosts: Hosts, log: fault_app.EventLog, log_dir: Path) -> None:
        self.envs, self.hosts = envs, hosts
        super().__init__(envs[0], log, log_dir, size=len(envs), threads=THREADS)

    def spawn(self) -> CliWorker:
        index = len(self.workers)
        worker = CliWorker("tests.fault_app", {**self.envs[index], "DU_FAULT_APP": "1"}, processes=1,
                           threads=self.threads, stderr_path=self.log_dir / f"host-{index}.log",
                           prefix=self.hosts.prefix(index))
        self.workers.append(worker)
        return worker


class Servers:
    """A PostgreSQL cluster behind PgBouncer and a Redis, both listening on every host's address."""

    def __init__(self, cleanup: contextlib.ExitStack, hosts: Hosts) -> None:
        self.hosts = hosts
        addresses = [hosts.host_address(i) for i in range(HOSTS)]
        self.cluster = PostgresCluster()
        cleanup.callback(self.cluster.remove)
        self.cluster.start()
        self.bouncer = PgBouncer("127.0.0.1", self.cluster.port, mode="transaction", pool_size=10,
                                 settings={"listen_addr": ",".join(["127.0.0.1", *addresses])})
        self.bouncer.start()
        cleanup.callback(self.bouncer.remove)
        self.redis = PrivateRedis(args=["--bind", "127.0.0.1", *addresses, "--protected-mode", "no"]).start()
        cleanup.callback(self.redis.stop)
        observers = [hosts.observer_address(i) for i in range(HOSTS)]
        self.log = PrivateRedis(args=["--bind", "127.0.0.1", *observers, "--protected-mode", "no"]).start()
        cleanup.callback(self.log.stop)

    def envs(self, count: int) -> tuple[dict[str, str], list[dict[str, str]]]:
        """The test process's variables, and each of ``count`` hosts' (the same servers at its own address)."""
        name = database(self.cluster)
        env = fault_env(broker_url=self.redis.url, database_url=self.bouncer.url(name), key_prefix=prefix(),
                        log_url=self.log.url, ttl=TTL, limit=LIMIT, lost_after=LOST_AFTER,
                        heartbeat_timeout=HEARTBEAT_TIMEOUT)
        out = []
        for i in range(count):
            address, observer = self.hosts.host_address(i), self.hosts.observer_address(i)
            out.append({**env, "DU_REDIS_URL": self.redis.url.replace("127.0.0.1", address),
                        "DU_DATABASE_URL": env["DU_DATABASE_URL"].replace("127.0.0.1", address),
                        "DU_LOG_REDIS_URL": self.log.url.replace("127.0.0.1", observer)})
        return env, out


def rig(cleanup: contextlib.ExitStack, servers: Servers, count: int, directory: Path
        ) -> tuple[fault_app.App, HostFleet, Redriver]:
    env, envs = servers.envs(count)
    app = fault_app.build(env)
    cleanup.callback(app.close)
    fleet = HostFleet(envs, servers.hosts, app.log, directory)
    cleanup.callback(fleet.close)
    redriver = Redriver(app)
    cleanup.callback(redriver.close)
    return app, fleet, redriver


def test_three_hosts_one_cut_off_then_healed(hosts, tmp_path):
    cut = HOSTS - 1
    with contextlib.ExitStack() as cleanup:
        servers = Servers(cleanup, hosts)
        app, fleet, redriver = rig(cleanup, servers, HOSTS, tmp_path)
        wait_for(lambda: all(w.children() for w in fleet.workers), timeout=60, what="a worker on every host")
        load = Load(app, SENDS, pause=0.02, run_ms=100, beat_ms=50).start()
        pids = fleet.workers[cut].children()
        wait_for(lambda: any(open_runs_by_pid(app.log, pids)[pid] for pid in pids), timeout=60,
                 what="the host to be running a job")
        hosts.cut(cut)
        time.sleep(0.05)  # what the host wrote before its link went down has landed
        stops = [app.log.record("stop", pid=pid, what=f"host {cut} cut off") for pid in pids]
        open_at_cut = {run.job for pid in pids for run in open_runs_by_pid(app.log, [pid])[pid]}
        time.sleep(CUT_S)
        back = app.log.record("cont", pid=pids[0], what=f"host {cut} back")
        for pid in pids[1:]:
            app.log.record("cont", pid=pid)
        hosts.heal(cut)
        load.join()
        figures, rows, log = judge(app, fleet, tmp_path, load, timeout=90)
    elsewhere = {r.job for r in log.runs if r.pid not in pids and r.done is not None and r.done_error is None
                 and r.done < back and r.start > stops[0]}
    assert open_at_cut <= elsewhere, (
        f"jobs running on the cut host not run elsewhere while it was away: {sorted(open_at_cut - elsewhere)}")
    recovered = [min(r.t_done for r in log.runs if r.job == job and r.pid not in pids and r.t_done is not None)
                 for job in open_at_cut]
    report(figures.line("shape-hosts-cut", 1, max(recovered, default=0) - log.seq_time(stops[0]),
                        sends=len(load.sent), hosts=HOSTS,
                        open_at_cut=len(open_at_cut), cut_s=CUT_S, redriven=redriver.counts.get("redriven", 0)))


def started(app: fault_app.App, fleet: HostFleet) -> None:
    """Every host's worker up, and a first job run."""
    wait_for(lambda: all(w.children() for w in fleet.workers), timeout=60, what="a worker on every host")
    app.unique.send("warm-up", 0)
    wait_for(lambda: ran(app) >= 1, timeout=60, what="a first job")


def _cpu(pid: int) -> float:
    """CPU seconds of a process and its children that it waited for (user + system)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    out = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            for child in f.read().split():
                out += _tree(int(child))
    except OSError:
        pass
    return out


def _postmaster(cluster: PostgresCluster) -> Optional[int]:
    try:
        with open(os.path.join(cluster.data, "postmaster.pid")) as f:
            return int(f.readline())
    except OSError:
        return None


def test_cost_per_job_from_one_to_three_hosts(hosts, tmp_path):
    """The same load on 1, 2 and 3 hosts: CPU per job of the workers, Redis, PgBouncer and PostgreSQL
    (reported; docs/discussions/benchmarks.md keeps the figures).  Each host adds its idle polling, nothing
    per job."""
    figures = []
    with contextlib.ExitStack() as servers_cleanup:
        servers = Servers(servers_cleanup, hosts)
        for count in range(1, HOSTS + 1):
            with contextlib.ExitStack() as cleanup:
                directory = tmp_path / f"hosts-{count}"
                directory.mkdir()
                app, fleet, _ = rig(cleanup, servers, count, directory)
                started(app, fleet)
                parts = {"workers": [p for w in fleet.workers for p in _tree(w.process.pid)],
                         "redis": [servers.redis.proc.pid],
                         "pgbouncer": _tree(servers.bouncer.proc.pid),
                         "postgres": _tree(_postmaster(servers.cluster) or 0)}
                # Idle first: what the hosts cost without jobs (their consumers' polling), reported beside.
                idle_before = sum(_cpu(p) for p in parts["workers"])
                time.sleep(IDLE_S)
                idle_rate = (sum(_cpu(p) for p in parts["workers"]) - idle_before) / IDLE_S
                before = {name: sum(_cpu(p) for p in pids) for name, pids in parts.items()}
                began = time.monotonic()
                load = Load(app, JOBS, pause=0.005, run_ms=10).start()
                load.join()
                done = wait_all_succeeded(app, timeout=90)
                wall = time.monotonic() - began
                parts["postgres"] = _tree(_postmaster(servers.cluster) or 0)  # backends come and go
                after = {name: sum(_cpu(p) for p in pids) for name, pids in parts.items()}
                jobs = len(done)
                per_job = {name: round((after[name] - before[name]) / jobs * 1000, 2) for name in parts}
                per_job["workers_idle_per_s"] = round(idle_rate * 1000, 1)  # not per job: ms per second idle
                figures.append((count, jobs, wall, per_job))
    for count, jobs, wall, per_job in figures:
        report(f"HOSTS hosts={count} jobs={jobs} wall_s={wall:.1f} "
               + " ".join(f"{name}_cpu_ms={value}" for name, value in per_job.items()))

"""Redis behind Sentinel: a fail-over and a master SIGKILL under load.

A master, a replica and three sentinels of the test's own (``down-after-milliseconds`` 1000); the
broker (``RedisBroker(client=dramatiq_unique.redis_client("redis+sentinel://..."))``) and the suite
(``redis="redis+sentinel://..."``) both on the service, the event log on a plain redis-server that
stays up.  A few hundred mixed sends, the tracked ones failing their first attempt so that retries
are always being scheduled; while two `dramatiq` workers run them, an operator's ``SENTINEL
FAILOVER``, then, once the replica has caught up, a SIGKILL of the master of the moment: the other
is promoted with what it had replicated.  Re-drive passes (``lost_after`` 3 s) run in the test process.

Asserted: every send returned or raised a connection error; every job succeeded (a retry that a
worker held in its delay queue when its connection broke is recovered, not left ``retrying``: the
worker forgets it, while its id stays in the worker's ack set); no key had more holders than
allowed, no job ran beside itself, the reruns are no more than the faults cut.  And the suite and
the broker share the one server: queue locks are written with the publish (broker/publish.py).
"""

from __future__ import annotations

import contextlib

import pytest
import redis

from dramatiq_unique import DatabaseUnavailable, RedisUnavailable
from tests.durable import RedisServer
from tests.faults.harness import fault_env, prefix, report, start_rig, wait_for
from tests.faults.shape_load import LIMIT, Load, judge, ran
from tests.shape_servers import SentinelGroup

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SENDS = 360
LOST_AFTER = 3_000


def outage(error: BaseException) -> bool:
    """A send may fail while no master answers: a connection error, as the broker's own would."""
    return isinstance(error, (redis.ConnectionError, redis.TimeoutError, RedisUnavailable, DatabaseUnavailable,
                              ConnectionError, OSError)) or "onnect" in f"{type(error).__name__} {error}"


def test_sentinel_failover_and_master_killed_under_load(tmp_path):
    with contextlib.ExitStack() as cleanup:
        group = SentinelGroup().start()
        cleanup.callback(group.stop)
        log_server = RedisServer().start()
        cleanup.callback(log_server.stop)
        env = fault_env(broker_url=group.url, log_url=log_server.url, database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
                        key_prefix=prefix(), limit=LIMIT, lost_after=LOST_AFTER)
        app, fleet, redriver = start_rig(cleanup, env, tmp_path, threads=3)
        assert app.suite.publisher is not None

        before = Load(app, SENDS // 2, pause=0.03, fail_first=1, expected=outage).start()
        wait_for(lambda: ran(app) >= 40, timeout=60, what="forty runs")
        fault = app.log.record("fault", what="SENTINEL FAILOVER")
        group.failover()
        app.log.record("back", what="the replica promoted")
        before.join()
        wait_for(lambda: _synced(group), timeout=30, what="the old master to follow the new one")
        # Under load again, tracked jobs failing their first attempt: retries are scheduled all the time.
        runs = ran(app)
        after = Load(app, SENDS // 2, pause=0.03, fail_first=1, expected=outage, first=SENDS // 2).start()
        wait_for(lambda: ran(app) >= runs + 60, timeout=60, what="sixty runs more")
        kill = app.log.record("fault", what="master SIGKILLed")
        old = group.kill_master()
        group.wait_new_master(old)
        back = app.log.record("back", what="the replica promoted")
        after.join()
        try:
            figures, rows, log = judge(app, fleet, tmp_path, before, after, timeout=60)
        except AssertionError:
            print(where_stuck(app, group))
            raise
        refused = len(before.refused) + len(after.refused)
    last_done = max(r.t_done for r in log.runs if r.t_done is not None)
    report(figures.line("shape-sentinel", 2, last_done - log.seq_time(kill), sends=SENDS, refused=refused,
                        redriven=redriver.counts.get("redriven", 0), released=redriver.counts.get("released", 0),
                        down_s=round(log.seq_time(back) - log.seq_time(kill), 1),
                        failover_s=round(log.seq_time(kill) - log.seq_time(fault), 1)))


def _synced(group: SentinelGroup) -> bool:
    master = group.client(socket_timeout=1)
    try:
        info = master.info("replication")
        replica = info.get("slave0") or {}
        return isinstance(replica, dict) and replica.get("state") == "online"
    finally:
        master.close()


def where_stuck(app, group: SentinelGroup) -> str:
    """For a post-mortem: where each unfinished row's message is in the broker."""
    from dramatiq_unique import JobModel
    from dramatiq_unique.broker.refs import BrokerKeys

    keys = BrokerKeys(app.broker.namespace)
    client = group.client(socket_timeout=2)
    acks = [k.decode() for k in client.scan_iter(match=f"{app.broker.namespace}:__acks__.*", count=1000)]
    live = {m.decode() for m in client.zrange(keys.heartbeats(), 0, -1)}
    lines = []
    for row in JobModel.select().where(JobModel.status != "succeeded").limit(20):
        places = [name for name in ("default", "default.DQ", "default.XQ")
                  if row.broker_ref and client.hexists(keys.messages(name), row.broker_ref)]
        held = [k.split("__acks__.", 1)[1] for k in acks if row.broker_ref and client.sismember(k, row.broker_ref)]
        held = [f"{h} ({'live' if h.rsplit('.', 2)[0].split('.')[0] in live else 'gone'})" for h in held]
        lines.append(f"{row.message_id[:8]} {row.status} attempts={row.attempts} due={row.process_after} "
                     f"checked={row.checked_at} missing={row.missing_since} in={places} acks={held}")
    return "\n".join(lines)

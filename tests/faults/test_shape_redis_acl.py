"""Redis as a managed service gives it: an ACL user limited to the app's keys, over plain TCP and over
TLS with client certificates.

A redis-server of the test's own with a user ``app`` whose ACL allows only the app's keys: the broker's
namespace, the suite's ``key_prefix`` and the locks under ``redlock:<key_prefix>`` (pottery's format,
docs/operations/deploying.md); the broker and the suite use that user, the event log the default user.  A few
hundred mixed sends while two `dramatiq` workers run them, one worker process SIGKILLed mid-run.

Asserted: every send returned; every job succeeded, no key had more holders than allowed, no job ran
beside itself, the reruns are no more than the kill cut.  And a user whose ACL leaves out the locks
gets :class:`~dramatiq_unique.RedisPermissionDenied` from a unique send, saying which keys it needs,
instead of a raw ``NOPERM`` error.
"""

from __future__ import annotations

import contextlib

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from tests.faults.harness import fault_env, open_runs_by_pid, prefix, report, start_rig, wait_for
from tests.faults.shape_load import LIMIT, Load, judge
from tests.servers import Certificates, PrivateRedis

pytestmark = pytest.mark.slow

SENDS = 300


def acl(key_prefix: str, *, locks: bool = True) -> list[str]:
    """redis-server's arguments for a user limited to the app's keys (and, with ``locks=False``, not its locks)."""
    # Dramatiq's dispatch.lua is given the namespace itself as its one key.
    keys = [f"~{key_prefix}-broker", f"~{key_prefix}-broker:*", f"~{key_prefix}:*"]
    if locks:
        keys.append(f"~redlock:{key_prefix}:*")
    return ["--user", "app", "on", ">app-secret", *keys, "&*", "+@all", "-@admin"]


@pytest.mark.parametrize("tls", [False, True], ids=["acl", "tls-acl"])
def test_an_acl_user_limited_to_the_apps_keys(tls, tmp_path):
    key_prefix = prefix()
    certs = Certificates(tmp_path) if tls else None
    with contextlib.ExitStack() as cleanup:
        server = PrivateRedis(tls=certs, client_certs=tls, args=acl(key_prefix)).start()
        cleanup.callback(server.stop)
        env = fault_env(broker_url=server.url_as("app", "app-secret"), log_url=server.url,
                        database_url=f"sqlite:///{tmp_path / 'jobs.db'}", key_prefix=key_prefix, limit=LIMIT)
        app, fleet, redriver = start_rig(cleanup, env, tmp_path, threads=3)
        load = Load(app, SENDS).start()
        busy = wait_for(lambda: [pid for pid, runs in open_runs_by_pid(app.log, fleet.pids()).items() if runs],
                        timeout=60, what="a worker process running a job")
        kill = fleet.kill(busy[0])
        load.join()
        figures, rows, log = judge(app, fleet, tmp_path, load)
        assert not redriver.errors, "every re-drive pass ran (its lock is one of the app's keys)"
    last_done = max(r.t_done for r in log.runs if r.t_done is not None)
    report(figures.line(f"shape-redis-{'tls-acl' if tls else 'acl'}", 1, last_done - log.seq_time(kill),
                        sends=len(load.sent)))


def test_an_acl_without_the_locks_is_named_in_the_error(tmp_path):
    key_prefix = prefix()
    server = PrivateRedis(args=acl(key_prefix, locks=False)).start()
    try:
        url = server.url_as("app", "app-secret")
        broker = RedisBroker(url=url, namespace=f"{key_prefix}-broker")
        dramatiq.set_broker(broker)
        suite = dramatiq_unique.setup(broker, database=f"sqlite:///{tmp_path / 'jobs.db'}", redis=url,
                                      key_prefix=key_prefix, redriver=False)

        @dramatiq.actor(unique_args=["key"])
        def report_once(key):
            pass

        with pytest.raises(dramatiq_unique.RedisPermissionDenied, match=r"redlock:<key_prefix>:\*"):
            report_once.send("k")
        with pytest.raises(dramatiq_unique.RedisPermissionDenied):
            dramatiq_unique.send_many(report_once, [("a",), ("b",)])
        assert broker.client.llen(f"{key_prefix}-broker:default") == 0, "nothing published without its lock"
        with pytest.raises(dramatiq_unique.RedisPermissionDenied, match="NOPERM"):
            dramatiq_unique.redrive(broker)
        assert dramatiq_unique.dead_jobs() == [] and not list(dramatiq_unique.JobModel.select()), "no row left"
        suite.close()
        broker.close()
    finally:
        server.stop()

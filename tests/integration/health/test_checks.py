"""The `check` command on SQLite and PostgreSQL: each finding and its severity, the exit codes, the
environment mode, and the HTTP probe."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta

import dramatiq
import pytest
import redis

import dramatiq_unique
from dramatiq_unique import JobModel, redrive
from dramatiq_unique.cli import main
from dramatiq_unique.health import checks, commands
from dramatiq_unique.health.target import of_suite
from dramatiq_unique.parking.groups import lock_group
from dramatiq_unique.storage.database import open_database
from dramatiq_unique.storage.models import utcnow
from tests.conftest import REDIS_URL
from tests.durable import free_port
from tests.helpers import under_faketime
from tests.integration.storage.v1_schema import create_v1_table
from tests.servers import PrivateRedis

DEAD_REDIS = "redis://127.0.0.1:1/0"


def _by(report, check):
    return [f for f in report.findings if f.check == check]


def _row(suite, **fields):
    values = dict(message_id=fields.pop("message_id", None) or f"m-{utcnow().timestamp()}-{len(fields)}",
                  actor_name="job", queue_name="default", app=suite.app, **fields)
    return JobModel.create(**values)


def test_findings_and_severities(suite, broker):
    """Healthy but no re-drive pass yet: a warning; after a pass: ok.  Then an overdue waiting row, a
    running row whose lease ran out long ago and a parked row whose lock has no holder: warnings."""
    dramatiq.actor(lambda n: n, broker=broker, actor_name="job", track=True)
    target = of_suite(suite)
    report = checks.run(target, recheck=10)
    assert _by(report, "redrive")[0].severity == checks.WARNING and report.code == checks.WARNING
    assert {f.check for f in report.findings} == {"database", "schema", "redis", "redrive", "overdue", "parked"}

    redrive(broker, suite=suite)
    assert checks.run(target, recheck=10).code == checks.OK, checks.run(target).as_dict()
    assert checks.run(target, max_pass_age=-1, recheck=10).code == checks.WARNING  # a pass too old

    long_ago = utcnow() - timedelta(hours=1)
    waiting = _row(suite, status="pending", process_after=long_ago)
    _row(suite, message_id="running-1", status="running", lease_until=long_ago)
    _row(suite, message_id="parked-1", status="pending", parked_on=lock_group("nobody-holds-it"))
    report = checks.run(target, recheck=10)
    overdue = _by(report, "overdue")
    assert sorted(f.data["kind"] for f in overdue) == ["running", "waiting"]
    assert waiting.id in next(f for f in overdue if f.data["kind"] == "waiting").data["ids"]
    (parked,) = _by(report, "parked")
    assert parked.severity == checks.WARNING and parked.data["count"] == 1
    assert report.code == checks.WARNING
    assert checks.run(target, overdue_after=3 * 3600 * 1000, recheck=10).code == checks.WARNING  # parked still


def test_redis_quorum(suite):
    target = of_suite(suite)
    live = redis.Redis.from_url(REDIS_URL, socket_timeout=1)
    dead = redis.Redis.from_url(DEAD_REDIS, socket_timeout=1, socket_connect_timeout=1)
    target.masters = [live, live, dead]
    assert checks.redis_masters(target).severity == checks.WARNING
    target.masters = [live, dead, dead]
    assert checks.redis_masters(target).severity == checks.CRITICAL
    assert checks.run(target, recheck=10).code == checks.CRITICAL


def test_a_redis_that_may_evict_keys_is_a_warning(suite):
    target = of_suite(suite)
    server = PrivateRedis(args=["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]).start()
    try:
        target.masters = [server.client(socket_timeout=1)]
        finding = checks.redis_masters(target)
        assert finding.severity == checks.WARNING and "maxmemory-policy allkeys-lru" in finding.detail
        server.client().config_set("maxmemory", "0")
        assert checks.redis_masters(target).severity == checks.OK
    finally:
        server.stop()


def test_database_down_and_schema_out_of_date(database_url, monkeypatch, capsys):
    """Environment mode: a primary that does not answer is critical (exit 2); a version-1 table too."""
    monkeypatch.setenv("DRAMATIQ_UNIQUE_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("DRAMATIQ_UNIQUE_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/test")
    assert main(["check", "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "critical" and report["findings"][0]["check"] == "database"

    db = open_database(database_url)
    create_v1_table(db)
    db.close()
    monkeypatch.setenv("DRAMATIQ_UNIQUE_DATABASE_URL", database_url)
    assert main(["check"]) == 2
    out = capsys.readouterr().out
    assert "CRITICAL schema" in out and "migrate" in out
    assert "parked" in out  # not checked without the app: said so


def test_probe_over_http(suite, broker, monkeypatch):
    """`check --probe-port` answers 200 with the report while nothing is critical, 503 when something is,
    until interrupted."""
    target = of_suite(suite)
    servers, said, serve = [], [], commands.ProbeServer

    def uncached(*args, **options):
        servers.append(serve(*args, **options, cache_ms=0))
        return servers[0]

    monkeypatch.setattr(commands, "ProbeServer", uncached)
    done = []
    thread = threading.Thread(target=lambda: done.append(commands.check(
        target, lambda data, text: None, probe_port=0, probe_host="127.0.0.1", say=said.append)), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not said and time.monotonic() < deadline:
        time.sleep(0.01)
    assert said and said[0].startswith("health probe on http://127.0.0.1:")
    url = f"http://127.0.0.1:{servers[0].server_address[1]}/health"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert answer.status == 200
            assert json.loads(answer.read())["status"] in ("ok", "warning")
        target.masters = [redis.Redis.from_url(DEAD_REDIS, socket_timeout=1, socket_connect_timeout=1)]
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(url, timeout=10)
        assert failed.value.code == 503
        assert json.loads(failed.value.read())["code"] == checks.CRITICAL
    finally:
        servers[0].shutdown()  # as an interrupt ends serve_forever()
        thread.join(10)
    assert done == [0]


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as failed:
        return failed.code, dict(failed.headers), failed.read().decode()


def test_the_probe_tells_a_status_and_a_short_reason_and_details_only_when_asked(suite, broker, monkeypatch):
    """Anyone who reaches the probe's port learns no host, user, database, table, job id or version."""
    target = of_suite(suite)
    long_ago = utcnow() - timedelta(hours=1)
    job = _row(suite, status="pending", process_after=long_ago)
    secrets = ("postgresql://", "SQLite at", "127.0.0.1", "postgres@", JobModel._meta.table_name,
               str(suite.db.database), f"[{job.id}", "Python")
    bodies = {}
    for details in (False, True):
        server = commands.ProbeServer(lambda: checks.run(target, recheck=10), 0, host="127.0.0.1", cache_ms=0,
                                details=details)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            code, headers, body = _get(f"http://127.0.0.1:{server.server_address[1]}/")
        finally:
            server.shutdown()
            server.server_close()
        assert code == 200, body  # an overdue job and no re-drive pass yet: warnings
        bodies[details] = body
        said = body + json.dumps(headers)
        assert details or not [s for s in secrets if s in said], (s for s in secrets if s in said)
    short = json.loads(bodies[False])
    assert short["status"] == "warning" and short["checks"]["database"] == "ok"
    assert short["checks"]["overdue"] == "warning" and short["checks"]["redis"] == "ok"
    assert str(suite.db.database) in bodies[True] and f"[{job.id}" in bodies[True]  # the whole report, when asked

    # The command line: --probe-details reaches the probe (the server is the real one, stopped after a GET).
    answers = []
    real_serve = commands.ProbeServer

    def serve_once(*args, **kwargs):
        server = real_serve(*args, **kwargs)

        def ask():
            answers.append(_get(f"http://127.0.0.1:{server.server_address[1]}/"))
            server.shutdown()

        threading.Thread(target=ask, daemon=True).start()
        return server

    monkeypatch.setattr(commands, "ProbeServer", serve_once)
    monkeypatch.setenv("DRAMATIQ_UNIQUE_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("DRAMATIQ_UNIQUE_DATABASE_URL", f"postgresql://app:pw@127.0.0.1:{free_port()}/secretdb")
    for words, shows in ((["check", "--probe-port", "0", "--probe-host", "127.0.0.1"], False),
                         (["check", "--probe-port", "0", "--probe-host", "127.0.0.1", "--probe-details"], True)):
        assert main(words) == 0
        code, _, body = answers.pop()
        assert code == 503 and ("secretdb" in body) is shows and "pw@" not in body, body


def test_a_retry_overdue_by_lost_after_and_two_passes_is_reported(suite, broker):
    """A retrying row is reported once it is due ``lost_after`` and two re-drive intervals ago (70 s with
    the defaults), not after the five minutes a waiting row gets (a backlog); one due less is not."""
    dramatiq.actor(lambda n: n, broker=broker, actor_name="job", track=True)
    redrive(broker, suite=suite)
    target = of_suite(suite)
    late = _row(suite, status="retrying", process_after=utcnow() - timedelta(seconds=100))
    _row(suite, status="retrying", process_after=utcnow() - timedelta(seconds=30))
    _row(suite, status="queued", process_after=utcnow() - timedelta(seconds=100))  # a backlog: not yet
    (finding,) = _by(checks.run(target, recheck=10), "overdue")
    assert finding.severity == checks.WARNING and finding.data["kind"] == "retrying"
    assert finding.data["ids"] == [late.id] and "more than 70 s ago" in finding.detail
    assert finding.data["overdue_after_ms"] == suite.settings.lost_after + 2 * suite.settings.redrive_interval


def test_a_host_clock_off_the_databases_is_a_warning(broker, pg_url, key_prefix):
    """Run on a host whose clock is 3 s ahead of the database's, the `check` command's database finding is a
    warning saying so (a probe on every worker host finds the one that drifted)."""
    dramatiq_unique.setup(broker, database=pg_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False).close()
    env = {"DRAMATIQ_UNIQUE_DATABASE_URL": pg_url, "DRAMATIQ_UNIQUE_REDIS_URL": REDIS_URL}
    done = under_faketime("+3s", "from dramatiq_unique.cli import main; raise SystemExit(main(['check', '--json']))",
                          **env)
    found = [f for f in json.loads(done.stdout)["findings"] if f["check"] == "database"]
    assert done.returncode == 1 and found[0]["severity"] == "warning", done.stdout + done.stderr
    assert "this host's clock is 3.0 s ahead of the database's" in found[0]["detail"]
    done = under_faketime("", "from dramatiq_unique.cli import main; raise SystemExit(main(['check', '--json']))",
                          **env)
    assert [f["severity"] for f in json.loads(done.stdout)["findings"] if f["check"] == "database"] == ["ok"]


def test_a_redis_replica_named_as_a_master_counts_as_down(suite):
    """A replica cannot hold the suite's locks: named by the `redis` finding as a master that is not one."""
    master = PrivateRedis().start()
    replica = PrivateRedis(args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    try:
        target = of_suite(suite)
        target.masters = [replica.client()]
        finding = checks.redis_masters(target)
        assert finding.severity == checks.CRITICAL and f"a replica of 127.0.0.1:{master.port}" in finding.detail
    finally:
        replica.stop()
        master.stop()

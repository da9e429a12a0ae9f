"""The check's severities and the probe's answers, without services."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
import redis

from dramatiq_unique.health import checks, commands
from dramatiq_unique.health.target import Target, from_environment
from dramatiq_unique.redis.keys import RedisKeys


class _Client:
    def __init__(self, up: bool, memory: "dict | None" = None) -> None:
        self.up, self.memory = up, memory or {"maxmemory": 0, "maxmemory_policy": "noeviction"}

    def ping(self) -> bool:
        if not self.up:
            raise redis.ConnectionError("refused")
        return True

    def info(self, section: str) -> dict:
        if self.memory == "refused":
            raise redis.ResponseError("NOPERM this user has no permissions to run the 'info' command")
        return self.memory


def _target(*ups: bool) -> Target:
    return Target(databases=[], models=[], masters=[_Client(up) for up in ups], keys=RedisKeys("x"), app="x",
                  lost_after=60_000, redrive_interval=5_000)


@pytest.mark.parametrize("ups, severity", [
    ((True,), checks.OK), ((False,), checks.CRITICAL), ((True, True, False), checks.WARNING),
    ((True, False, False), checks.CRITICAL), ((), checks.WARNING),
])
def test_redis_quorum(ups, severity):
    assert checks.redis_masters(_target(*ups)).severity == severity


@pytest.mark.parametrize("memory, severity", [
    ({"maxmemory": 67108864, "maxmemory_policy": "volatile-lru"}, checks.WARNING),
    ({"maxmemory": 67108864, "maxmemory_policy": "noeviction"}, checks.OK),
    ({"maxmemory": 0, "maxmemory_policy": "allkeys-lru"}, checks.OK),  # no limit: nothing is evicted
    ("refused", checks.OK),  # an ACL without INFO: not looked at
])
def test_a_redis_that_may_evict_keys(memory, severity):
    target = _target()
    target.masters = [_Client(True, memory)]
    finding = checks.redis_masters(target)
    assert finding.severity == severity
    assert ("noeviction" in finding.detail) is (severity == checks.WARNING)


def test_the_report_is_the_worst_finding():
    report = checks.Report([checks.Finding("a", checks.OK, ""), checks.Finding("b", checks.WARNING, "")])
    assert report.code == 1 and report.as_dict()["status"] == "warning"
    assert checks.Report([]).code == checks.OK


def test_no_environment_no_target():
    assert from_environment(environ={}) is None


@pytest.mark.parametrize("severity, code", [(checks.OK, 200), (checks.WARNING, 200), (checks.CRITICAL, 503)])
def test_the_probe_answers(severity, code):
    server = commands.ProbeServer(lambda: checks.Report([checks.Finding("x", severity, "d")]), 0, host="127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        try:
            answer = urllib.request.urlopen(url, timeout=5)
        except urllib.error.HTTPError as e:
            answer = e
        assert answer.status == code
        assert json.loads(answer.read())["code"] == severity
    finally:
        server.shutdown()
        server.server_close()


def test_a_failing_check_answers_503():
    def broken() -> checks.Report:
        raise RuntimeError("boom")

    server = commands.ProbeServer(broken, 0, host="127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/", timeout=5)
        assert failed.value.code == 503
    finally:
        server.shutdown()
        server.server_close()

"""The suite's scripts over a Sentinel client reach the service's master (a Sentinel group of the test's own)."""

from __future__ import annotations

import uuid

import redis

import dramatiq_unique
from dramatiq_unique.redis import scripts
from tests.conftest import REDIS_URL
from tests.shape_servers import SentinelGroup


def test_a_script_over_a_sentinel_client_runs_on_the_master():
    """A fresh thread's connection must ask the sentinels for the master before its first command:
    redis-py 8's send_command connects without that, to the default localhost:6379 (the shared Redis)."""
    group = SentinelGroup().start()
    key = f"dutest_sentinel_{uuid.uuid4().hex[:10]}"
    shared = redis.Redis.from_url(REDIS_URL)
    try:
        client = dramatiq_unique.redis_client(group.url)
        write = scripts.Script(client, "redis.call('set', KEYS[1], ARGV[1]) return redis.call('get', KEYS[1])")
        assert write(keys=[key], args=["here"]) == b"here"
        master = group.client()
        assert master.get(key) == b"here", "written on the master"
        assert shared.get(key) is None, "not on the Redis at localhost:6379"
        master.close()
    finally:
        shared.delete(key)
        shared.close()
        group.stop()

"""Actors for the concurrency-slot tests, loaded both by the tests and by
``dramatiq tests.slots_app`` worker subprocesses.

Imported by the dramatiq CLI (``DU_DATABASE_URL`` set), it sets up a
broker and suite from the environment: ``DU_REDIS_URL``, ``DU_NAMESPACE``
(the broker's), ``DU_DATABASE_URL``, ``DU_KEY_PREFIX``, ``DU_LIMIT``,
``DU_TTL`` (the slot lease, ms).  Every job counts itself in and out of
its tenant's running count in Redis (one script, so the peak is exact
across processes) and logs ``[event, tenant, i, time, pid]`` to the list
``<key prefix>:log``.
"""

from __future__ import annotations

import json
import os
import time

import dramatiq
import redis

from dramatiq_unique import heartbeat
from tests.workers import CliWorker, setup_from_env

# KEYS[1] running counts, KEYS[2] peaks; ARGV tenant, +1/-1.
_COUNT = """
local n = redis.call('hincrby', KEYS[1], ARGV[1], ARGV[2])
if tonumber(ARGV[2]) > 0 and n > tonumber(redis.call('hget', KEYS[2], ARGV[1]) or '0') then
  redis.call('hset', KEYS[2], ARGV[1], n)
end
return n
"""


class Tally:
    """Running counts, peaks and a start/end log per tenant, in Redis under ``key_prefix``."""

    def __init__(self, redis_url: str, key_prefix: str) -> None:
        self.client = redis.Redis.from_url(redis_url)
        self.prefix = key_prefix
        self._count = self.client.register_script(_COUNT)

    def enter(self, tenant: str, i: int) -> None:
        self._count(keys=[f"{self.prefix}:running", f"{self.prefix}:peak"], args=[tenant, 1])
        self.client.rpush(f"{self.prefix}:log", json.dumps(["start", tenant, i, time.time(), os.getpid()]))

    def leave(self, tenant: str, i: int) -> None:
        self.client.rpush(f"{self.prefix}:log", json.dumps(["end", tenant, i, time.time(), os.getpid()]))
        self._count(keys=[f"{self.prefix}:running", f"{self.prefix}:peak"], args=[tenant, -1])

    def peaks(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.client.hgetall(f"{self.prefix}:peak").items()}

    def running(self, tenant: str) -> int:
        return int(self.client.hget(f"{self.prefix}:running", tenant) or 0)

    def log(self) -> list[list]:
        return [json.loads(raw) for raw in self.client.lrange(f"{self.prefix}:log", 0, -1)]

    def ended(self) -> int:
        return sum(1 for e in self.log() if e[0] == "end")


def declare(redis_url: str, key_prefix: str, limit: int, ttl: int) -> dramatiq.Actor:
    """Declare ``slot_job`` on the current broker (after ``setup()``)."""
    tally = Tally(redis_url, key_prefix)

    @dramatiq.actor(
        actor_name="slot_job", concurrency_limit=limit, concurrency_key=["tenant"], concurrency_ttl=ttl,
        max_retries=0,
    )
    def slot_job(tenant: str, i: int, run_ms: int = 30, beat_ms: int = 0) -> None:
        tally.enter(tenant, i)
        try:
            deadline = time.monotonic() + run_ms / 1000
            step = (beat_ms or run_ms) / 1000
            while (left := deadline - time.monotonic()) > 0:
                time.sleep(min(step, left))
                if beat_ms:
                    heartbeat()
        finally:
            tally.leave(tenant, i)

    return slot_job


if os.environ.get("DU_DATABASE_URL") and os.environ.get("DU_APP") == "slots":
    if os.environ.get("DU_DEBUG"):  # a test that keeps the workers' stderr wants the suite's own story
        import logging

        logging.getLogger("dramatiq_unique").setLevel(logging.DEBUG)
    setup_from_env()
    declare(os.environ["DU_REDIS_URL"], os.environ["DU_KEY_PREFIX"], int(os.environ.get("DU_LIMIT", "2")),
            int(os.environ.get("DU_TTL", "60000")))


class WorkerProcess(CliWorker):
    """``dramatiq tests.slots_app`` worker subprocesses, configured through the environment.

    :meth:`stop` ends them (SIGTERM, then SIGKILL); :meth:`kill_child` SIGKILLs one worker process.
    """

    def __init__(self, *, redis_url: str, namespace: str, database_url: str, key_prefix: str, limit: int = 2,
                 ttl: int = 60_000, processes: int = 1, threads: int = 4,
                 stderr_path: "str | os.PathLike[str] | None" = None, debug: bool = False) -> None:
        super().__init__("tests.slots_app", {
            "DU_APP": "slots",
            "DU_REDIS_URL": redis_url,
            "DU_NAMESPACE": namespace,
            "DU_DATABASE_URL": database_url,
            "DU_KEY_PREFIX": key_prefix,
            "DU_LIMIT": str(limit),
            "DU_TTL": str(ttl),
            **({"DU_DEBUG": "1"} if debug else {}),
        }, processes=processes, threads=threads, stderr_path=stderr_path)

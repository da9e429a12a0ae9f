"""Actors for the execution-lock tests, loaded both by the tests and by
``dramatiq tests.exec_app`` worker subprocesses.

Imported by the dramatiq CLI (``DU_DATABASE_URL`` set), it sets up a
broker and suite from the environment: ``DU_REDIS_URL``, ``DU_NAMESPACE``
(the broker's), ``DU_DATABASE_URL``, ``DU_KEY_PREFIX``, ``DU_TTL`` (ms).
Every job logs ``[event, key, i, time, pid, fencing token]`` to the Redis
list ``<key prefix>:log``, so the test sees what every process did.
"""

from __future__ import annotations

import json
import os
import time

import dramatiq
import redis

from dramatiq_unique import current_job, heartbeat
from tests.workers import CliWorker, setup_from_env


def log_key(key_prefix: str) -> str:
    return f"{key_prefix}:log"


def declare(redis_url: str, key_prefix: str, ttl: int) -> dramatiq.Actor:
    """Declare ``exec_job`` on the current broker (after ``setup()``)."""
    log = redis.Redis.from_url(redis_url)

    def record(event: str, key: str, i: int) -> None:
        entry = [event, key, i, time.time(), os.getpid(), current_job().fencing_token]
        log.rpush(log_key(key_prefix), json.dumps(entry))

    @dramatiq.actor(
        actor_name="exec_job", unique_args=["key"], unique_lock="while_executing", unique_ttl=ttl,
        max_retries=0,
    )
    def exec_job(key: str, i: int, run_ms: int = 5, beat_ms: int = 0) -> None:
        record("start", key, i)
        deadline = time.monotonic() + run_ms / 1000
        while time.monotonic() < deadline:
            time.sleep(min(beat_ms or run_ms, run_ms) / 1000)
            if beat_ms:
                heartbeat()
        record("end", key, i)

    return exec_job


def read_log(client: redis.Redis, key_prefix: str) -> list[list]:
    return [json.loads(raw) for raw in client.lrange(log_key(key_prefix), 0, -1)]


if os.environ.get("DU_DATABASE_URL"):
    setup_from_env()
    declare(os.environ["DU_REDIS_URL"], os.environ["DU_KEY_PREFIX"], int(os.environ.get("DU_TTL", "60000")))


class WorkerProcess(CliWorker):
    """A ``dramatiq tests.exec_app`` worker subprocess (one worker process) with its own environment.

    Stop it with :meth:`stop`; :meth:`kill_child` SIGKILLs the worker process itself.
    """

    def __init__(self, *, redis_url: str, namespace: str, database_url: str, key_prefix: str, ttl: int,
                 threads: int = 4) -> None:
        super().__init__("tests.exec_app", {
            "DU_REDIS_URL": redis_url,
            "DU_NAMESPACE": namespace,
            "DU_DATABASE_URL": database_url,
            "DU_KEY_PREFIX": key_prefix,
            "DU_TTL": str(ttl),
        }, threads=threads)

"""Actors for the gevent shape test (tests/faults/test_shape_gevent.py), loaded both by the test and by
``dramatiq-gevent tests.gevent_app`` worker subprocesses (``DU_*`` variables: tests/workers.py).

Each job sleeps a little (a gevent worker's greenlet yields there) and counts its run in Redis, in the
hash ``<key prefix>:runs``, so that the test sees how many times each ran, across processes.
"""

from __future__ import annotations

import os
import time

import dramatiq
import redis

from tests.workers import setup_from_env

#: Jobs of the slot-limited actor that run at once.
LIMIT = 3

if os.environ.get("DU_DATABASE_URL"):
    setup_from_env()
_runs = redis.Redis.from_url(os.environ["DU_REDIS_URL"]) if os.environ.get("DU_REDIS_URL") else None


def _ran(label: str) -> None:
    time.sleep(0.05)
    assert _runs is not None
    _runs.hincrby(f"{os.environ['DU_KEY_PREFIX']}:runs", label, 1)


@dramatiq.actor(track=True, max_retries=0)
def tracked(i: int) -> None:
    _ran(f"tracked:{i}")


@dramatiq.actor(unique_args=["i"], unique_lock="until_and_while_executing", max_retries=0)
def unique(i: int) -> None:
    _ran(f"unique:{i}")


@dramatiq.actor(concurrency_limit=LIMIT, max_retries=0)
def limited(i: int) -> None:
    _ran(f"limited:{i}")

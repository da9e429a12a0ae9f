"""A Dramatiq app for tests that start real processes: ``dramatiq tests.redrive_app`` workers
and ``python -m dramatiq_unique redrive tests.redrive_app``.  Configured by environment
variables, so each test gives it its own Redis namespace, key prefix and database."""

from __future__ import annotations

import os
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import current_job

env = os.environ.get

broker = RedisBroker(
    url=env("DU_REDIS_URL", "redis://127.0.0.1:6379/0"),
    namespace=env("DU_NAMESPACE", "dramatiq_unique-tests"),
    # Short, so that a killed worker counts as dead within the test's time.
    heartbeat_timeout=int(env("DU_HEARTBEAT_TIMEOUT", "60000")),
)
dramatiq.set_broker(broker)
suite = dramatiq_unique.setup(
    broker,
    database=env("DU_DATABASE_URL", "sqlite:///jobs.db"),
    redis=env("DU_REDIS_URL", "redis://127.0.0.1:6379/0"),
    key_prefix=env("DU_KEY_PREFIX", "dramatiq_unique-tests"),
    redriver=env("DU_REDRIVER", "1") == "1",
    redrive_interval=int(env("DU_REDRIVE_INTERVAL", "5000")),
    lost_after=int(env("DU_LOST_AFTER", "60000")),
)


@dramatiq.actor(track=True, unique_ttl=int(env("DU_UNIQUE_TTL", "60000")), max_retries=3, min_backoff=100)
def slow_job(seconds: float) -> int:
    """Sleeps ``seconds`` on its first attempt only: a worker killed during it leaves work to recover."""
    attempt = current_job().attempts
    if attempt == 1:
        time.sleep(seconds)
    return attempt


@dramatiq.actor(track=True)
def quick_job(n: int) -> int:
    return n

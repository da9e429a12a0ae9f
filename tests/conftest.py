"""Fixtures: real Redis, real SQLite and PostgreSQL, real Dramatiq brokers and workers.

Each test gets its own Redis key namespace (broker and suite), its own
SQLite file or PostgreSQL schema, and stops whatever it starts.  A
missing service fails the run loudly: nothing here is skipped or faked
(a run of tests/unit alone needs none).
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import dramatiq
import peewee as pw
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from tests.helpers import LOST_AFTER

REDIS_URL = os.environ.get("DRAMATIQ_UNIQUE_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_URL = os.environ.get("DRAMATIQ_UNIQUE_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
RABBITMQ_URL = os.environ.get("DRAMATIQ_UNIQUE_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672")


def _answers(url: str, default_port: int) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout=3):
            return True
    except OSError:
        return False


UNIT = Path(__file__).parent / "unit"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Stop the run before any test if a service does not answer, unless every test chosen is a unit test."""
    if session.items and all(UNIT in item.path.parents for item in session.items):
        return  # tests/unit needs no service
    missing = [
        f"{name} at {url}"
        for name, url, port in (
            ("Redis", REDIS_URL, 6379), ("PostgreSQL", PG_URL, 5432), ("RabbitMQ", RABBITMQ_URL, 5672)
        )
        if not _answers(url, port)
    ]
    if missing:
        pytest.exit("services the tests need do not answer: " + ", ".join(missing), returncode=3)


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def key_prefix(redis_client: redis.Redis) -> Iterator[str]:
    prefix = unique_name("dutest")
    yield prefix
    for pattern in (f"{prefix}*", f"redlock:{prefix}*"):
        keys = list(redis_client.scan_iter(match=pattern, count=1000))
        if keys:
            redis_client.delete(*keys)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'jobs.db'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    schema = unique_name("du")
    admin = pw.PostgresqlDatabase(None)
    parsed = urlparse(PG_URL)
    admin.init(parsed.path.lstrip("/"), host=parsed.hostname, port=parsed.port or 5432, user=parsed.username)
    admin.execute_sql(f'CREATE SCHEMA "{schema}"')
    yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    admin.execute_sql(f'DROP SCHEMA "{schema}" CASCADE')
    admin.close()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request) -> str:
    """Each test that takes this runs on SQLite and on PostgreSQL."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def broker(key_prefix: str) -> Iterator[RedisBroker]:
    broker = RedisBroker(url=REDIS_URL, namespace=key_prefix + "-broker")
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


@pytest.fixture
def suite(broker, database_url: str, key_prefix: str) -> Iterator[dramatiq_unique.Suite]:
    suite = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    yield suite
    suite.db.close()


@pytest.fixture
def fast(suite: dramatiq_unique.Suite) -> dramatiq_unique.Suite:
    """The suite with short timings, so a message counts as lost within a second."""
    suite.settings.lost_after = LOST_AFTER
    return suite


@pytest.fixture
def worker(broker, suite) -> Iterator[dramatiq.Worker]:
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=4)
    worker.start()
    yield worker
    worker.stop(timeout=10_000)

"""Fixtures of the integration tests (the shared ones are in tests/conftest.py): worker threads, RabbitMQ."""

from __future__ import annotations

import uuid
from typing import Iterator, Optional

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.common import dq_name, xq_name

import dramatiq_unique
from tests.conftest import RABBITMQ_URL, REDIS_URL
from tests.helpers import LOST_AFTER


@pytest.fixture
def make_worker(broker, suite) -> Iterator:
    started: list[dramatiq.Worker] = []

    def make(threads: int = 8, prefetch: Optional[int] = None) -> dramatiq.Worker:
        worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=threads)
        if prefetch is not None:
            worker.queue_prefetch = prefetch  # Dramatiq's default: twice the threads
        worker.start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop(timeout=10_000)


@pytest.fixture
def queue() -> str:
    """A RabbitMQ queue of the test's own, deleted afterwards."""
    return f"du_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def rabbit(queue: str) -> Iterator[RabbitmqBroker]:
    broker = RabbitmqBroker(url=RABBITMQ_URL)
    dramatiq.set_broker(broker)
    yield broker
    channel = broker.channel
    for name in (queue, dq_name(queue), xq_name(queue)):
        channel.queue_delete(queue=name)
    broker.close()


@pytest.fixture
def rabbitmq_suite(rabbit, database_url: str, key_prefix: str) -> Iterator[dramatiq_unique.Suite]:
    """The suite on the RabbitMQ broker; a test module takes it as its ``suite`` with a fixture of its own."""
    suite = dramatiq_unique.setup(
        rabbit, database=database_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False, lost_after=LOST_AFTER
    )
    yield suite
    suite.db.close()

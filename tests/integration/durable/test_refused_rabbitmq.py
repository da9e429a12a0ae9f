"""On RabbitMQ, a unique job that AgeLimit skips is failed and frees its key at once.

RabbitMQ dead-letters the skipped message; nothing would ever free the key
otherwise (the re-drive trusts RabbitMQ's queues).  SQLite and PostgreSQL.
"""

from __future__ import annotations

import dramatiq
import pytest

import dramatiq_unique
from tests.helpers import job_of, wait_until
from tests.integration.broker.helpers import start_worker


@pytest.fixture
def suite(rabbitmq_suite):
    """The suite on the RabbitMQ broker, in place of the Redis one of tests/conftest.py."""
    return rabbitmq_suite


def test_a_unique_job_agelimit_skips_frees_its_key_on_rabbitmq(suite, rabbit, queue):
    runs = []

    @dramatiq.actor(queue_name=queue, unique_args=["key"], unique_lock="until_executed", max_age=1)
    def work(key):
        runs.append(key)

    first = work.send("k")
    assert work.send("k").message_id == first.message_id  # the key is held
    worker = start_worker(rabbit)
    try:
        wait_until(lambda: job_of(first).status == "failed", timeout=15)
        job = job_of(first)
        assert job.last_error.startswith("SkipMessage: Message age limit exceeded") and job.unique_hold is None
        work.options["max_age"] = None
        again = work.send("k")
        assert again.message_id != first.message_id
        wait_until(lambda: job_of(again).status == "succeeded", timeout=15)
    finally:
        worker.stop()
    assert runs == ["k"] and dramatiq_unique.get_job(first.message_id).status == "failed"

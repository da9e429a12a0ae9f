"""send_many on Dramatiq's RabbitmqBroker: the single send per item (dramatiq_unique.unique.bulk)."""

from __future__ import annotations

import dramatiq
import pytest

from dramatiq_unique import JobModel, send_many
from tests.helpers import job_of, wait_until
from tests.integration.broker.helpers import start_worker


@pytest.fixture
def suite(rabbitmq_suite):
    return rabbitmq_suite


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_send_many_on_rabbitmq(suite, rabbit, queue):
    @dramatiq.actor(queue_name=queue, unique_args=["key"], unique_window=60_000)
    def job(key):
        pass

    messages = send_many(job, [(1,), (2,), (1,)])
    assert messages[0].message_id == messages[2].message_id and len({m.message_id for m in messages}) == 2
    assert {job_of(m).broker_ref for m in messages} == {m.message_id for m in messages}  # RabbitMQ took them
    worker = start_worker(rabbit)
    try:
        wait_until(lambda: JobModel.select().where(JobModel.status == "succeeded").count() == 2, timeout=10)
    finally:
        worker.stop()

"""The suite on Dramatiq's RabbitmqBroker: job records, uniqueness, retries, the outbox, the re-drive.

RabbitMQ cannot be asked whether it holds one given message, so the
re-drive's lost-message check works differently there (dramatiq_unique.broker.presence):

* a job whose publish RabbitMQ took (``broker_ref`` set after the
  publish) is trusted to RabbitMQ's durable queues while it waits;
* a running job whose lease ran out ``lost_after`` ago, in two passes,
  counts as lost: RabbitMQ gives a dead consumer's messages back by
  itself, so a lease that stays expired means a hung worker or a lost
  message, and the job is sent again (its stale attempt is fenced out);
* a job claimed for sending whose publish never happened (no
  ``broker_ref``) is found and sent again, as on Redis.

Each test uses its own queue and deletes it afterwards.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import urlparse

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.common import dq_name, xq_name

import dramatiq_unique
from dramatiq_unique import JobModel, current_job, transaction
from dramatiq_unique.storage.models import utcnow
from tests.conftest import RABBITMQ_URL, REDIS_URL
from tests.durable import passes, total
from tests.helpers import LOST_AFTER, job_of, wait_until
from tests.integration.broker.helpers import start_worker
from tests.proxy import Proxy


@pytest.fixture
def suite(rabbitmq_suite):
    """The suite on the RabbitMQ broker, in place of the Redis one of tests/conftest.py."""
    return rabbitmq_suite


def ready(broker, queue, n: int) -> bool:
    """Whether RabbitMQ counts ``n`` messages ready in ``queue`` (its count lags a publish a little)."""
    try:
        wait_until(lambda: broker.get_queue_message_counts(queue)[0] == n, timeout=3)
    except AssertionError:
        return False
    return True


def test_a_tracked_job_is_recorded_and_retried(suite, rabbit, queue):
    @dramatiq.actor(queue_name=queue, track=True, min_backoff=20, max_backoff=40)
    def flaky(n):
        if current_job().attempts == 1:
            raise ConnectionError("once")
        return n * 2

    message = flaky.send(21)
    job = job_of(message)
    assert job.status == "queued" and job.broker_ref == message.message_id  # RabbitMQ took it
    worker = start_worker(rabbit)
    try:
        wait_until(lambda: job_of(message).status == "succeeded", timeout=15)
    finally:
        worker.stop()
    job = job_of(message)
    assert (job.attempts, job.result, job.queue_name) == (2, 42, queue)


def test_unique_sends_are_one_job(suite, rabbit, queue):
    @dramatiq.actor(queue_name=queue, unique_args=["n"], unique_lock="until_executed")
    def report(n):
        pass

    messages = [report.send(1) for _ in range(3)]
    assert len({m.message_id for m in messages}) == 1
    assert ready(rabbit, queue, 1)


def test_a_waiting_job_is_trusted_to_rabbitmq(suite, rabbit, queue):
    """RabbitMQ's durable queue holds the message: the re-drive never sends it again."""
    runs = []

    @dramatiq.actor(queue_name=queue, track=True)
    def report(n):
        runs.append(n)

    message = report.send(1)
    delayed = report.send_with_options(args=(2,), delay=50)
    time.sleep(0.05 + LOST_AFTER / 1000 + 0.1)
    counts = passes(3)
    assert total(counts, "missing") == total(counts, "redriven") == 0
    assert job_of(message).revision == job_of(delayed).revision == 0
    worker = start_worker(rabbit)
    try:
        wait_until(lambda: job_of(message).status == job_of(delayed).status == "succeeded", timeout=15)
    finally:
        worker.stop()
    assert sorted(runs) == [1, 2]


def test_a_running_job_whose_lease_ran_out_is_sent_again_and_its_stale_attempt_fenced(suite, rabbit, queue):
    """Given an attempt that hangs past its lease (RabbitMQ still holds its message,
    unacked), two passes later the job is sent again; the new attempt's outcome stands."""
    release = threading.Event()
    attempts = []

    @dramatiq.actor(queue_name=queue, track=True, unique_ttl=200)
    def hangs():
        attempt = current_job().attempts
        attempts.append(attempt)
        if attempt == 1:
            release.wait(10)
            return "stale"
        return "fresh"

    message = hangs.send()
    worker = start_worker(rabbit)
    try:
        wait_until(lambda: attempts == [1], timeout=10)
        time.sleep(0.2 + LOST_AFTER / 1000 + 0.05)
        counts = passes(2)
        assert (total(counts, "missing"), total(counts, "lost"), total(counts, "redriven")) == (1, 1, 1)
        wait_until(lambda: job_of(message).status == "succeeded", timeout=10)
        release.set()
        time.sleep(0.3)
    finally:
        release.set()
        worker.stop()
    job = job_of(message)
    assert attempts == [1, 2] and (job.result, job.attempts, job.revision) == ("fresh", 2, 1)
    assert "attempt 1 lost" not in (job.last_error or "")  # success clears it


def test_a_claim_whose_publish_never_happened_is_found_and_sent(suite, rabbit, queue):
    """Given a row claimed for sending (queued) whose process died before the publish,
    the re-drive finds it by its missing broker_ref and sends it."""

    @dramatiq.actor(queue_name=queue, track=True)
    def report(n):
        return n

    message = report.send(5)
    rabbit.flush(queue)  # the publish "never happened"
    JobModel.update(broker_ref=None).where(JobModel.id == job_of(message).id).execute()
    time.sleep(LOST_AFTER / 1000 + 0.05)
    counts = passes(2)
    assert total(counts, "redriven") == 1
    assert job_of(message).broker_ref == message.message_id
    worker = start_worker(rabbit)
    try:
        wait_until(lambda: job_of(message).status == "succeeded", timeout=15)
    finally:
        worker.stop()


def test_the_outbox_publishes_to_rabbitmq_after_commit_only(suite, rabbit, queue):
    @dramatiq.actor(queue_name=queue, track=True)
    def report(n):
        pass

    with transaction():
        kept = report.send(1)
        assert ready(rabbit, queue, 0)
    with pytest.raises(RuntimeError):
        with transaction():
            report.send(2)
            raise RuntimeError("rolled back")
    assert ready(rabbit, queue, 1)
    assert job_of(kept).status == "queued" and JobModel.select().count() == 1


def test_due_pending_jobs_are_sent_to_rabbitmq(suite, rabbit, queue):
    @dramatiq.actor(queue_name=queue, track=True)
    def report(n):
        pass

    with transaction():
        message = report.send(1)
        JobModel.update(process_after=utcnow()).execute()
    rabbit.flush(queue)
    JobModel.update(status="pending", enqueued_at=None, broker_ref=None).execute()  # as after an outage at commit
    assert dramatiq_unique.redrive().sent == 1
    assert ready(rabbit, queue, 1) and job_of(message).status == "queued"


class _Skips(dramatiq.Middleware):
    """Counts the messages a worker skipped (the suite's refused copies among them)."""

    def __init__(self) -> None:
        self.count = 0

    def after_skip_message(self, broker, message):
        self.count += 1


def test_a_connection_cut_while_jobs_run_gives_their_copies_back_and_each_job_runs_once(database_url, key_prefix,
                                                                                         queue):
    """Given a unique, a tracked and a slot-limited job running, When the worker's connection to RabbitMQ is cut
    (a proxy drops it; the shared server stays up), Then RabbitMQ gives their unacked messages back, Dramatiq's
    consumer reconnects and receives the copies while the first attempts still run, the suite drops each copy,
    and each job runs once and succeeds."""
    proxy = Proxy(urlparse(RABBITMQ_URL).port or 5672)
    url = urlparse(RABBITMQ_URL)
    broker = RabbitmqBroker(url=url._replace(netloc=f"{url.username}:{url.password}@127.0.0.1:{proxy.port}").geturl())
    skips = _Skips()
    broker.add_middleware(skips)
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix,
                                  redriver=False, lost_after=LOST_AFTER)
    release, lock, runs = threading.Event(), threading.Lock(), []

    def run(label: str) -> None:
        with lock:
            runs.append(label)
        release.wait(20)

    @dramatiq.actor(queue_name=queue, unique_args=["key"], unique_lock="until_and_while_executing", max_retries=0)
    def unique(key):
        run("unique")

    @dramatiq.actor(queue_name=queue, track=True, max_retries=0)
    def tracked():
        run("tracked")

    @dramatiq.actor(queue_name=queue, concurrency_limit=1, max_retries=0)
    def limited():
        run("limited")

    messages = [unique.send("k"), tracked.send(), limited.send()]
    worker = start_worker(broker, threads=4)
    try:
        wait_until(lambda: len(runs) == 3, timeout=10, what="the three jobs to start")
        proxy.down()
        proxy.up()
        wait_until(lambda: skips.count == 3, timeout=20, what="the three copies to come back and be dropped")
        assert sorted(runs) == ["limited", "tracked", "unique"]
        release.set()
        wait_until(lambda: all(job_of(m).status == "succeeded" for m in messages), timeout=10, what="the outcomes")
    finally:
        release.set()
        worker.stop()
        suite.db.close()
        admin = RabbitmqBroker(url=RABBITMQ_URL)
        for name in (queue, dq_name(queue), xq_name(queue)):
            admin.channel.queue_delete(queue=name)
        admin.close()
        broker.close()
        proxy.close()
    assert sorted(runs) == ["limited", "tracked", "unique"]
    assert [job_of(m).attempts for m in messages] == [1, 1, 1]

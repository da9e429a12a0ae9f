"""The job record (dramatiq_unique.middleware.job_tracking), on real Redis with SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import dramatiq
import peewee as pw

import dramatiq_unique
from dramatiq_unique import JobModel, JobStatus, current_job
from dramatiq_unique.storage.models import MAX_ERROR_LENGTH, utcnow
from tests.helpers import queue_size, wait_until


def status_of(message) -> str:
    job = dramatiq_unique.get_job(message.message_id)
    return job.status if job else None


def finished(message) -> bool:
    return status_of(message) in ("succeeded", "failed")


def test_a_tracked_job_is_recorded_from_send_to_result(suite, broker, worker):
    seen = {}

    @dramatiq.actor(track=True)
    def add(x, y):
        job = current_job()
        seen.update(status=job.status, attempts=job.attempts, id=job.id)
        return {"sum": x + y}

    worker.pause()  # else it may start the job before the row is read
    message = add.send(1, y=2)
    job = dramatiq_unique.get_job(message.message_id)
    assert job.status == JobStatus.QUEUED == "queued"
    assert (job.actor_name, job.queue_name, job.args, job.kwargs) == ("add", "default", [1], {"y": 2})
    assert job.created_at <= utcnow() and job.attempts == 0
    worker.resume()

    wait_until(lambda: finished(message), timeout=10)
    job = dramatiq_unique.get_job(message.message_id)
    assert seen == {"status": "running", "attempts": 1, "id": job.id}
    assert job.status == "succeeded" and job.result == {"sum": 3}
    assert job.started_at <= job.finished_at and job.attempts == 1 and job.last_error is None
    assert dramatiq_unique.get_job(job.id).message_id == message.message_id
    assert dramatiq_unique.get_job(str(job.id)).message_id == message.message_id


def test_get_job_returns_none_for_an_unknown_job(suite):
    assert dramatiq_unique.get_job("no-such-message") is None
    assert dramatiq_unique.get_job(987654) is None


def test_retries_are_the_same_job_with_growing_due_times(suite, broker, worker):
    """Given an actor that fails twice, then its three attempts share one row,
    which counts them and records each next due time."""
    attempts, due = [], []

    @dramatiq.actor(track=True, max_retries=5, min_backoff=50, max_backoff=400)
    def flaky():
        job = current_job()
        attempts.append(job.attempts)
        due.append(job.process_after)
        if len(attempts) < 3:
            raise RuntimeError(f"attempt {len(attempts)} fails")
        return "ok"

    message = flaky.send()
    wait_until(lambda: status_of(message) == "succeeded", timeout=20)
    job = dramatiq_unique.get_job(message.message_id)
    assert attempts == [1, 2, 3] and job.attempts == 3
    assert due[0] < due[1] < due[2]
    assert JobModel.select().where(JobModel.actor_name == "flaky").count() == 1
    assert job.last_error is None and job.result == "ok"


def test_a_failed_attempt_waiting_for_its_retry_is_retrying(suite, broker, worker):
    @dramatiq.actor(track=True, max_retries=3, min_backoff=60_000, max_backoff=60_000)
    def flaky():
        raise ValueError("downstream said no")

    message = flaky.send()
    # Retries writes "retrying" as it re-sends, before the attempt's outcome (the error) is
    # recorded: wait for the settled row.
    wait_until(lambda: (j := dramatiq_unique.get_job(message.message_id)).status == "retrying" and j.last_error,
               timeout=10)
    job = dramatiq_unique.get_job(message.message_id)
    assert job.attempts == 1
    assert (job.process_after - utcnow()).total_seconds() > 20
    assert job.last_error.startswith("ValueError: downstream said no")
    assert "Traceback" in job.last_error


def test_exhausted_retries_mark_the_job_failed_with_the_error(suite, broker, worker):
    @dramatiq.actor(track=True, max_retries=1, min_backoff=10, max_backoff=10)
    def broken():
        raise KeyError("x" * (MAX_ERROR_LENGTH * 2))

    message = broken.send()
    wait_until(lambda: finished(message), timeout=10)
    job = dramatiq_unique.get_job(message.message_id)
    assert job.status == "failed" and job.attempts == 2
    assert job.last_error.startswith("KeyError:") and len(job.last_error) <= MAX_ERROR_LENGTH
    assert job.finished_at is not None


def test_a_throws_exception_fails_at_once(suite, broker, worker):
    @dramatiq.actor(track=True, throws=(LookupError,))
    def lookup():
        raise LookupError("no such customer")

    message = lookup.send()
    wait_until(lambda: finished(message), timeout=10)
    job = dramatiq_unique.get_job(message.message_id)
    assert (job.status, job.attempts) == ("failed", 1)
    assert "no such customer" in job.last_error


def test_a_result_that_is_not_json_is_not_stored(suite, broker, worker):
    @dramatiq.actor(track=True)
    def opaque():
        return object()

    message = opaque.send()
    wait_until(lambda: finished(message), timeout=10)
    job = dramatiq_unique.get_job(message.message_id)
    assert job.status == "succeeded" and job.result is None


def test_a_delayed_job_records_when_it_is_due_and_runs_then(suite, broker, worker):
    @dramatiq.actor(track=True)
    def later():
        return current_job().attempts

    message = later.send_with_options(delay=300)
    job = dramatiq_unique.get_job(message.message_id)
    assert job.status == "queued"
    assert 0.1 < (job.process_after - job.created_at).total_seconds() <= 0.35
    wait_until(lambda: finished(message), timeout=10)
    job = dramatiq_unique.get_job(message.message_id)
    assert job.status == "succeeded" and job.started_at >= job.process_after and job.attempts == 1


def test_a_duplicate_delivery_of_a_finished_job_is_skipped(suite, broker, worker):
    calls = []

    @dramatiq.actor(track=True)
    def charge(amount):
        calls.append(amount)

    message = charge.send(10)
    wait_until(lambda: finished(message), timeout=10)
    broker.enqueue(message)  # the broker delivers the same message again
    wait_until(lambda: queue_size(broker) == 0, timeout=10)
    worker.join()
    assert calls == [10]
    assert dramatiq_unique.get_job(message.message_id).attempts == 1


def test_untracked_actors_pay_nothing(suite, broker, worker):
    """With the database unreachable, an actor without suite options still sends and runs."""
    done = threading.Event()

    @dramatiq.actor
    def plain():
        done.set()

    suite.db.close()
    suite.db.init("/nonexistent/dir/jobs.db")
    plain.send()
    assert done.wait(10)


class Export(JobModel):
    """An actor's own table, with a column filled from its argument of that name."""

    customer_id = pw.IntegerField(null=True, index=True)

    class Meta:
        table_name = "export_jobs"


def test_an_actor_can_keep_its_jobs_in_its_own_table(suite, broker, worker):
    @dramatiq.actor(job_model=Export, unique_args=["customer_id"])
    def export(customer_id, fmt="csv"):
        return fmt

    message = export.send(42, fmt="xlsx")
    job = dramatiq_unique.get_job(message.message_id)
    assert isinstance(job, Export) and job.customer_id == 42
    assert Export.select().where(Export.customer_id == 42).count() == 1
    assert JobModel.select().where(JobModel.actor_name == "export").count() == 0
    wait_until(lambda: finished(message), timeout=10)
    assert dramatiq_unique.get_job(job.id, model=Export).result == "xlsx"
    assert export.send(42).message_id != message.message_id  # finished: the key is free


def test_current_job_is_the_whole_row_with_the_attempts_own_columns(suite, broker, worker):
    """Given an actor with its own table, When it reads current_job(), Then every column is there,
    and the attempt's columns (status, attempts, fencing token) are the running attempt's."""
    seen = {}

    @dramatiq.actor(job_model=Export, track=True)
    def export(customer_id, fmt="csv"):
        job = current_job()
        seen.update(
            args=job.args, kwargs=job.kwargs, customer_id=job.customer_id, queue=job.queue_name,
            status=job.status, attempts=job.attempts, token=job.fencing_token, enqueued=job.enqueued_at,
        )
        assert current_job() is job  # read once per attempt

    message = export.send(7, fmt="xlsx")
    wait_until(lambda: finished(message), timeout=10)
    row = dramatiq_unique.get_job(message.message_id)
    assert seen == dict(
        args=[7], kwargs={"fmt": "xlsx"}, customer_id=7, queue="default",
        status="running", attempts=1, token=row.fencing_token, enqueued=row.enqueued_at,
    )


def test_a_message_sent_before_setup_gets_a_row_when_it_runs(broker, database_url, key_prefix):
    """Given a message enqueued before the suite was set up, it is tracked from its first attempt."""

    def body():
        return "adopted"

    bare = dramatiq.Actor(body, broker=broker, actor_name="adoptee", queue_name="default", priority=0, options={})
    message = bare.send()
    del broker.actors["adoptee"]
    suite = dramatiq_unique.setup(broker, database=database_url, redis=broker.client, key_prefix=key_prefix)
    dramatiq.actor(body, actor_name="adoptee", track=True)
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
    worker.start()
    try:
        wait_until(lambda: finished(message), timeout=10)
    finally:
        worker.stop()
        suite.db.close()
    assert dramatiq_unique.get_job(message.message_id).result == "adopted"

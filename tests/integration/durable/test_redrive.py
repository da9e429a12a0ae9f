"""The re-drive (dramatiq_unique.redrive): due jobs, lost messages, pruning, one pass at a time.

Real Redis broker, SQLite and PostgreSQL.  "Redis lost the message" is
simulated by deleting this test's own broker keys, never anyone else's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import dramatiq
import peewee as pw
import pytest
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import JobModel, current_job
from dramatiq_unique.durable.redrive import run_pass
from dramatiq_unique.storage.models import utcnow
from tests.conftest import REDIS_URL
from tests.durable import broker_messages, passes, running_worker, total, wipe_broker
from tests.helpers import LOST_AFTER, job_of, wait_until

ROOT = Path(__file__).parents[3]


def overdue() -> None:
    time.sleep(LOST_AFTER / 1000 + 0.05)


def test_a_job_whose_message_redis_lost_is_sent_again_and_runs_once(fast, broker):
    """Given a queued job whose message was wiped from Redis, when two passes miss it,
    then the second sends it again, and a worker runs it once."""
    runs = []

    @dramatiq.actor(track=True)
    def report(n):
        runs.append(n)
        return current_job().attempts

    message = report.send(7)
    assert wipe_broker(broker) > 0
    overdue()
    first, second = passes(2)
    assert (first.missing, first.lost, first.sent) == (1, 0, 0)
    assert (second.lost, second.redriven) == (1, 1)
    job = job_of(message)
    assert job.status == "queued" and job.revision == 1 and job.broker_ref
    assert [m["message_id"] for m in broker_messages(broker)] == [message.message_id]

    with running_worker(broker):
        wait_until(lambda: job_of(message).status == "succeeded", timeout=10)
    assert runs == [7] and job_of(message).result == 1  # it had never started: this is attempt 1
    assert total(passes(2), "lost") == 0  # a finished job is left alone


def test_with_on_lost_fail_a_lost_job_is_marked_failed_and_frees_its_key(fast, broker):
    fast.settings.on_lost = "fail"

    @dramatiq.actor(unique_args=["n"], unique_lock="until_executed")
    def report(n):
        pass

    message = report.send(1)
    assert report.send(1).message_id == message.message_id  # the key is held
    wipe_broker(broker)
    overdue()
    counts = passes(2)
    assert (total(counts, "lost"), total(counts, "failed"), total(counts, "redriven")) == (1, 1, 0)
    job = job_of(message)
    assert job.status == "failed" and "lost while waiting" in job.last_error and job.finished_at
    assert report.send(1).message_id != message.message_id  # a person looks at the failed one; new sends go on


def test_a_message_present_in_the_broker_is_never_redriven(fast, broker):
    @dramatiq.actor(track=True)
    def report():
        pass

    message = report.send()
    overdue()
    counts = passes(3)
    assert total(counts, "missing") == 0 and total(counts, "redriven") == 0
    job = job_of(message)
    assert job.checked_at is not None and job.revision == 0
    assert len(broker_messages(broker)) == 1


def test_a_queued_delayed_job_is_never_redriven_early(fast, broker):
    """Given a job delayed by 3 s whose message is gone, passes before it is due
    plus lost_after do nothing; after that it is found and sent.  (The margin is
    wide because the early passes must all end before the job is due, on a
    loaded machine too.)"""

    @dramatiq.actor(track=True)
    def later():
        pass

    message = later.send_with_options(delay=3000)
    present = passes(2)
    wipe_broker(broker)
    early = passes(3)
    assert utcnow() < job_of(message).process_after, "the early passes took too long to prove anything"
    assert all(c.missing == c.lost == c.sent == 0 for c in present + early), [dict(c) for c in present + early]
    assert job_of(message).revision == 0
    deadline = job_of(message).process_after + timedelta(milliseconds=LOST_AFTER)
    time.sleep(max(0.0, (deadline - utcnow()).total_seconds()) + 0.05)
    assert total(passes(2), "redriven") == 1


def test_a_delayed_job_in_the_delay_queue_is_present_after_it_is_due(fast, broker):
    @dramatiq.actor(track=True)
    def later():
        pass

    message = later.send_with_options(delay=50)
    time.sleep(0.05 + LOST_AFTER / 1000 + 0.05)
    counts = passes(2)  # due, overdue, no worker: still in the delay queue
    assert total(counts, "missing") == 0 and job_of(message).checked_at is not None


def test_a_lost_running_job_is_redriven_and_the_stale_attempt_cannot_record(fast, broker):
    """Given a job running past its lease whose message Redis lost, when the re-drive
    sends it again, then the new attempt runs, and the first one's outcome is fenced out."""
    release = threading.Event()
    attempts = []

    @dramatiq.actor(track=True, unique_ttl=200, max_retries=3)
    def slow():
        attempt = current_job().attempts
        attempts.append(attempt)
        if attempt == 1:
            release.wait(10)
        return attempt

    message = slow.send()
    with running_worker(broker, threads=2):
        wait_until(lambda: attempts == [1], timeout=10)
        wipe_broker(broker)  # its message and the worker's unacked set
        time.sleep(0.2 + LOST_AFTER / 1000 + 0.05)
        counts = passes(2)
        assert total(counts, "redriven") == 1
        wait_until(lambda: job_of(message).status == "succeeded", timeout=10)
        release.set()
        time.sleep(0.2)
    job = job_of(message)
    assert attempts == [1, 2] and job.attempts == 2 and job.result == 2 and job.revision == 1


def test_a_lost_running_job_out_of_retries_is_marked_failed(fast, broker):
    release = threading.Event()
    started = []

    @dramatiq.actor(track=True, unique_ttl=200, max_retries=0)
    def slow():
        started.append(1)
        release.wait(10)

    message = slow.send()
    with running_worker(broker):
        wait_until(lambda: started, timeout=10)
        wipe_broker(broker)
        time.sleep(0.2 + LOST_AFTER / 1000 + 0.05)
        counts = passes(2)
        assert (total(counts, "lost"), total(counts, "failed"), total(counts, "redriven")) == (1, 1, 0)
        job = job_of(message)
        assert job.status == "failed" and "retries are exhausted" in job.last_error
        # The attempt was alive after all: no newer attempt exists, so its outcome is the truth.
        release.set()
        wait_until(lambda: job_of(message).status == "succeeded", timeout=10)
    assert started == [1]


def test_a_running_job_whose_message_a_live_worker_holds_is_left_alone(fast, broker):
    release = threading.Event()
    started = []

    @dramatiq.actor(track=True, unique_ttl=100)
    def stuck():
        started.append(1)
        release.wait(10)

    message = stuck.send()
    with running_worker(broker):
        wait_until(lambda: started, timeout=10)
        time.sleep(0.1 + LOST_AFTER / 1000 + 0.05)
        counts = passes(2)
        release.set()
        wait_until(lambda: job_of(message).status == "succeeded", timeout=10)
    assert total(counts, "missing") == total(counts, "requeued") == 0 and started == [1]


def test_a_message_held_by_a_dead_consumer_is_handed_back_to_its_queue(fast, broker):
    """Given a consumer that fetched a message and died (no heartbeat), the pass runs
    Dramatiq's own maintenance for that queue, and a live worker then runs the job."""

    @dramatiq.actor(track=True)
    def report():
        return "done"

    message = report.send()
    dead = RedisBroker(url=REDIS_URL, namespace=broker.namespace)  # another process, in effect
    consumer = dead.consume("default", prefetch=1, timeout=100)
    wait_until(lambda: next(consumer), timeout=5)  # fetched: now in its unacked set
    broker.client.zadd(f"{broker.namespace}:__heartbeats__", {dead.broker_id: 0})  # it died long ago
    dead.close()
    overdue()
    counts = passes(1)
    assert counts[0].requeued == 1 and counts[0].missing == 0
    assert broker.client.llen(f"{broker.namespace}:default") == 1
    with running_worker(broker):
        wait_until(lambda: job_of(message).status == "succeeded", timeout=10)


def test_a_dead_lettered_message_marks_its_job_failed(fast, broker):
    @dramatiq.actor(track=True)
    def report():
        pass

    message = report.send()
    # A job whose outcome was never written (say the database was down) but
    # whose message the broker dead-lettered: the broker's word is final.
    consumer = broker.consume("default", prefetch=1, timeout=100)
    proxy = wait_until(lambda: next(consumer), timeout=5)
    consumer.nack(proxy)
    overdue()
    assert passes(1)[0].failed == 1
    assert "dead-lettered" in job_of(message).last_error


def test_due_pending_and_unsent_retrying_jobs_are_sent_in_pages(fast, broker):
    fast.settings.redrive_page_size = 3

    @dramatiq.actor(track=True)
    def report(n):
        pass

    messages = [report.send(n) for n in range(10)]
    wipe_broker(broker)
    ids = [job_of(m).id for m in messages]
    # As the outbox leaves them when the broker is down at commit, and as a
    # retry that could not be enqueued is left: not in the broker, due.
    JobModel.update(status="pending", enqueued_at=None).where(JobModel.id.in_(ids[:7])).execute()
    JobModel.update(status="retrying", enqueued_at=None, attempts=1).where(JobModel.id.in_(ids[7:])).execute()
    JobModel.update(parked_on="some-slot").where(JobModel.id == ids[0]).execute()  # waits for a slot: not sent
    counts = passes(1)[0]
    assert counts.sent == 9
    sent = broker_messages(broker)
    assert sorted(m["message_id"] for m in sent) == sorted(m.message_id for m in messages[1:])
    retried = [m for m in sent if m["args"][0] >= 7]
    assert all(m["options"]["retries"] == 1 for m in retried)  # Retries keeps counting
    assert job_of(messages[0]).status == "pending"
    assert all(job_of(m).status == "queued" and job_of(m).broker_ref for m in messages[1:])


def test_pending_jobs_are_sent_in_created_at_order(fast, broker):
    @dramatiq.actor(track=True)
    def step(n):
        pass

    messages = [step.send(n) for n in range(5)]
    wipe_broker(broker)
    ids = [job_of(m).id for m in messages]
    JobModel.update(status="pending", enqueued_at=None, process_after=utcnow()).where(JobModel.id.in_(ids)).execute()
    passes(1)
    queue = [broker.client.hget(f"{broker.namespace}:default.msgs", rid) for rid in
             broker.client.lrange(f"{broker.namespace}:default", 0, -1)]
    assert [dramatiq.Message.decode(q).args[0] for q in queue] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("contended", [False, True], ids=["lock-bypassed", "lock-contended"])
def test_two_redrivers_at_once_never_send_a_job_twice(fast, broker, contended):
    """Given 300 due jobs, when two passes run at the same instant (both bypassing the
    pass lock, or both asking for it), then every job is sent exactly once."""
    fast.settings.redrive_page_size = 25

    @dramatiq.actor(track=True)
    def report(n):
        pass

    messages = [report.send(n) for n in range(300)]
    wipe_broker(broker)
    JobModel.update(status="pending", enqueued_at=None).execute()
    barrier = threading.Barrier(2)
    results, errors = [], []

    def redriver() -> None:
        try:
            barrier.wait(10)
            for _ in range(3):
                results.append(dramatiq_unique.redrive() if contended else run_pass(fast, broker))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            fast.close()

    threads = [threading.Thread(target=redriver) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    sent = [m["message_id"] for m in broker_messages(broker)]
    assert len(sent) == len(set(sent)) == 300 == total(results, "sent")
    assert set(sent) == {m.message_id for m in messages}
    assert JobModel.select().where(JobModel.revision != 1).count() == 0


def test_only_one_pass_runs_at_a_time(fast, broker):
    """One pass at a time per app and set of declared actors (scope.py)."""
    from dramatiq_unique.durable.scope import Scope

    name = Scope(fast, broker).lock_name()
    assert name.startswith(fast.keys.redrive_lock() + ":")
    token, _ = fast.locks.acquire(name, 5_000)
    try:
        assert dramatiq_unique.redrive().ran is False
    finally:
        fast.locks.release(name, token)
    assert dramatiq_unique.redrive().ran is True


def test_a_duplicate_delivery_of_a_finished_job_is_skipped(fast, broker):
    """Given a job that succeeded, when its message is delivered again (a worker
    crashed after the job but before the ack), then it is not run again."""
    from dramatiq_unique.durable.messages import build_message

    runs = []

    @dramatiq.actor(track=True)
    def charge(amount):
        runs.append(amount)

    message = charge.send(10)
    with running_worker(broker):
        wait_until(lambda: job_of(message).status == "succeeded", timeout=10)
        broker.enqueue(build_message(job_of(message)))  # the same job, delivered again
        broker.join("default", timeout=10_000)
        time.sleep(0.1)
    job = job_of(message)
    assert runs == [10] and job.status == "succeeded" and job.attempts == 1


def test_finished_rows_are_pruned_after_the_retention(fast, broker):
    fast.settings.retention = fast.settings.idempotency_window = 60_000
    fast.settings.redrive_page_size = 2

    @dramatiq.actor(track=True)
    def report(n):
        pass

    messages = [report.send(n) for n in range(6)]
    wipe_broker(broker)
    old = utcnow() - timedelta(minutes=5)
    ids = [job_of(m).id for m in messages]
    JobModel.update(status="succeeded", finished_at=old).where(JobModel.id.in_(ids[:3])).execute()
    JobModel.update(status="failed", finished_at=old).where(JobModel.id == ids[3]).execute()
    JobModel.update(status="succeeded", finished_at=utcnow()).where(JobModel.id == ids[4]).execute()
    JobModel.update(status="pending", enqueued_at=None, process_after=utcnow() + timedelta(hours=1)).where(
        JobModel.id == ids[5]
    ).execute()
    assert passes(1)[0].pruned == 4
    assert [row.id for row in JobModel.select().order_by(JobModel.id)] == ids[4:]


class Invoice(JobModel):
    """An actor's own job table: the re-drive covers every table of the suite."""

    customer_id = pw.IntegerField(null=True)

    class Meta:
        table_name = "invoice_jobs"


def test_jobs_in_an_actors_own_table_are_recovered_too(fast, broker):
    @dramatiq.actor(job_model=Invoice, unique_args=["customer_id"], unique_lock="until_executed")
    def invoice(customer_id):
        return customer_id

    message = invoice.send(42)
    wipe_broker(broker)
    overdue()
    assert total(passes(2), "redriven") == 1
    with running_worker(broker):
        wait_until(lambda: dramatiq_unique.get_job(message.message_id).status == "succeeded", timeout=10)
    row = Invoice.get(Invoice.message_id == message.message_id)
    assert (row.customer_id, row.result, row.revision) == (42, 42, 1)
    assert JobModel.select().count() == 0


def test_redrive_can_be_given_the_broker(fast, broker):
    @dramatiq.actor(track=True)
    def report():
        pass

    message = report.send()
    wipe_broker(broker)
    JobModel.update(status="pending", enqueued_at=None).execute()
    counts = dramatiq_unique.redrive(broker)
    assert counts.sent == counts["sent"] == counts.as_dict()["sent"] == dict(counts)["sent"] == 1
    assert broker_messages(broker)[0]["message_id"] == message.message_id


def worker_env(database_url: str, key_prefix: str) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DU_REDIS_URL": REDIS_URL,
        "DU_NAMESPACE": f"{key_prefix}-broker",
        "DU_DATABASE_URL": database_url,
        "DU_KEY_PREFIX": key_prefix,
        "DU_REDRIVER": "1",
        "DU_REDRIVE_INTERVAL": "200",
        "DU_LOST_AFTER": "300",
        "DU_UNIQUE_TTL": "1000",
        # Idle consumers poll at least every second; 3 s without a heartbeat is a dead worker.
        "DU_HEARTBEAT_TIMEOUT": "3000",
    }


def start_dramatiq(env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dramatiq", "tests.redrive_app", "--processes", "1", "--threads", "2"],
        cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)


@pytest.mark.slow
@pytest.mark.parametrize("wiped", [False, True], ids=["message-orphaned", "redis-wiped"])
def test_the_job_of_a_sigkilled_dramatiq_worker_is_recovered(fast, broker, database_url, key_prefix, wiped):
    """Given a real `dramatiq` worker process SIGKILLed in the middle of a job (and,
    in one case, Redis wiped as well), a second worker process's re-drive recovers the
    job: Dramatiq's own maintenance is run for the dead worker's unacked message, or
    the lost message is found missing twice and sent again.  The job succeeds once more."""

    @dramatiq.actor(actor_name="slow_job", track=True)
    def slow_job(seconds):  # the workers run tests.redrive_app's slow_job
        pass

    env = worker_env(database_url, key_prefix)
    message = slow_job.send(60)
    first = start_dramatiq(env)
    second = None
    try:
        wait_until(lambda: job_of(message).status == "running", timeout=30, interval=0.1)
        kill_group(first)
        if wiped:
            wipe_broker(broker)
        second = start_dramatiq(env)
        wait_until(lambda: job_of(message).status == "succeeded", timeout=60, interval=0.1)
    finally:
        kill_group(first)
        if second is not None:
            kill_group(second, signal.SIGTERM)
    job = job_of(message)
    assert (job.attempts, job.result) == (2, 2)
    assert job.revision == (1 if wiped else 0)  # re-sent by the re-drive, or handed back by maintenance


def test_the_pass_queries_use_indexes_on_postgresql(broker, pg_url, key_prefix):
    """Given 50,000 finished rows beside a few waiting ones, every SELECT a pass runs on the
    job table starts from an index that leaves finished rows out: no sequential scan."""
    from tests.durable import bulk_insert_pg, pass_selects

    suite = dramatiq_unique.setup(broker, database=pg_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    try:
        for name in ("report", "other"):
            dramatiq.actor(lambda: None, actor_name=name, track=True)
        bulk_insert_pg(JobModel, 50_000, status="succeeded", prefix="done")
        for status in ("pending", "queued", "retrying", "running"):
            bulk_insert_pg(JobModel, 20, status=status, prefix=status)
        table = JobModel._meta.table_name
        suite.db.execute_sql(f'UPDATE "{table}" SET app = %s', (suite.app,))  # this app's rows, in the pass's scope
        suite.db.execute_sql(f'ANALYZE "{table}"')
        selects = pass_selects(suite, broker, JobModel)
        # The due sends (pending, retrying), the lost checks (running, queued, retrying), the pruning.
        assert len(selects) >= 6, selects
        for sql, params in selects:
            plan = "\n".join(row[0] for row in suite.db.execute_sql("EXPLAIN " + sql, params).fetchall())
            assert "Seq Scan" not in plan, f"{sql}:\n{plan}"
            assert "Index" in plan, f"{sql}:\n{plan}"
    finally:
        suite.db.close()

"""The re-drive on a timer (dramatiq_unique.durable.redrive), in workers (Redriver) and as its own process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dramatiq
import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import InvalidOption, JobModel, Redriver, start_redriver
from tests.conftest import REDIS_URL
from tests.durable import broker_messages, running_worker, wipe_broker
from tests.helpers import job_of, wait_until

ROOT = Path(__file__).parents[3]


def make_pending(messages, broker) -> None:
    """As the outbox leaves jobs when the broker is down at commit: rows pending, nothing in the broker."""
    wipe_broker(broker)
    ids = [job_of(m).id for m in messages]
    JobModel.update(status="pending", enqueued_at=None).where(JobModel.id.in_(ids)).execute()


def test_start_redriver_runs_passes_on_an_interval(suite, broker):
    @dramatiq.actor(track=True)
    def report(n):
        pass

    scheduler = start_redriver(interval=100)
    try:
        first = report.send(1)
        make_pending([first], broker)
        wait_until(lambda: job_of(first).status == "queued", timeout=5)
        second = report.send(2)
        make_pending([second], broker)  # a later pass picks it up too
        wait_until(lambda: job_of(second).status == "queued", timeout=5)
        assert [m["message_id"] for m in broker_messages(broker)] == [second.message_id]
    finally:
        scheduler.shutdown(wait=True)
    assert not scheduler.running


def test_start_redriver_can_use_the_applications_scheduler(suite):
    scheduler = BackgroundScheduler()
    assert start_redriver(interval=250, scheduler=scheduler) is scheduler
    assert not scheduler.running  # the application starts and stops its own
    (job,) = scheduler.get_jobs()
    assert job.trigger.interval.total_seconds() == 0.25 and job.max_instances == 1


@pytest.mark.parametrize("interval", [0, -5, "5s", True])
def test_a_bad_interval_is_refused(suite, interval):
    with pytest.raises(InvalidOption):
        start_redriver(interval=interval)


def test_workers_run_the_redriver_from_boot_to_shutdown(database_url, key_prefix):
    broker = RedisBroker(url=REDIS_URL, namespace=f"{key_prefix}-workers")
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(
        broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix, redrive_interval=100
    )
    try:

        @dramatiq.actor(track=True)
        def report(n):
            return n

        message = report.send(1)
        make_pending([message], broker)
        (redriver,) = [m for m in broker.middleware if isinstance(m, Redriver)]
        assert redriver.scheduler is None
        with running_worker(broker):
            assert redriver.scheduler is not None and redriver.scheduler.running
            wait_until(lambda: job_of(message).status == "succeeded", timeout=10)
        assert redriver.scheduler is None
    finally:
        broker.flush_all()
        broker.close()
        suite.db.close()


def test_redriver_false_keeps_workers_from_running_it(suite, broker):
    (redriver,) = [m for m in broker.middleware if isinstance(m, Redriver)]
    with running_worker(broker):
        assert redriver.scheduler is None


def test_two_processes_scheduling_passes_send_each_job_once(suite, broker):
    """Two schedulers (as two worker processes would run) share the pass lock."""
    suite.settings.redrive_page_size = 20

    @dramatiq.actor(track=True)
    def report(n):
        pass

    messages = [report.send(n) for n in range(200)]
    make_pending(messages, broker)
    schedulers = [start_redriver(interval=50) for _ in range(2)]
    try:
        wait_until(lambda: JobModel.select().where(JobModel.status == "pending").count() == 0, timeout=20)
        time.sleep(0.2)
    finally:
        for scheduler in schedulers:
            scheduler.shutdown(wait=True)
    sent = [m["message_id"] for m in broker_messages(broker)]
    assert len(sent) == len(set(sent)) == 200


def cli_env(database_url: str, key_prefix: str, **extra: str) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DU_REDIS_URL": REDIS_URL,
        "DU_NAMESPACE": f"{key_prefix}-broker",
        "DU_DATABASE_URL": database_url,
        "DU_KEY_PREFIX": key_prefix,
        "DU_REDRIVER": "0",
        **extra,
    }


def test_the_command_line_runs_one_pass(suite, broker, database_url, key_prefix):
    @dramatiq.actor(track=True, actor_name="quick_job")
    def quick_job(n):
        pass

    messages = [quick_job.send(n) for n in range(3)]
    make_pending(messages, broker)
    done = subprocess.run(
        [sys.executable, "-m", "dramatiq_unique", "redrive", "tests.redrive_app", "--once", "--json"],
        cwd=ROOT, env=cli_env(database_url, key_prefix), capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    assert counts["ran"] is True and counts["sent"] == 3
    assert all(job_of(m).status == "queued" for m in messages)


def test_the_command_line_runs_until_terminated(suite, broker, database_url, key_prefix):
    @dramatiq.actor(track=True, actor_name="quick_job")
    def quick_job(n):
        pass

    proc = subprocess.Popen(
        [sys.executable, "-m", "dramatiq_unique", "redrive", "tests.redrive_app", "--interval", "100"],
        cwd=ROOT, env=cli_env(database_url, key_prefix), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        message = quick_job.send(1)
        make_pending([message], broker)
        wait_until(lambda: job_of(message).status == "queued", timeout=20)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
    assert proc.returncode == 0, output


def test_the_command_line_says_when_the_app_did_not_set_up_the_suite(tmp_path):
    (tmp_path / "bare_app.py").write_text("import dramatiq\n")
    done = subprocess.run(
        [sys.executable, "-m", "dramatiq_unique", "redrive", "bare_app", "--once", "--path", str(tmp_path)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2 and "setup()" in done.stderr

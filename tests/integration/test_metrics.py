"""The suite's metrics and log lines beside Dramatiq's own Prometheus middleware, on real Redis
and PostgreSQL: each metric moves when its event happens, scraped through Dramatiq's exposition
handler; the log lines carry their fields; parked jobs are not counted as processed messages.

Each test has a multiprocess directory of its own (tests/prom.py); "process boot" is what
Dramatiq's CLI emits in each worker process, emitted here by hand.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Iterator

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import DuplicateJob, JobModel, LockLost, heartbeat
from dramatiq_unique import suite as _config
from dramatiq_unique.observe import metrics_on
from dramatiq_unique.unique import recent
from tests import prom
from tests.conftest import REDIS_URL
from tests.durable import passes, wipe_broker
from tests.helpers import LOST_AFTER, job_of, wait_until

pytest.importorskip("prometheus_client")

EVENTS = "dramatiq_unique.events"


@pytest.fixture
def database_url(pg_url: str) -> str:
    """PostgreSQL, the production store (tests/unit covers the hooks without one)."""
    return pg_url


@pytest.fixture
def prometheus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from prom.isolated(tmp_path, monkeypatch)


def boot(broker: dramatiq.Broker, *, first: bool = False):
    """Add Dramatiq's Prometheus middleware (first on the broker, or last as add_middleware puts
    it) and emit the process boot, as Dramatiq's CLI does in each worker process."""
    from dramatiq.middleware.prometheus import Prometheus

    middleware = Prometheus()
    broker.add_middleware(middleware, **({"before": type(broker.middleware[0])} if first else {}))
    broker.emit_after("process_boot")
    return middleware


def events_at(caplog, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == EVENTS and r.levelno == level]


def test_duplicates_are_counted_by_decision_and_each_logged_with_both_job_ids(suite, broker, prometheus, caplog):
    """Given a waiting job, then a skip answered early, a skip decided by the insert, a raise and a
    replace are each one INFO line naming the new send's id and the existing job's, and counted."""
    boot(broker)
    caplog.set_level(logging.INFO, logger=EVENTS)

    @dramatiq.actor(unique_args=["n"], unique_lock="until_executed")
    def dedupe(n):
        pass

    first = dedupe.send(1)
    assert dedupe.send(1).message_id == first.message_id  # this process sent the key lately: answered early
    recent._recent.keys.clear()
    assert dedupe.send(1).message_id == first.message_id  # a key new to the process: the insert decides
    with pytest.raises(DuplicateJob):
        dedupe.send_with_options(args=(1,), unique_on_conflict="raise")
    dedupe.send_with_options(args=(1,), unique_on_conflict="replace")

    scraped = prom.scrape()
    counted = {d: scraped.value("dramatiq_unique_duplicates_total", actor_name="dedupe", decision=d)
               for d in ("skip", "raise", "replace")}
    assert counted == {"skip": 2, "raise": 1, "replace": 1}
    key = job_of(first).unique_key
    lines = events_at(caplog, logging.INFO)
    assert [r.decision for r in lines] == ["skip", "skip", "raise", "replace"]
    for record in lines:
        assert record.existing_job_id == first.message_id and record.job_id != first.message_id
        assert record.job_id in record.getMessage() and first.message_id in record.getMessage()
        assert (record.actor, record.unique_key) == ("dedupe", key)


@pytest.mark.parametrize("first", [False, True], ids=["prometheus-last", "prometheus-first"])
def test_parked_jobs_wait_and_are_handed_over_without_inflating_dramatiqs_counts(
    suite, broker, make_worker, prometheus, first
):
    """Given Dramatiq's Prometheus middleware and more jobs than slots (a slot of one, and an
    execution lock), then each job is one processed message with its real duration in Dramatiq's
    metrics, the in-progress gauge ends at 0, and the suite counts the waits, their durations,
    the hand-overs and the parked jobs."""
    boot(broker, first=first)

    @dramatiq.actor(concurrency_limit=1, concurrency_key=["tenant"])
    def slotted(tenant, n):
        time.sleep(0.15)

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing")
    def locked(key, n):
        time.sleep(0.15)

    sent = [slotted.send("t", n) for n in range(5)] + [locked.send("k", n) for n in range(3)]
    make_worker(8)
    parked = JobModel.select().where(JobModel.parked_on.is_null(False), JobModel.actor_name == "slotted")
    wait_until(lambda: parked.count() >= 3, timeout=10, what="slotted jobs parked")
    dramatiq_unique.redrive()  # counts the parked jobs for the gauge
    assert prom.scrape().value("dramatiq_unique_parked_jobs", actor_name="slotted", gate="slot") >= 1
    wait_until(lambda: all(job_of(m).status == "succeeded" for m in sent), timeout=15, what="all jobs done")
    dramatiq_unique.redrive()

    scraped = prom.scrape()
    for actor, jobs, gate in (("slotted", 5, "slot"), ("locked", 3, "lock")):
        assert scraped.value("dramatiq_messages_total", actor_name=actor) == jobs, "parks are no messages"
        assert scraped.value("dramatiq_message_duration_milliseconds_count", actor_name=actor) == jobs
        assert scraped.value("dramatiq_message_duration_milliseconds_sum", actor_name=actor) >= jobs * 140
        assert scraped.value("dramatiq_messages_inprogress", actor_name=actor) == 0
        waits = scraped.value("dramatiq_unique_waits_total", actor_name=actor, gate=gate)
        assert waits >= jobs - 1
        assert jobs - 1 <= scraped.value("dramatiq_unique_wait_seconds_count", actor_name=actor, gate=gate) <= waits
        assert scraped.value("dramatiq_unique_wait_seconds_sum", actor_name=actor) > 0.14  # seconds
        assert scraped.value("dramatiq_unique_handover_seconds_count", actor_name=actor, gate=gate) >= jobs - 1
        # The last pass's count: 0, written for every actor that may park (another process's count must not stay).
        assert scraped.has("dramatiq_unique_parked_jobs", actor_name=actor, gate=gate)
        assert scraped.value("dramatiq_unique_parked_jobs", actor_name=actor) == 0


def test_heartbeats_a_fenced_out_attempt_and_lock_lost_are_counted_and_warned(
    suite, broker, make_worker, prometheus, caplog
):
    """Given a running job whose fencing token a newer attempt took, then its next heartbeat's
    lease write and its outcome are refused by the token, heartbeat() raises LockLost, and each is
    a WARNING with the job's id, actor and key, and a count."""
    boot(broker)
    started, bumped, lost = threading.Event(), threading.Event(), []

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", unique_ttl=2000, max_retries=0)
    def fenced(key):
        heartbeat()
        started.set()
        bumped.wait(5)
        time.sleep(0.25)  # past a tenth of the lease: the next heartbeat writes the row
        try:
            heartbeat()
        except LockLost:
            lost.append(True)

    message = fenced.send("k")
    make_worker(2)
    assert started.wait(10)
    JobModel.update(fencing_token=JobModel.fencing_token + 1000).where(
        JobModel.message_id == message.message_id).execute()
    bumped.set()
    wait_until(lambda: prom.scrape().value("dramatiq_unique_fenced_writes_refused_total", write="outcome") == 1,
               timeout=10, what="the outcome refused")
    assert lost == [True]
    scraped = prom.scrape()
    # Labelled by the job's queue, as Dramatiq's own metrics are (an attempt's row is read back partly).
    job = {"actor_name": "fenced", "queue_name": "default"}
    assert scraped.value("dramatiq_unique_heartbeats_total", **job) == 1
    assert scraped.value("dramatiq_unique_fenced_writes_refused_total", write="lease", **job) == 1
    assert scraped.value("dramatiq_unique_fenced_writes_refused_total", write="outcome", **job) == 1
    assert scraped.value("dramatiq_unique_lock_lost_total", **job) == 1
    warnings = events_at(caplog, logging.WARNING)
    assert ["lease write" in r.getMessage() for r in warnings].count(True) == 1
    assert ["lost its lease" in r.getMessage() for r in warnings].count(True) == 1
    assert ["outcome write" in r.getMessage() for r in warnings].count(True) == 1
    key = job_of(message).unique_key
    assert all((r.job_id, r.actor, r.unique_key) == (message.message_id, "fenced", key) for r in warnings)


def test_a_lost_job_is_warned_and_the_redrive_counts_are_exposed(fast, broker, prometheus, caplog):
    """Given a queued job whose message Redis lost, then two passes miss it, find it lost and send it
    again: the counts by outcome and the passes are exposed, and the lost job is one WARNING."""
    boot(broker)

    @dramatiq.actor(track=True)
    def report(n):
        pass

    message = report.send(7)
    assert wipe_broker(broker) > 0
    time.sleep(LOST_AFTER / 1000 + 0.05)
    with caplog.at_level(logging.WARNING, logger=EVENTS):
        passes(2)
    scraped = prom.scrape()
    outcomes = ("missing", "lost", "redriven")
    counted = {o: scraped.value("dramatiq_unique_redrive_jobs_total", outcome=o) for o in outcomes}
    assert counted == {"missing": 1, "lost": 1, "redriven": 1}
    assert scraped.value("dramatiq_unique_redrive_passes_total") == 2
    (record,) = events_at(caplog, logging.WARNING)
    assert "lost while waiting: sent again" in record.getMessage()
    assert (record.job_id, record.actor) == (message.message_id, "report")


def test_without_dramatiqs_prometheus_the_metrics_stay_off_and_the_lines_stay(suite, broker, prometheus, caplog):
    broker.emit_after("process_boot")
    assert not metrics_on()
    caplog.set_level(logging.INFO, logger=EVENTS)

    @dramatiq.actor(unique_args=["n"])
    def quiet(n):
        pass

    quiet.send(1)
    quiet.send(1)
    assert len(events_at(caplog, logging.INFO)) == 1
    assert not {n for n in prom.scrape().names() if n.startswith("dramatiq_unique")}


def test_two_suites_in_one_process_share_one_set_of_metrics(suite, broker, sqlite_url, key_prefix, prometheus):
    """Given two brokers, each set up with a suite and Dramatiq's middleware and booted, then the
    metrics are registered once and both suites' events land on the one endpoint."""
    boot(broker)

    @dramatiq.actor(unique_args=["n"], actor_name="first_suite_job")
    def one(n):
        pass

    other = RedisBroker(url=REDIS_URL, namespace=key_prefix + "-other")
    second = dramatiq_unique.setup(other, database=sqlite_url, redis=REDIS_URL, key_prefix=key_prefix + "o",
                                   redriver=False)
    try:
        boot(other)

        @dramatiq.actor(unique_args=["n"], actor_name="second_suite_job", broker=other)
        def two(n):
            pass

        for actor in (one, two, one, two):
            actor.send(1)
        scraped = prom.scrape()
        assert scraped.value("dramatiq_unique_duplicates_total", actor_name="first_suite_job") == 1
        assert scraped.value("dramatiq_unique_duplicates_total", actor_name="second_suite_job") == 1
    finally:
        other.flush_all()
        other.close()
        second.close()
        _config.set_current(suite)

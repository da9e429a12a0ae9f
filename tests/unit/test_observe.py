"""The observation hooks (dramatiq_unique.observe), without services: no-ops while metrics are off,
log lines with their fields, the metrics and their names, and parked deliveries kept out of
Dramatiq's own Prometheus counts."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest
from dramatiq.brokers.stub import StubBroker

from dramatiq_unique.logs import PARKED
from dramatiq_unique.middleware.metrics import quiet_parks
from dramatiq_unique.observe import enable_metrics, events, metrics_on
from tests import prom

#: Every metric, as docs/operations/metrics.md lists it (the exposition's names: counters end in _total).
NAMES = {
    "dramatiq_unique_duplicates_total", "dramatiq_unique_waits_total", "dramatiq_unique_wait_seconds",
    "dramatiq_unique_handover_seconds", "dramatiq_unique_parked_jobs", "dramatiq_unique_fenced_writes_refused_total",
    "dramatiq_unique_heartbeats_total", "dramatiq_unique_lock_lost_total", "dramatiq_unique_redrive_jobs_total",
    "dramatiq_unique_redrive_passes_total",
}


@pytest.fixture
def prometheus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from prom.isolated(tmp_path, monkeypatch)


def job(**more):
    fields = dict(message_id="m-1", actor_name="act", queue_name="default", unique_key="k" * 8, fencing_token=3)
    return SimpleNamespace(**{**fields, **more})


def every_hook() -> None:
    message = SimpleNamespace(message_id="m-2", actor_name="act", queue_name="default", options={})
    events.duplicate("skip", message, "m-1", "key")
    events.duplicate("raise", message, "m-1", "key")
    events.duplicate("replace", message, "m-1", "key", "why")
    events.parked("slot", message, "slot:act:0")
    events.taken_up("slot", message, {events.PARKED_AT: events.now_ms() - 250}, {events.HANDED_AT: events.now_ms()})
    events.parked_counts({("act", "slot"): 2})
    events.heartbeat(job())
    events.lock_lost(job(), RuntimeError("gone"))
    events.fenced_out(job(), "outcome")
    events.job_lost(job(), "waiting", "sent again")
    events.job_failed(job(), "lost")
    events.redrive_pass(SimpleNamespace(ran=True, as_dict=lambda: {"ran": True, "lost": 1, "redriven": 1}))


def test_with_metrics_off_every_hook_is_a_no_op_that_still_logs(caplog):
    assert events.sink is None and not metrics_on()
    with caplog.at_level(logging.DEBUG, logger="dramatiq_unique.events"):
        every_hook()
    levels = [r.levelname for r in caplog.records]
    assert levels.count("INFO") == 3 and levels.count("WARNING") == 4 and levels.count("DEBUG") == 1


def test_the_suite_imports_no_prometheus_client_until_metrics_are_turned_on():
    """Metrics cost nothing when off: prometheus_client is not even imported, by the suite nor by a hook."""
    code = ("import sys, dramatiq_unique; from tests.unit.test_observe import every_hook; every_hook(); "
            "assert 'prometheus_client' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2], timeout=60)


def test_a_duplicate_names_both_job_ids_with_its_fields_in_extra(caplog):
    message = SimpleNamespace(message_id="new-1", actor_name="report", queue_name="default", options={})
    with caplog.at_level(logging.INFO, logger="dramatiq_unique.events"):
        events.duplicate("skip", message, "old-1", "abc")
    (record,) = caplog.records
    assert "new-1" in record.getMessage() and "old-1" in record.getMessage()
    assert (record.job_id, record.actor, record.unique_key) == ("new-1", "report", "abc")
    assert (record.existing_job_id, record.decision) == ("old-1", "skip")


@pytest.mark.parametrize("option", events.CONTINUATIONS)
def test_a_skipped_duplicate_that_carried_a_continuation_is_a_warning(caplog, option):
    """A pipeline's next step, a group's completion callbacks, a message's own on_success or on_failure: Dramatiq
    runs them after the message's job, which a skipped duplicate never has.  Said, with what is dropped; a
    replaced or raised duplicate drops nothing (the replacement carries it; the sender is told)."""
    message = SimpleNamespace(message_id="new-1", actor_name="report", queue_name="default", options={option: "x"})
    with caplog.at_level(logging.WARNING, logger="dramatiq_unique.events"):
        events.duplicate("replace", message, "old-1", "abc")
        events.duplicate("raise", message, "old-1", "abc")
        assert not caplog.records
        events.duplicate("skip", message, "old-1", "abc")
    (record,) = caplog.records
    assert record.levelname == "WARNING" and f"({option}) will not run" in record.getMessage()


def test_lock_lost_returns_its_error_to_be_raised(caplog):
    error = RuntimeError("gone")
    assert events.lock_lost(None, error) is error  # no job yet: still a line, still no raise


def test_every_metric_moves_on_its_event_and_is_exposed(prometheus):
    enable_metrics(multiprocess_dir=str(prometheus))
    every_hook()
    scraped = prom.scrape()
    assert NAMES <= {name.removesuffix("_count").removesuffix("_sum").removesuffix("_bucket")
                     for name in scraped.names()}
    assert scraped.value("dramatiq_unique_duplicates_total", actor_name="act") == 3
    assert scraped.value("dramatiq_unique_duplicates_total", decision="replace") == 1
    assert scraped.value("dramatiq_unique_waits_total", gate="slot") == 1
    assert scraped.value("dramatiq_unique_wait_seconds_count", gate="slot") == 1
    assert 0.2 < scraped.value("dramatiq_unique_wait_seconds_sum") < 5  # seconds, not ms
    assert scraped.value("dramatiq_unique_handover_seconds_count") == 1
    assert scraped.value("dramatiq_unique_parked_jobs", actor_name="act", gate="slot") == 2
    assert scraped.value("dramatiq_unique_fenced_writes_refused_total", write="outcome") == 1
    assert scraped.value("dramatiq_unique_heartbeats_total") == scraped.value("dramatiq_unique_lock_lost_total") == 1
    assert scraped.value("dramatiq_unique_redrive_jobs_total", outcome="lost") == 1
    assert scraped.value("dramatiq_unique_redrive_passes_total") == 1
    events.parked_counts({})  # the group emptied: its gauge reads 0, not its last count
    assert prom.scrape().value("dramatiq_unique_parked_jobs", actor_name="act") == 0


def test_turned_on_twice_and_by_two_suites_the_metrics_are_registered_once(prometheus):
    enable_metrics(multiprocess_dir=str(prometheus))
    sink = events.sink
    enable_metrics(multiprocess_dir=str(prometheus))
    enable_metrics()
    assert events.sink is sink


def test_odd_actor_names_are_labels_like_any_other(prometheus):
    enable_metrics(multiprocess_dir=str(prometheus))
    odd = ['quote"d', "back\\slash", "new\nline", "ünï €", "", "a" * 300, "{}=,"]
    for name in odd:
        events.heartbeat(job(actor_name=name))
    events.heartbeat(job(actor_name=None, queue_name=None))  # a row without them: the empty label
    assert prom.scrape().labels("dramatiq_unique_heartbeats_total", "actor_name") == set(odd)


def test_a_metric_that_cannot_be_written_is_logged_never_raised(prometheus, caplog):
    enable_metrics(multiprocess_dir=str(prometheus))
    for path in prometheus.iterdir():
        path.unlink()
    prometheus.rmdir()  # a temporary-files cleaner took the directory: a new file cannot be opened
    with caplog.at_level(logging.WARNING):
        events.parked_counts({("act", "lock"): 1})
        events.parked_counts({("act", "lock"): 2})
    assert events.sink is not None and events.sink.failures == 2
    assert "goes uncounted" in caplog.text


def test_enable_makes_a_missing_directory_again(prometheus):
    missing = prometheus / "gone"
    enable_metrics(multiprocess_dir=str(missing))
    events.heartbeat(job())
    assert missing.is_dir() and any(missing.iterdir())


def test_parked_deliveries_are_not_counted_by_dramatiqs_prometheus(prometheus):
    """Given Dramatiq's Prometheus middleware, first on the broker (its before_process_message
    ran) or last (it did not), then a parked delivery's skip leaves its message counts, durations
    and in-progress gauge as they were; any other skip is counted as Dramatiq counts it."""
    from dramatiq.middleware.prometheus import Prometheus

    broker = StubBroker()
    middleware = Prometheus()
    broker.add_middleware(middleware)
    broker.emit_after("process_boot")
    assert quiet_parks(broker) == 1 and quiet_parks(broker) == 0

    def delivery(message_id: str, parked: bool, before: bool):
        message = SimpleNamespace(message_id=message_id, queue_name="q", actor_name="act")
        if parked:
            setattr(message, PARKED, True)
        if before:
            middleware.before_process_message(broker, message)
        broker.emit_after("skip_message", message)

    delivery("a", parked=True, before=True)
    delivery("b", parked=True, before=False)
    scraped = prom.scrape()
    assert scraped.value("dramatiq_messages_total") == 0
    assert scraped.value("dramatiq_message_duration_milliseconds_count") == 0
    assert scraped.value("dramatiq_messages_inprogress") == 0
    delivery("c", parked=False, before=True)  # another middleware's skip: Dramatiq's count, as before
    assert prom.scrape().value("dramatiq_messages_total", actor_name="act") == 1


def test_without_prometheus_client_asking_for_metrics_is_a_clear_error_and_a_worker_boots(monkeypatch, caplog):
    from dramatiq_unique import Metrics, NotConfigured

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    with pytest.raises(NotConfigured, match=r"dramatiq_unique\[prometheus\]"):
        enable_metrics()
    broker = StubBroker()
    broker.add_middleware(Metrics(enabled=True))
    broker.emit_after("process_boot")  # logged, not raised: the worker runs, without metrics
    assert not metrics_on() and "metrics are off" in caplog.text


@pytest.mark.parametrize("order", ["metrics-boots-first", "prometheus-boots-first"])
def test_in_a_fresh_process_both_boot_orders_write_to_dramatiqs_directory(tmp_path, order):
    """Given a fresh process (prometheus_client not imported, no multiprocess variable), then
    whichever of the two middlewares boots first, prometheus_client comes up in multiprocess mode
    on Dramatiq's directory, and the suite's counter lands beside Dramatiq's."""
    code = f"""
import glob, os, sys
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware.prometheus import Prometheus
from dramatiq_unique import Metrics
from dramatiq_unique.observe import events, metrics_on
broker = StubBroker()
first = {order == "metrics-boots-first"}  # emit_after runs the list backwards: the last added boots first
for m in ([Prometheus(), Metrics()] if first else [Metrics(), Prometheus()]):
    broker.add_middleware(m)
assert "prometheus_client" not in sys.modules
broker.emit_after("process_boot")
from prometheus_client import values
assert values.ValueClass._multiprocess and metrics_on()
events.heartbeat(type("Job", (), dict(queue_name="q", actor_name="a"))())
assert glob.glob(os.path.join(os.environ["dramatiq_prom_db"], "counter_*.db"))
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry, os.environ["dramatiq_prom_db"])
assert b'dramatiq_unique_heartbeats_total{{actor_name="a",queue_name="q"}} 1.0' in generate_latest(registry)
"""
    env = {k: v for k, v in os.environ.items() if "multiproc" not in k.lower()}
    env["dramatiq_prom_db"] = str(tmp_path)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2], env=env, timeout=60)

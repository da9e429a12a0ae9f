"""Sends while the broker is down (durable/deferral.py): which errors defer, the outage's log, the backoff."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import dramatiq.errors
import pika.exceptions
import pytest
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker

from dramatiq_unique.context import MARKER
from dramatiq_unique.durable import deferral
from dramatiq_unique.errors import InvalidOption
from dramatiq_unique.suite import Settings


class Broker:
    """Stands for a broker: only its identity and name matter here."""


def suite_with(**settings) -> SimpleNamespace:
    return SimpleNamespace(settings=Settings(**settings), broker=Broker())


@pytest.mark.parametrize("error", [
    redis.ConnectionError("refused"), redis.TimeoutError("timed out"), redis.BusyLoadingError("loading"),
    dramatiq.errors.ConnectionClosed(OSError("closed")), dramatiq.errors.ConnectionFailed("failed"),
    pika.exceptions.AMQPConnectionError("refused"),
], ids=lambda e: type(e).__name__)
def test_broker_connection_errors_defer_a_tracked_send(error):
    assert deferral.defers(suite_with(), error)
    assert not deferral.defers(suite_with(on_broker_down="raise"), error)


@pytest.mark.parametrize("error", [ValueError("bad"), redis.ResponseError("WRONGTYPE"), RuntimeError()])
def test_other_errors_undo_the_send(error):
    assert not deferral.defers(suite_with(), error)


def test_the_settings_are_checked():
    with pytest.raises(InvalidOption, match="on_broker_down"):
        Settings(on_broker_down="drop")
    with pytest.raises(InvalidOption, match="broker_down_backoff"):
        Settings(broker_down_backoff=0)
    assert Settings().on_broker_down == "defer" and Settings().broker_down_backoff == 1_000


def test_one_warning_per_outage(caplog):
    suite = suite_with()
    caplog.set_level(logging.DEBUG, logger=deferral.__name__)
    for _ in range(3):
        deferral.failed(suite, suite.broker, redis.ConnectionError("refused"))
    deferral.send_failed(suite, suite.broker, "m1", redis.ConnectionError("refused"))  # the re-drive's, the same
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Broker) is down (ConnectionError: refused)" in warnings[0].getMessage()
    deferral.published(suite.broker)
    deferral.failed(suite, suite.broker, redis.ConnectionError("refused"))
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2, "a new outage, a new warning"


def test_another_failure_than_the_brokers_is_logged_each_time(caplog):
    suite = suite_with()
    for _ in range(2):
        deferral.send_failed(suite, suite.broker, "m1", ValueError("not encodable"))
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
    assert not deferral.skip_publish(suite), "not an outage"


def test_after_a_failed_publish_sends_skip_the_broker_for_the_backoff():
    suite = suite_with(broker_down_backoff=50)
    assert not deferral.skip_publish(suite)
    deferral.failed(suite, suite.broker, redis.ConnectionError("refused"))
    assert deferral.skip_publish(suite)
    time.sleep(0.06)
    assert not deferral.skip_publish(suite), "after the backoff, the next send tries the broker again"
    deferral.failed(suite, suite.broker, redis.ConnectionError("refused"))
    deferral.published(suite.broker)
    assert not deferral.skip_publish(suite), "a publish that went through ends it at once"
    raising = suite_with(on_broker_down="raise")
    deferral.failed(raising, raising.broker, redis.ConnectionError("refused"))
    assert not deferral.skip_publish(raising)
    with deferral.skipping():
        assert deferral.skip_publish(suite_with())


def test_the_mark_the_redrive_counts():
    options = {"max_retries": 3, MARKER: {"qt": "m1"}}
    flagged = deferral.flagged(options)
    assert flagged == {"max_retries": 3, MARKER: {"qt": "m1", deferral.DEFERRED: 1}}
    assert options == {"max_retries": 3, MARKER: {"qt": "m1"}}, "the given options are left alone"
    assert deferral.was_deferred(SimpleNamespace(options=flagged))
    assert not deferral.was_deferred(SimpleNamespace(options=options))
    assert not deferral.was_deferred(SimpleNamespace(options=None))


def test_the_warning_names_the_broker():
    assert deferral.describe(RedisBroker(url="redis://127.0.0.1:6390/0")) == "RedisBroker at 127.0.0.1:6390"
    rabbit = RabbitmqBroker(url="amqp://guest:guest@127.0.0.1:5673")
    assert deferral.describe(rabbit) == "RabbitmqBroker at 127.0.0.1:5673"
    assert deferral.describe(Broker()) == "Broker"

"""The Dramatiq versions whose Redis broker keys dramatiq_unique.broker.refs was checked against (no services)."""

from __future__ import annotations

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

from dramatiq_unique import DependencyUnavailable
from dramatiq_unique.broker import refs


def redis_broker() -> RedisBroker:
    """A RedisBroker that never connects: the check looks at its type only."""
    return RedisBroker.__new__(RedisBroker)


def test_the_installed_dramatiq_is_one_the_internals_were_written_for():
    refs.check(redis_broker())


@pytest.mark.parametrize("version", ["2.0.0", "2.2.1", "2.10.0rc1"])
def test_every_2x_version_is_accepted(version, monkeypatch):
    monkeypatch.setattr(dramatiq, "__version__", version)
    refs.check(redis_broker())


@pytest.mark.parametrize("version", ["1.17.1", "3.0.0", "3.0.0b1", "10.1", "dev"])
def test_a_redis_broker_under_an_untested_major_version_is_refused_naming_the_versions(version, monkeypatch):
    monkeypatch.setattr(dramatiq, "__version__", version)
    with pytest.raises(DependencyUnavailable) as error:
        refs.check(redis_broker())
    assert f"dramatiq {version}" in str(error.value) and "dramatiq>=2,<3" in str(error.value)


def test_a_broker_whose_internals_the_suite_does_not_touch_is_never_refused(monkeypatch):
    monkeypatch.setattr(dramatiq, "__version__", "3.0.0")
    refs.check(StubBroker())


def test_a_tracked_actor_on_a_redis_broker_under_dramatiq_3_is_refused_at_declaration(monkeypatch):
    from dramatiq_unique.unique.send import install_enqueue

    monkeypatch.setattr(dramatiq, "__version__", "3.0.0")
    broker = redis_broker()
    broker.enqueue = lambda message, *, delay=None: message  # type: ignore[method-assign]
    with pytest.raises(DependencyUnavailable, match="dramatiq 3.0.0"):
        install_enqueue(broker, suite=None)  # type: ignore[arg-type]
    assert not getattr(broker.enqueue, "_dramatiq_unique", False)  # nothing was wrapped

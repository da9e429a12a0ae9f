"""Telling the suite's own skips from other middlewares' (guard.own_skip), and the skip reasons."""

from __future__ import annotations

import dramatiq
import pytest
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Middleware, SkipMessage

from dramatiq_unique.durable.refused import skip_reason
from dramatiq_unique.guard import hook, own_skip


class Ours(Middleware):
    @hook
    def before_process_message(self, broker, message):
        raise SkipMessage("parked")


def proxy() -> MessageProxy:
    return MessageProxy(dramatiq.Message(queue_name="q", actor_name="a", args=(), kwargs={}, options={}))


def test_a_skip_raised_through_a_suite_hook_is_marked_as_the_suites_own():
    message = proxy()
    with pytest.raises(SkipMessage):
        Ours().before_process_message(None, message)
    assert own_skip(message)


def test_a_skip_raised_elsewhere_is_not():
    assert not own_skip(proxy())


def test_the_skip_reason_names_the_exception_dramatiq_kept():
    message = proxy()
    message.stuff_exception(SkipMessage("Message age limit exceeded"))
    assert skip_reason(message) == "SkipMessage: Message age limit exceeded (skipped before it ran)"
    assert skip_reason(proxy(), started=True).startswith("SkipMessage: ")

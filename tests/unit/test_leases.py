"""Unit tests of dramatiq_unique.context (heartbeat()): context hand-over to async actors, no services."""

from __future__ import annotations

import contextvars
import logging
import types

import pytest
from dramatiq.asyncio import EventLoopThread, async_to_sync, get_event_loop_thread, set_event_loop_thread

from dramatiq_unique import NotInJob, context, current_job, heartbeat
from dramatiq_unique.context import carry_context


class AmnesicLoop(EventLoopThread):
    """An event-loop thread that runs each coroutine in an empty context (as a
    loop that does not copy the caller's context would)."""

    def run_coroutine(self, coro):
        return contextvars.Context().run(super().run_coroutine, coro)


@pytest.fixture
def amnesic_loop():
    previous = get_event_loop_thread()
    loop = AmnesicLoop(logging.getLogger(__name__))
    loop.start(timeout=5)
    set_event_loop_thread(loop)
    yield loop
    set_event_loop_thread(previous)
    loop.stop()


async def whose_job():
    return current_job()


def test_an_async_actor_sees_the_attempts_context_whatever_the_loop_does(amnesic_loop):
    job = object()
    plain = types.SimpleNamespace(fn=async_to_sync(whose_job))
    carried = types.SimpleNamespace(fn=async_to_sync(whose_job))
    carry_context(carried)
    fn = carried.fn
    carry_context(carried)  # idempotent
    assert carried.fn is fn

    context.active.set(context.JobContext(suite=None, config=None, message=None, job=job))  # type: ignore[arg-type]
    try:
        with pytest.raises(NotInJob):
            plain.fn()  # the loop dropped the context
        assert carried.fn() is job
    finally:
        context.active.set(None)


def test_sync_functions_are_left_alone():
    def sync():
        return 1

    actor = types.SimpleNamespace(fn=sync)
    carry_context(actor)
    assert actor.fn is sync


def test_heartbeat_outside_a_job_raises_not_in_job():
    with pytest.raises(NotInJob):
        heartbeat()

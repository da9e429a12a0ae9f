"""TimeLimit's interrupts held back while a thread is in logging's own code (and only there), and its timer
logging outside its lock (dramatiq_unique.middleware.time_limit; no service needed)."""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
from typing import Any

from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit
from dramatiq.middleware.time_limit import TimeLimitExceeded

from dramatiq_unique.middleware import time_limit


def manager_of(middleware: TimeLimit) -> Any:
    return middleware.manager


class Interruptible(threading.Thread):
    """Logs through ``handler`` (waiting for its lock), then sleeps in short steps until interrupted."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__(daemon=True)
        self.handler = handler
        self.logged = threading.Event()
        self.interrupted: list[BaseException] = []

    def run(self) -> None:
        try:
            self.handler.handle(logging.LogRecord("t", logging.WARNING, __file__, 1, "x", None, None))
            self.logged.set()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.01)
        except TimeLimitExceeded as e:
            self.interrupted.append(e)


def test_an_interrupt_waits_while_its_thread_is_in_logging_code():
    manager = manager_of(TimeLimit())
    handler = logging.StreamHandler(io.StringIO())
    handler.acquire()  # the thread waits in Handler.acquire, logging's own code
    thread = Interruptible(handler)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while not time_limit.in_unsafe_code(sys._current_frames().get(thread.ident)):
            assert time.monotonic() < deadline, "the thread never waited in logging"
            time.sleep(0.005)
        manager.deadlines[thread.ident] = time.monotonic() - 1
        time_limit.handle_deadlines(manager)
        assert manager.deadlines[thread.ident] is not None  # held back: the deadline stays
        time.sleep(0.1)
        assert not thread.interrupted
    finally:
        handler.release()
    assert thread.logged.wait(5)
    time_limit.handle_deadlines(manager)  # out of logging now: interrupted
    thread.join(5)
    assert manager.deadlines[thread.ident] is None and len(thread.interrupted) == 1


def test_an_actor_that_waits_on_an_event_in_a_loop_is_still_interrupted():
    manager = manager_of(TimeLimit())
    interrupted: list[BaseException] = []
    started = threading.Event()

    def poll() -> None:
        started.set()
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                threading.Event().wait(0.05)  # threading's own code most of the time
        except TimeLimitExceeded as e:
            interrupted.append(e)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    assert started.wait(5)
    time.sleep(0.1)
    manager.deadlines[thread.ident] = time.monotonic() - 1
    time_limit.handle_deadlines(manager)
    thread.join(5)
    assert manager.deadlines[thread.ident] is None and len(interrupted) == 1


def test_the_timer_logs_outside_its_lock():
    """A handler whose lock another thread holds keeps the timer waiting to log, not the jobs' starts and ends
    (``add_timeout``, ``remove_timeout``), which take the timer's lock."""
    middleware = TimeLimit()
    manager = manager_of(middleware)
    handler = logging.StreamHandler(io.StringIO())
    manager.logger.addHandler(handler)
    sleeper = Interruptible(logging.StreamHandler(io.StringIO()))
    sleeper.start()
    assert sleeper.logged.wait(5)
    handler.acquire()
    timer = threading.Thread(target=time_limit.handle_deadlines, args=(manager,), daemon=True)
    try:
        manager.deadlines[sleeper.ident] = time.monotonic() - 1
        timer.start()
        time.sleep(0.1)
        assert timer.is_alive()  # waiting to log
        finished = threading.Thread(target=manager.remove_timeout, args=(12345,), daemon=True)
        finished.start()
        finished.join(2)
        assert not finished.is_alive()  # the timer's lock is free
    finally:
        handler.release()
        manager.logger.removeHandler(handler)
    timer.join(5)
    sleeper.join(5)
    assert len(sleeper.interrupted) == 1


def test_install_replaces_the_timer_of_the_brokers_time_limit_only_once():
    broker = StubBroker(middleware=[TimeLimit()])
    time_limit.install(broker)
    time_limit.install(broker)
    [middleware] = [m for m in broker.middleware if isinstance(m, TimeLimit)]
    handle = middleware.manager._handle_deadlines
    assert handle.func is time_limit.handle_deadlines and handle.args == (middleware.manager,)
    broker.close()

"""Dramatiq's ``TimeLimit``, kept from wedging a worker process.

``TimeLimit`` interrupts an actor that ran past its limit by raising an exception in its thread from a timer
thread (``PyThreadState_SetAsyncExc``), and the exception lands at whatever instruction the thread runs next.
Inside the standard library's ``logging``, between a handler's lock acquired and the ``try`` that lets it go,
it leaks that lock, and every other thread that logs waits for ever.  Dramatiq's timer logs while holding
its own lock (``mu``), which every job's start and end take, so the timer and then every worker thread of the
process wait too.  The process then runs nothing more, while its consumer goes on heartbeating, so Redis
never hands its messages to another worker.  This takes a stopped process (SIGSTOP, a paused VM) to be
likely: when it resumes, every running job is past its limit at once.

:func:`install` changes two things of a worker process's ``TimeLimit``: its timer logs after letting go of
its lock, and it holds an interrupt back while the thread runs ``logging``'s own code, until a later look
(every ``interval``) finds it out of there.  A thread spends little of its time there, so an interrupt
usually waits no more than a look or two.  ``threading``'s waits are left interruptible: an actor that
polls an event in a loop spends most of its time in them.
"""

from __future__ import annotations

import functools
import logging
import sys
from time import monotonic
from types import FrameType
from typing import Any, Optional

from dramatiq.middleware import TimeLimit
from dramatiq.middleware.threading import raise_thread_exception
from dramatiq.middleware.time_limit import TimeLimitExceeded

#: The module an interrupt must not land in: its handlers take and let go of their locks around ``try`` blocks.
UNSAFE = frozenset({logging.__file__})


def install(broker: Any) -> None:
    """Make the timer of ``broker``'s ``TimeLimit`` (the threads' one; gevent's has none) interrupt only
    outside ``logging``, and log outside its lock.  Idempotent."""
    for middleware in broker.middleware:
        manager = getattr(middleware, "manager", None) if isinstance(middleware, TimeLimit) else None
        if manager is not None and hasattr(manager, "deadlines") and hasattr(manager, "mu"):
            manager._handle_deadlines = functools.partial(handle_deadlines, manager)


def handle_deadlines(manager: Any) -> None:
    """Dramatiq's ``_CtypesTimeoutManager._handle_deadlines``, as the module docstring says."""
    now = monotonic()
    frames = sys._current_frames()
    due = []
    with manager.mu:
        for thread_id, deadline in manager.deadlines.items():
            if deadline and now >= deadline and not in_unsafe_code(frames.get(thread_id)):
                manager.deadlines[thread_id] = None
                due.append(thread_id)
    for thread_id in due:
        manager.logger.warning("Time limit exceeded. Raising exception in worker thread %r.", thread_id)
        raise_thread_exception(thread_id, TimeLimitExceeded)


def in_unsafe_code(frame: Optional[FrameType]) -> bool:
    """Whether the thread whose innermost frame is ``frame`` runs ``logging``'s own code (a handler's lock
    taken, its record emitted), where an exception raised now could leave the lock taken."""
    return frame is not None and frame.f_code.co_filename in UNSAFE

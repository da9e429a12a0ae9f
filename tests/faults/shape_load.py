"""The load of the production-shape tests (test_shape_*.py) and their verdict.

A few hundred sends, mixed: ``until_and_while_executing`` unique jobs over keys that repeat (some
sends are duplicates, skipped), tracked jobs (with ``fail_first``, each fails its first attempts on
purpose: Dramatiq's Retries schedules their retries), and slot-limited jobs of a few tenants; sent by
producer threads of the test process while `dramatiq` workers run them.  The verdict is the fault
suite's judge (tests/faults/events.py): every row succeeded (nothing lost, nothing stuck), no key
had more holders than its lock or limit allows and no job ran beside itself, and the runs beyond
one per job are no more than the faults cut.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from tests import fault_app
from tests.faults import events as ev
from tests.faults.harness import Fleet, finish

#: The slot actor's concurrency_limit in these tests (DU_LIMIT).
LIMIT = 2
UNIQUE_KEYS = 40
TENANTS = 4
#: How many holders each kind allows per key ("tracked": only "never beside itself").
ALLOWED = {"unique": 1, "slot": LIMIT}


class Load:
    """``count`` sends from ``producers`` threads, ``pause`` seconds apart in each; a send that raises
    is kept in :attr:`errors` (with how long it took), unless ``expected(error)`` says it may."""

    def __init__(self, app: fault_app.App, count: int, *, producers: int = 2, pause: float = 0.01,
                 run_ms: int = 40, beat_ms: int = 0, expected: Callable[[BaseException], bool] = lambda e: False,
                 fail_first: int = 0, first: int = 0) -> None:
        self.app, self.count, self.pause, self.run_ms, self.beat_ms = app, count, pause, run_ms, beat_ms
        self.fail_first = fail_first
        self.expected = expected
        self.sent: list[str] = []
        self.refused: list[BaseException] = []
        self.errors: list[tuple[BaseException, float]] = []
        self.slowest = 0.0
        self.done = threading.Event()
        self._next = iter(range(first, first + count))
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._produce, daemon=True, name=f"producer-{i}")
                         for i in range(producers)]

    def start(self) -> "Load":
        for thread in self._threads:
            thread.start()
        return self

    def _take(self) -> Optional[int]:
        with self._lock:
            return next(self._next, None)

    def send(self, i: int) -> str:
        app, kw = self.app, dict(run_ms=self.run_ms, beat_ms=self.beat_ms)
        kind = i % 3
        if kind == 0:
            return app.unique.send(f"u{i % UNIQUE_KEYS}", i, **kw).message_id
        if kind == 1:
            return app.tracked.send(f"t{i}", i, fail_first=self.fail_first, **kw).message_id
        return app.slot.send(f"tenant{i % TENANTS}", i, **kw).message_id

    def _produce(self) -> None:
        try:
            while (i := self._take()) is not None:
                began = time.monotonic()
                try:
                    self.sent.append(self.send(i))
                except Exception as e:  # noqa: BLE001 - judged by the test
                    (self.refused.append(e) if self.expected(e) else self.errors.append((e, time.monotonic() - began)))
                self.slowest = max(self.slowest, time.monotonic() - began)
                time.sleep(self.pause)
        finally:
            self.app.suite.close()  # this thread's connections

    def join(self, timeout: float = 120) -> None:
        for thread in self._threads:
            thread.join(timeout)
            assert not thread.is_alive(), "a producer hung"
        self.done.set()

    def sends_done(self) -> int:
        return len(self.sent) + len(self.refused) + len(self.errors)


def ran(app: fault_app.App) -> int:
    """How many runs have finished (``done`` events) so far."""
    return sum(1 for e in app.log.read() if e["event"] == "done")


def judge(app: fault_app.App, fleet: Fleet, directory: Path, *loads: Load, timeout: float = 90,
          ) -> tuple[ev.Figures, list[Any], ev.Log]:
    """Every job succeeded, within ``timeout`` s; the judge's three checks; returns its figures, the rows, the log."""
    for load in loads:
        assert not load.errors, (f"{len(load.errors)} sends failed, e.g. {load.errors[0][0]!r} "
                                 f"after {load.errors[0][1]:.1f}s")
    rows, log = finish(app, fleet, directory, timeout=timeout)
    for load in loads:
        assert set(load.sent) <= {r.message_id for r in rows}, "every send that returned has its row"
    ev.check_holders(log, ALLOWED)
    # A run that failed on purpose is followed by its retry: not a rerun that a fault must explain.
    chosen = ev.Log(log.events, [r for r in log.runs if r.done_error != "Deliberate"], log.faults)
    figures = ev.check_reruns(chosen, {r.message_id for r in rows})
    ev.check_no_run_after_success(log)
    return figures, rows, log

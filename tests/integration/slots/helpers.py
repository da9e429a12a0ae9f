"""Helpers shared by the tests of concurrency slots and of the parking deck: recorded runs, job rows."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from dramatiq_unique import JobModel
from tests.helpers import wait_until


def queue_behind_a_holder(actor, rec: "Recorder", jobs: int) -> None:
    """Send job 0, wait for it to start (it holds the group's slot), then send jobs 1 to ``jobs - 1``."""
    actor.send(0)
    wait_until(lambda: rec.started() == 1, timeout=10, what="the first job to start")
    for i in range(1, jobs):
        actor.send(i)


class Recorder:
    """Start and end times (perf_counter) of jobs by group, from any worker thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: dict[tuple, list] = {}
        self.running: dict[str, int] = defaultdict(int)
        self.peak: dict[str, int] = defaultdict(int)

    def start(self, group: str, i) -> None:
        with self.lock:
            self.spans[(group, i)] = [time.perf_counter(), None]
            self.running[group] += 1
            self.peak[group] = max(self.peak[group], self.running[group])

    def end(self, group: str, i) -> None:
        with self.lock:
            self.spans[(group, i)][1] = time.perf_counter()
            self.running[group] -= 1

    def run(self, group: str, i, ms: float) -> None:
        self.start(group, i)
        try:
            time.sleep(ms / 1000)
        finally:
            self.end(group, i)

    def started(self, group: str = None) -> int:
        with self.lock:
            return sum(1 for (g, _) in self.spans if group is None or g == group)

    def ended(self, group: str = None) -> int:
        with self.lock:
            return sum(1 for (g, _), (_, e) in self.spans.items() if e is not None and (group is None or g == group))

    def order(self, group: str) -> list:
        """The job ids of ``group`` in the order they started."""
        with self.lock:
            return [i for (g, i), _ in sorted(self.spans.items(), key=lambda kv: kv[1][0]) if g == group]

    def intervals(self, group: str) -> list[tuple[float, float]]:
        with self.lock:
            return sorted((s, e) for (g, _), (s, e) in self.spans.items() if g == group)


def rows(actor_name: str) -> list[JobModel]:
    return list(JobModel.select().where(JobModel.actor_name == actor_name).order_by(JobModel.id))


def assert_all_succeeded_once(actor_name: str, count: int) -> None:
    # An actor's end is seen before its outcome is written (after_process_message):
    # let the last rows settle, within a bound, before judging them.
    wait_until(lambda: all(r.status in ("succeeded", "failed") for r in rows(actor_name)), timeout=10,
               what=f"the {actor_name} rows to record their outcome")
    found = rows(actor_name)
    assert len(found) == count
    assert {r.status for r in found} == {"succeeded"}, [(r.id, r.status, r.last_error) for r in found]
    assert {r.attempts for r in found} == {1}, "an attempt was wasted"

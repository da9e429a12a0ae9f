"""A scene for the operator's views: a slot group full with jobs waiting, a lock held with
jobs waiting, a dead job and finished ones, on real Redis and SQLite or PostgreSQL."""

from __future__ import annotations

import dataclasses
import threading
from typing import Iterator

import dramatiq
import pytest

from dramatiq_unique import JobModel
from tests.helpers import wait_until


@dataclasses.dataclass
class Scene:
    slot_holders: list[int]
    slot_waiters: list[int]
    lock_holder: int
    lock_waiters: list[int]
    dead: int
    done: int
    release: threading.Event
    #: Set: ``broken`` succeeds from then on (a retried dead job can succeed).
    fixed: threading.Event


def _ids(actor: str, status: str) -> list[int]:
    rows = JobModel.select().where((JobModel.actor_name == actor) & (JobModel.status == status)).order_by(JobModel.id)
    return [row.id for row in rows]


@pytest.fixture
def scene(suite, broker, make_worker) -> Iterator[Scene]:
    """deliver_webhook (2 slots per customer): 2 of customer 42 running, 3 parked; report
    (one running per user): user 7 running, 2 parked; a failed job; a succeeded one."""
    release, fixed = threading.Event(), threading.Event()
    make_worker(8)  # 3 (4 with a raised limit) stay busy until the test ends

    @dramatiq.actor(concurrency_limit=2, concurrency_key=["customer"], concurrency_ttl=30_000)
    def deliver_webhook(customer: int, payload: str = "") -> None:
        release.wait(20)

    @dramatiq.actor(unique_args=["user"], unique_lock="while_executing", unique_ttl=30_000)
    def report(user: int, part: int = 0) -> None:
        release.wait(20)

    @dramatiq.actor(track=True, max_retries=0)
    def broken(n: int) -> None:
        if not fixed.is_set():
            raise RuntimeError(f"broken {n}")

    @dramatiq.actor(track=True)
    def fine(n: int) -> int:
        return n

    fine.send(1)
    broken.send(2)
    for i in range(5):
        deliver_webhook.send(42, f"p{i}")
    for part in range(3):
        report.send(7, part)
    wait_until(lambda: len(_ids("deliver_webhook", "running")) == 2 and len(_ids("deliver_webhook", "pending")) == 3,
               timeout=10, what="2 webhooks running, 3 parked")
    wait_until(lambda: len(_ids("report", "running")) == 1 and len(_ids("report", "pending")) == 2,
               timeout=10, what="1 report running, 2 parked")
    wait_until(lambda: _ids("broken", "failed") and _ids("fine", "succeeded"), timeout=10, what="broken, fine done")
    yield Scene(
        _ids("deliver_webhook", "running"), _ids("deliver_webhook", "pending"), _ids("report", "running")[0],
        _ids("report", "pending"), _ids("broken", "failed")[0], _ids("fine", "succeeded")[0], release, fixed,
    )
    release.set()

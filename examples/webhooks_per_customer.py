"""Webhooks, at most 2 at once per customer; limits changed while the worker runs.

    python examples/webhooks_per_customer.py

Three customers each have 12 webhooks to receive; their servers are slow
(150 ms a call), so no customer gets more than 2 calls at once
(``concurrency_limit=2, concurrency_key=["customer"]``), while 16 worker
threads serve everybody.  Jobs over a customer's limit are parked: they
hold no thread and burn no retry.  While the worker runs:

* acme upgrades its plan: ``set_concurrency_limit(..., 5, key="acme")``
  starts three of its parked jobs at once;
* globex's server goes down: ``set_concurrency_limit(..., 0, key="globex")``
  halts its webhooks (those running finish, the rest wait, none is lost);
  a moment later it is back: ``None`` restores the declared limit.

Uses SQLite in a temporary folder unless DATABASE_URL is set, and the
local Redis (REDIS_URL, default redis://127.0.0.1:6379/0).
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict

import dramatiq
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import JobStatus, concurrency_status, set_concurrency_limit

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{tempfile.mkdtemp()}/jobs.db"
RUN = uuid.uuid4().hex[:8]  # own key namespace per run

broker = RedisBroker(url=REDIS_URL, namespace=f"example-{RUN}")
dramatiq.set_broker(broker)
suite = dramatiq_unique.setup(broker, database=DATABASE_URL, redis=REDIS_URL, key_prefix=f"example-{RUN}")

CUSTOMERS = ("acme", "globex", "initech")
lock = threading.Lock()
running: dict[str, int] = defaultdict(int)
peaks: dict[tuple[str, str], int] = defaultdict(int)  # (phase, customer) -> most calls at once
phase = "start"


@dramatiq.actor(concurrency_limit=2, concurrency_key=["customer"], max_retries=3)
def deliver_webhook(customer: str, event_id: int) -> None:
    with lock:
        running[customer] += 1
        peaks[(phase, customer)] = max(peaks[(phase, customer)], running[customer])
    try:
        time.sleep(0.15)  # POST to the customer's slow server
    finally:
        with lock:
            running[customer] -= 1


def set_phase(name: str) -> None:
    global phase
    with lock:
        phase = name
        for customer, n in running.items():  # what runs as the phase begins counts in it too
            peaks[(name, customer)] = n


def show(label: str) -> None:
    parts = []
    for customer in CUSTOMERS:
        s = concurrency_status("deliver_webhook", key=customer)
        parts.append(f"{customer}: limit {s.limit}, running {s.holders}, parked {s.parked}")
    print(f"  {label:<26} " + " | ".join(parts))


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def main() -> int:
    for event_id in range(12):
        for customer in CUSTOMERS:
            deliver_webhook.send(customer, event_id)
    print("36 webhooks sent (12 per customer), at most 2 at once per customer, 16 worker threads")

    worker = dramatiq.Worker(broker, worker_threads=16, worker_timeout=100)
    worker.start()
    try:
        time.sleep(0.4)
        show("running:")

        set_phase("acme on 5")
        started = set_concurrency_limit("deliver_webhook", 5, key="acme")
        print(f"acme upgrades to 5 at once: {started} of its parked webhooks started at once")
        show("after the upgrade:")

        set_phase("globex halted")
        set_concurrency_limit("deliver_webhook", 0, key="globex")
        print("globex's server is down: its webhooks are halted (running ones finish, the rest wait)")
        wait_for(lambda: concurrency_status("deliver_webhook", key="globex").holders == 0, 5)
        time.sleep(0.3)
        show("globex halted:")

        set_phase("globex back")
        started = set_concurrency_limit("deliver_webhook", None, key="globex")
        print(f"globex is back: its declared limit applies again, {started} parked webhooks started at once")

        model = dramatiq_unique.JobModel
        done = wait_for(lambda: model.select().where(model.status == "succeeded").count() == 36, 30)
    finally:
        worker.stop()
        broker.flush_all()

    rows = list(dramatiq_unique.JobModel.select())
    statuses = sorted({JobStatus(r.status).value for r in rows})
    attempts = sorted({r.attempts for r in rows})
    print(f"all delivered: {done}; statuses {statuses}; attempts per job {attempts} (none wasted on waiting)")
    # The most calls at once each phase may see: acme's new limit once raised; halting globex
    # lets the two calls already under way finish.
    allowed = {"start": (2, 2, 2), "acme on 5": (5, 2, 2), "globex halted": (5, 2, 2), "globex back": (5, 2, 2)}
    print("most calls at once per customer, by phase (allowed):")
    ok = done and attempts == [1]
    for name, limits in allowed.items():
        most = [peaks.get((name, customer), 0) for customer in CUSTOMERS]
        ok = ok and all(m <= limit for m, limit in zip(most, limits, strict=True))
        shown = (f"{c} {m} ({limit})" for c, m, limit in zip(CUSTOMERS, most, limits, strict=True))
        print(f"  {name:<14} " + ", ".join(shown))
    acme_used = max(peaks.get((name, "acme"), 0) for name in allowed) == 5
    print(f"acme used its new limit: {acme_used}")
    return 0 if ok and acme_used else 1


if __name__ == "__main__":
    sys.exit(main())

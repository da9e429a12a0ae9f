"""A migration holds customer 42: its jobs park meanwhile, and run once it is done.

    python examples/hold_customer.py

``dramatiq_unique.lock(actor, *args)`` is a pottery Redlock on the lock
that a job of those arguments takes while it runs.  Here a migration
script holds customer 42's: jobs sent for 42 park (they hold no worker
thread and spend no retry), customer 7's run as usual, and 42's start as
soon as the migration releases the lock.

Uses the embedded default job table (SQLite, in a temporary folder unless
DATABASE_URL is set) and the local Redis (REDIS_URL, default
redis://127.0.0.1:6379/0) as both broker and lock store.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid

import dramatiq
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{tempfile.mkdtemp()}/jobs.db"
# Own key namespace per run, so runs never see each other's jobs.
RUN = uuid.uuid4().hex[:8]

broker = RedisBroker(url=REDIS_URL, namespace=f"example-{RUN}")
suite = dramatiq_unique.setup(broker, database=DATABASE_URL, redis=REDIS_URL, key_prefix=f"example-{RUN}")
dramatiq.set_broker(broker)

started = time.monotonic()
log: list[str] = []


def say(text: str) -> None:
    line = f"{time.monotonic() - started:5.2f}s  {text}"
    log.append(line)
    print(line, flush=True)


@dramatiq.actor(unique_args=["customer_id"], unique_lock="while_executing")
def sync_customer(customer_id: int, reason: str) -> None:
    say(f"job: syncing customer {customer_id} ({reason})")


def wait_for(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.05)


def status(message: dramatiq.Message) -> str:
    job = dramatiq_unique.get_job(message.message_id)
    return "parked" if job.parked_on else str(job.status)


def main() -> int:
    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        # A lease of 30 s (unique_ttl, ms): should this script die, the jobs start once it runs out.
        with dramatiq_unique.lock(sync_customer, 42, unique_ttl=30_000):
            say("migration: holding customer 42")
            for42 = [sync_customer.send(42, "invoice paid"), sync_customer.send(42, "address changed")]
            for7 = sync_customer.send(7, "invoice paid")
            wait_for(lambda: status(for7) == "succeeded", "customer 7's job")
            wait_for(lambda: all(status(m) == "parked" for m in for42), "customer 42's jobs to park")
            say(f"migration: customer 42's jobs are {[status(m) for m in for42]}; 7's is {status(for7)}")
            time.sleep(0.5)  # the migration's own work
            say("migration: done, releasing customer 42")
        wait_for(lambda: all(status(m) == "succeeded" for m in for42), "customer 42's jobs to run")
        attempts = [dramatiq_unique.get_job(m.message_id).attempts for m in for42]
        say(f"customer 42's jobs: {[status(m) for m in for42]}, attempts {attempts}")
    finally:
        worker.stop()
        broker.flush_all()
    released = next(i for i, line in enumerate(log) if "releasing" in line)
    ran_42 = [i for i, line in enumerate(log) if "customer 42 (" in line]
    return 0 if len(ran_42) == 2 and min(ran_42) > released and attempts == [1, 1] else 1


if __name__ == "__main__":
    sys.exit(main())

"""A running attempt whose lease ran out, taken over by a parked delivery of its own job.

A worker frozen past its lease (SIGSTOP, a stalled VM) leaves its row ``running`` with a lease
in the past.  A second delivery of the job (Dramatiq's dead-worker requeue) finds the job's gate
held by another job and parks the row: the job waits again, and the frozen attempt is over.
When that attempt wakes, nothing it writes may land on the parked row (its heartbeat, its retry,
its outcome): the row would end in two states at once (``retrying`` and parked), which no
wake-up and no re-drive takes, and the job would never run again.

The sequence is built step by step, not by timing: the attempt waits on an event instead of
being frozen, and its leases are made to run out by writing them (the lock's key deleted, the
row's lease put in the past).  Real Redis broker and worker, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import dramatiq
from dramatiq import Middleware

import dramatiq_unique
from dramatiq_unique import JobModel, current_job, heartbeat
from dramatiq_unique.parking.groups import whole_actor
from dramatiq_unique.storage.models import utcnow
from tests.helpers import wait_until
from tests.integration.middleware.test_duplicate_delivery import deliver_again


class Processed(Middleware):
    """Message ids whose processing ended, after every other middleware's after-hook
    (added first: Dramatiq runs after-hooks in reverse order)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.lock = threading.Lock()

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None, exception: Any = None) -> None:
        with self.lock:
            self.ids.append(message.message_id)

    def after_skip_message(self, broker: Any, message: Any) -> None:
        with self.lock:
            self.ids.append(message.message_id)

    def count(self, message_id: str) -> int:
        with self.lock:
            return self.ids.count(message_id)


def row(message: Any) -> JobModel:
    return dramatiq_unique.get_job(message.message_id)


def test_an_attempt_taken_over_by_its_parked_delivery_writes_nothing_and_the_job_runs_again(
    suite, broker, worker, redis_client
):
    """Given a while_executing job J whose attempt (token t) lost its lease, two other jobs of
    its key that took the lock after it (the second still holding it), and a second delivery of
    J that parked J's row behind them; when J's attempt wakes, its heartbeat raises LockLost and
    its outcome, with its retry, is refused: J's row stays parked and waiting, and runs J again
    when the lock is handed on."""
    processed = Processed()
    broker.add_middleware(processed, before=type(broker.middleware[0]))
    wake, hold = threading.Event(), threading.Event()
    runs: list[tuple[str, int]] = []

    # A long backoff: the frozen attempt's own retry message does not come due during the test.
    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", unique_ttl=2_000, max_retries=5,
                    min_backoff=600_000, max_backoff=600_000)
    def work(key: str, name: str) -> str:
        runs.append((name, current_job().fencing_token))
        if name == "J" and len(runs) == 1:
            assert wake.wait(30)  # frozen
            heartbeat()  # raises LockLost: another job of its key holds the lock
        if name == "K2":
            assert hold.wait(30)
        return name

    j = work.send("k", "J")
    wait_until(lambda: runs, timeout=15, what="J's first attempt")
    first = row(j)
    assert first.status == "running" and runs == [("J", first.fencing_token)]
    # Its leases run out, as they do while its worker is frozen.
    redis_client.delete(f"redlock:{suite.keys.execution_lock(first.unique_key)}")
    JobModel.update(lease_until=utcnow() - timedelta(seconds=5)).where(JobModel.id == first.id).execute()

    k1 = work.send("k", "K1")
    wait_until(lambda: row(k1).status == "succeeded", timeout=15, what="K1 to run")
    k2 = work.send("k", "K2")
    wait_until(lambda: ("K2", row(k2).fencing_token) in runs, timeout=15, what="K2 to hold the lock")

    deliver_again(broker, j)  # the dead-worker requeue of J's message
    wait_until(lambda: row(j).parked_on is not None, timeout=15, what="J's second delivery to park J")
    parked = row(j)
    assert parked.status == "pending" and parked.attempts == 1

    wake.set()
    wait_until(lambda: processed.count(j.message_id) >= 2, timeout=15, what="J's first attempt to end")
    after = row(j)
    assert (after.status, after.parked_on) == ("pending", parked.parked_on), (
        f"the taken-over attempt wrote over its parked row: {after.status}, parked on {after.parked_on}"
    )
    assert after.fencing_token != first.fencing_token and after.worker != first.worker
    assert after.attempts == 1 and after.lease_until is None

    hold.set()  # K2 ends and hands the lock to the next parked job of the key: J
    wait_until(lambda: row(j).status == "succeeded", timeout=20, what="J to run again")
    done = row(j)
    assert done.result == "J" and done.attempts == 2 and done.parked_on is None
    tokens = [token for name, token in runs]
    assert [name for name, _ in runs] == ["J", "K1", "K2", "J"] and tokens == sorted(tokens)
    assert done.fencing_token == tokens[-1]


def test_a_slot_holder_taken_over_by_its_parked_delivery_writes_nothing_and_the_job_runs_again(
    suite, broker, worker, redis_client
):
    """The same with a concurrency slot, which draws no fencing token: the parked row keeps the
    token of the attempt it took over unless the park moves it on, and then that attempt's
    retry and outcome would land on the parked row."""
    processed = Processed()
    broker.add_middleware(processed, before=type(broker.middleware[0]))
    wake, hold = threading.Event(), threading.Event()
    runs: list[tuple[str, int]] = []

    @dramatiq.actor(track=True, concurrency_limit=1, concurrency_ttl=2_000, unique_ttl=2_000, max_retries=5,
                    min_backoff=600_000, max_backoff=600_000)
    def work(name: str) -> str:
        runs.append((name, current_job().fencing_token))
        if name == "J" and len(runs) == 1:
            assert wake.wait(30)  # frozen
            heartbeat()  # raises LockLost: its slot ran out and another job holds the only one
        if name == "K":
            assert hold.wait(30)
        return name

    j = work.send("J")
    wait_until(lambda: runs, timeout=15, what="J's first attempt")
    first = row(j)
    redis_client.delete(suite.keys.slots(whole_actor("work")))  # its slot's lease ran out
    JobModel.update(lease_until=utcnow() - timedelta(seconds=5)).where(JobModel.id == first.id).execute()

    k = work.send("K")
    wait_until(lambda: ("K", row(k).fencing_token) in runs, timeout=15, what="K to hold the slot")
    deliver_again(broker, j)
    wait_until(lambda: row(j).parked_on is not None, timeout=15, what="J's second delivery to park J")

    wake.set()
    wait_until(lambda: processed.count(j.message_id) >= 2, timeout=15, what="J's first attempt to end")
    after = row(j)
    assert (after.status, after.parked_on) == ("pending", f"slot:{whole_actor('work')}"), (
        f"the taken-over attempt wrote over its parked row: {after.status}, parked on {after.parked_on}"
    )
    assert after.fencing_token > first.fencing_token and after.lease_until is None

    hold.set()
    wait_until(lambda: row(j).status == "succeeded", timeout=20, what="J to run again")
    done = row(j)
    assert done.result == "J" and done.attempts == 2 and [name for name, _ in runs] == ["J", "K", "J"]

"""The tracked jobs a worker fetched, started in one statement (dramatiq_unique.durable.fetched), on real Redis
and PostgreSQL (the only store it starts together)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import dramatiq
import pytest
from dramatiq import Middleware
from dramatiq.middleware import SkipMessage

import dramatiq_unique
from dramatiq_unique.storage import jobs
from tests.helpers import wait_until


@pytest.fixture
def database_url(postgres_either_driver: Any) -> Any:
    """PostgreSQL, the only store whose jobs start together, on either driver."""
    return postgres_either_driver


class Starts:
    """Counts the statements that start jobs: one of its own per job, or one for several fetched jobs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.single = self.together = 0
        self.rows_together: list[int] = []
        start, start_fetched = jobs.start, jobs.start_fetched

        def counted_start(*args: Any, **kwargs: Any) -> Any:
            self.single += 1
            return start(*args, **kwargs)

        def counted_start_fetched(model: Any, rows: Any, worker: str) -> Any:
            self.together += 1
            self.rows_together.append(len(rows))
            return start_fetched(model, rows, worker)

        monkeypatch.setattr(jobs, "start", counted_start)
        monkeypatch.setattr(jobs, "start_fetched", counted_start_fetched)


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> Starts:
    return Starts(monkeypatch)


@pytest.fixture
def workers(make_worker: Any) -> Any:
    """Workers of one thread that fetch ten messages at a time, unless told otherwise."""
    return lambda threads=1, prefetch=10: make_worker(threads, prefetch)


def stop_once_first_ran(worker: dramatiq.Worker, go: threading.Event) -> None:
    """Stop ``worker`` while its one thread runs its first job, which ``go`` lets finish: the others are
    handed back untaken."""
    stopping = threading.Thread(target=worker.stop)
    stopping.start()
    time.sleep(0.2)
    go.set()
    stopping.join(10)


def rows(messages: list[Any]) -> list[Any]:
    return [dramatiq_unique.get_job(m.message_id) for m in messages]


def test_the_jobs_of_a_fetch_start_in_one_statement(suite, broker, workers, starts):
    ran: list[int] = []

    @dramatiq.actor(track=True)
    def job(i: int) -> None:
        ran.append(i)

    messages = [job.send(i) for i in range(12)]
    workers(threads=1, prefetch=10)
    wait_until(lambda: all(r.status == "succeeded" for r in rows(messages)), what="every job succeeded")
    assert sorted(ran) == list(range(12))  # each once
    assert all(r.attempts == 1 and r.started_at <= r.finished_at for r in rows(messages))
    assert starts.together >= 1 and max(starts.rows_together) > 1
    assert starts.single + starts.together < 12 / 2


def test_jobs_with_a_gate_start_on_their_own(suite, broker, workers, starts):
    @dramatiq.actor(unique_args=["i"], unique_lock="while_executing")
    def unique(i: int) -> None:
        pass

    @dramatiq.actor(track=True, concurrency_limit=2)
    def slotted(i: int) -> None:
        pass

    messages = [unique.send(i) for i in range(4)] + [slotted.send(i) for i in range(4)]
    workers(threads=2, prefetch=10)
    wait_until(lambda: all(r.status == "succeeded" for r in rows(messages)), what="every job succeeded")
    assert starts.together == 0 and starts.single == 8


@pytest.mark.parametrize("lock", ["until_executing", "until_executed"])
def test_unique_jobs_without_an_execution_lock_start_together_and_free_their_keys_as_alone(
        suite, broker, workers, starts, lock):
    """An until_executing job's start frees its key (the row's hold in the shared start, the Redis queue lock
    as its thread takes it up); an until_executed job's key stays held until it ends."""
    holds: dict[int, tuple[Any, bool]] = {}

    @dramatiq.actor(actor_name=f"unique_{lock}", unique_args=["i"], unique_lock=lock)
    def unique(i: int) -> None:
        row = type(dramatiq_unique.current_job()).get_by_id(dramatiq_unique.current_job().id)
        holds[i] = (row.unique_hold, bool(broker.client.exists("redlock:" + suite.keys.queue_lock(row.unique_key))))

    messages = [unique.send(i) for i in range(6)]
    workers(threads=1, prefetch=10)
    wait_until(lambda: all(r.status == "succeeded" for r in rows(messages)), what="every job succeeded")
    assert starts.together >= 1 and starts.single + starts.together < 6
    if lock == "until_executed":  # both held while it runs
        assert all(hold is not None and locked for hold, locked in holds.values()), holds
    else:  # the row's hold freed by the start (the Redis lock's release is posted, not waited for)
        assert all(hold is None for hold, _ in holds.values()), holds
    assert all(r.unique_hold is None and r.attempts == 1 for r in rows(messages))
    assert not any(broker.client.exists("redlock:" + suite.keys.queue_lock(r.unique_key)) for r in rows(messages))


def test_a_stopped_worker_puts_the_jobs_it_fetched_and_started_back(suite, broker, workers):
    """Its first job runs while the rest wait, started, in its queue; the worker stops: they are queued
    again, their attempt not counted, and the next worker runs them at once, not after their lease."""
    go = threading.Event()
    ran: list[int] = []

    @dramatiq.actor(track=True)
    def job(i: int) -> None:
        if i == 0:
            go.wait(10)
        ran.append(i)

    messages = [job.send(i) for i in range(5)]
    first = workers(threads=1, prefetch=10)
    wait_until(lambda: sum(r.status == "running" for r in rows(messages)) == 5, what="five rows started")
    stop_once_first_ran(first, go)
    waiting = rows(messages)[1:]
    assert [(r.status, r.attempts, r.worker, r.lease_until) for r in waiting] == [("queued", 0, None, None)] * 4
    assert ran == [0]

    began = time.monotonic()
    workers(threads=1, prefetch=10)
    wait_until(lambda: all(r.status == "succeeded" for r in rows(messages)), what="every job succeeded")
    assert time.monotonic() - began < 10  # the lease is 60 s: nothing waited for it
    assert sorted(ran) == [0, 1, 2, 3, 4] and all(r.attempts == 1 for r in rows(messages))


def test_a_stopped_worker_gives_the_unique_jobs_it_put_back_their_keys(suite, broker, workers):
    """until_executing: the shared start freed each job's key; put back, each holds it again, so a new send of
    the key is a duplicate of the waiting job, as before its worker fetched it."""
    go = threading.Event()

    @dramatiq.actor(unique_args=["i"], unique_lock="until_executing")
    def unique(i: int) -> None:
        if i == 0:
            go.wait(10)

    messages = [unique.send(i) for i in range(4)]
    first = workers(threads=1, prefetch=10)
    wait_until(lambda: all(r.status == "running" and r.unique_hold is None for r in rows(messages)),
               what="four rows started, their keys freed")
    stop_once_first_ran(first, go)
    waiting = rows(messages)[1:]
    assert [(r.status, r.unique_hold) for r in waiting] == [("queued", r.unique_key) for r in waiting]
    again = unique.send(2)
    assert again.message_id == messages[2].message_id  # the waiting job's: a duplicate, skipped

    workers(threads=1, prefetch=10)
    wait_until(lambda: all(r.status == "succeeded" for r in rows(messages)), what="every job succeeded")
    assert all(r.attempts == 1 and r.unique_hold is None for r in rows(messages))


class SkipOdd(Middleware):
    """Refuses the odd jobs before the suite's start, as AgeLimit refuses an old message."""

    def before_process_message(self, broker: Any, message: Any) -> None:
        if message.args and message.args[0] % 2:
            raise SkipMessage("odd")


@pytest.mark.parametrize("options", [dict(track=True), dict(unique_args=["i"], unique_lock="until_executing")],
                         ids=["tracked", "until_executing"])
def test_a_job_a_middleware_refuses_before_its_start_is_not_left_running(suite, broker, workers, options):
    broker.middleware.insert(0, SkipOdd())
    ran: list[int] = []

    @dramatiq.actor(**options)
    def job(i: int) -> None:
        ran.append(i)

    messages = [job.send(i) for i in range(8)]
    workers(threads=1, prefetch=10)
    wait_until(lambda: all(r.status in ("succeeded", "failed") for r in rows(messages)), what="all finished")
    assert sorted(ran) == [0, 2, 4, 6]
    for i, row in enumerate(rows(messages)):
        assert (row.status, row.attempts, row.unique_hold) == (("failed", 0) if i % 2 else ("succeeded", 1)) + (None,)


def test_a_copy_fetched_beside_its_job_runs_once(suite, broker, workers, starts):
    runs: list[str] = []

    @dramatiq.actor(track=True)
    def job(i: int) -> None:
        runs.append(dramatiq_unique.current_job().message_id)
        time.sleep(0.2)

    messages = [job.send(i) for i in range(4)]
    copy = messages[1].copy(options={"redis_message_id": str(uuid.uuid4())})
    broker.do_enqueue(copy.queue_name, copy.options["redis_message_id"], copy.encode())
    workers(threads=2, prefetch=10)
    wait_until(lambda: all(r.status == "succeeded" for r in rows(messages)), what="every job succeeded")
    time.sleep(0.5)
    assert sorted(runs) == sorted(m.message_id for m in messages)
    assert rows(messages)[1].attempts == 1


def test_a_job_taken_up_after_half_its_lease_renews_it(suite, broker, workers):
    """Its fetch started it; it waited behind a job for longer than its whole lease, and still runs
    once, under a lease counted from when its thread took it up."""
    seen: dict[int, Any] = {}

    @dramatiq.actor(track=True, unique_ttl=1_000)
    def job(i: int) -> None:
        row = dramatiq_unique.current_job()
        seen[i] = (row.lease_until, row.started_at)
        if i == 0:
            time.sleep(1.5)

    messages = [job.send(i) for i in range(3)]
    workers(threads=1, prefetch=10)
    wait_until(lambda: all(r.status == "succeeded" for r in rows(messages)), what="every job succeeded")
    first, second = rows(messages)[:2]
    assert second.attempts == 1 and second.last_error is None
    lease_until, started_at = seen[1]
    assert started_at >= first.started_at and (started_at - first.started_at).total_seconds() >= 1.4
    assert (lease_until - started_at).total_seconds() == pytest.approx(1.0, abs=0.05)

"""Many threads' starts, outcomes and sends at once on a real PostgreSQL: each gets the verdict its own
statement gives alone (a duplicate refused, a fenced-out attempt refused, one holder of a key)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Callable

import dramatiq
import peewee as pw
import pytest

from dramatiq_unique import JobModel
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobStatus, utcnow
from tests.helpers import current_token, wait_until


@pytest.fixture(params=["postgres"])
def database_url(request) -> str:
    return request.getfixturevalue("pg_url")


def at_once(count: int, fn: Callable[[int], Any]) -> list[Any]:
    """``fn(i)`` for each i in as many threads, started together; their results (or errors)."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn(i)
        except Exception as e:  # noqa: BLE001 - compared by the test
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    JobModel._meta.database.close()
    return results


def rows(count: int, key: Any = None) -> list[int]:
    out = []
    for i in range(count):
        row_id, _, _ = jobs.adopt(JobModel, {"message_id": f"m{i}", "actor_name": "a", "queue_name": "default",
                                             "unique_key": key(i) if key else None})
        out.append(row_id)
    return out


def start(row_id: int, fence_key: Any = None, worker_name: str = "w") -> Any:
    try:
        return jobs.start(JobModel, row_id, revision=0, lease_ms=60_000, worker=worker_name, release_hold=True,
                          fence_key=fence_key)
    finally:
        JobModel._meta.database.close()


def test_many_threads_start_their_rows_at_once_each_with_its_row(suite):
    ids = rows(24)
    started = at_once(24, lambda i: start(ids[i]))
    assert [job.message_id for job in started] == [f"m{i}" for i in range(24)]
    assert all(job.fencing_token == 1 and job.attempts == 1 for job in started)
    assert JobModel.select().where(JobModel.status == JobStatus.RUNNING.value).count() == 24


def test_a_message_delivered_twice_at_once_starts_once(suite):
    ids = rows(8)
    started = at_once(16, lambda i: start(ids[i % 8], worker_name=f"w{i}"))
    for row_id in ids:
        winners = [job for job in started if job is not None and job.message_id == f"m{ids.index(row_id)}"]
        assert len(winners) == 1
    assert sum(job is None for job in started) == 8
    assert all(row.attempts == 1 for row in JobModel.select())


def test_attempts_of_two_keys_at_once_are_each_fenced(suite):
    """Two keys, each started three times over in a thread of its own: each start draws its key's next
    token, and only the newest attempt of a key may write its outcome (the older ones were fenced out by
    the newer ones' draws).  Starts of one key whose statements overlap can only happen past a lease (the
    execution lock serializes them): guarantees.md says what fencing promises then."""
    ids = rows(6, key=lambda i: f"k{i % 2}")
    per_key = at_once(2, lambda k: [start(ids[i], fence_key=f"k{k}") for i in range(k, 6, 2)])
    for k, mine in enumerate(per_key):
        assert [job.fencing_token for job in mine] == [1, 2, 3]
        outcomes = {job.fencing_token: jobs.finish(JobModel, job, release_hold=False, status="succeeded")
                    for job in mine}
        assert outcomes == {1: False, 2: False, 3: True}
        assert current_token(JobModel._meta.database, f"k{k}") == 3


def test_outcomes_of_many_threads_at_once_keep_their_history(suite):
    ids = rows(20)
    started = [start(row_id) for row_id in ids]
    zombie = started[0]
    jobs.start(JobModel, ids[0], revision=0, lease_ms=60_000, worker="w", release_hold=True)  # lease live: refused
    JobModel.update(fencing_token=JobModel.fencing_token + 1).where(JobModel.id == ids[0]).execute()  # fenced out

    def finish(i: int) -> bool:
        try:
            fields = ({"status": "succeeded", "result": {"n": i}, "finished_at": utcnow()} if i % 2 else
                      {"status": "retrying", "last_error": "boom", "enqueued_at": None})
            return jobs.finish(JobModel, started[i], release_hold=True, lease_until=None, **fields)
        finally:
            JobModel._meta.database.close()

    written = at_once(20, finish)
    assert written == [False] + [True] * 19
    assert zombie.id == ids[0]
    for i, row in enumerate(JobModel.select().order_by(JobModel.id)):
        if i == 0:
            assert row.status == "running" and row.history is None
            continue
        assert row.lease_until is None and row.unique_hold is None
        assert [entry["status"] for entry in row.history] == ["succeeded" if i % 2 else "retrying"]
        assert (row.status, row.result, row.last_error) == (("succeeded", {"n": i}, None) if i % 2 else
                                                            ("retrying", None, "boom"))
        assert row.finished_at is not None if i % 2 else row.finished_at is None


def test_sends_of_many_threads_at_once_and_a_hold_goes_to_one(suite):
    def send(i: int) -> Any:
        try:
            return jobs.insert_or_holder(JobModel, {"message_id": f"s{i}", "actor_name": "a", "queue_name": "default",
                                                    "unique_key": "u", "unique_hold": "u" if i % 2 else f"u{i}"},
                                         read_holder=i % 4 == 1)
        finally:
            JobModel._meta.database.close()

    results = at_once(16, send)
    held = [results[i] for i in range(1, 16, 2)]
    inserted = [r for r in held if not isinstance(r, Exception) and r[0] is not None]
    assert len(inserted) == 1  # one send holds "u"; the others met it (a holder, or a plain INSERT's clash)
    for i, result in enumerate(results):
        if i % 2 == 0:
            assert result[0] is not None and result[1] is None
        elif result is not inserted[0] and i % 4 != 1:
            assert isinstance(result, pw.IntegrityError)
        elif result is not inserted[0]:  # the holder, or none if it committed after the statement began
            assert result[0] is None and (result[1] is None or result[1].message_id != f"s{i}")
    assert JobModel.select().count() == 9


def test_copies_of_messages_delivered_to_a_worker_at_once_run_once(suite, broker, make_worker):
    """Each message three times in the queue, eight worker threads: every copy's start but the first is
    refused; every job runs once and succeeds."""
    runs: dict[int, int] = {}
    lock = threading.Lock()

    @dramatiq.actor(actor_name="grouped_once", track=True)
    def once(n: int) -> None:
        with lock:
            runs[n] = runs.get(n, 0) + 1

    for n in range(12):
        message = once.send(n)
        for _ in range(2):
            copy = message.copy(options={"redis_message_id": str(uuid.uuid4())})
            broker.do_enqueue(message.queue_name, copy.options["redis_message_id"], copy.encode())
    make_worker(threads=8)
    model = suite.actors["grouped_once"].model
    wait_until(lambda: model.select().where(model.status == "succeeded").count() == 12, timeout=30)
    time.sleep(2)  # the copies' time to run, would they
    assert runs == {n: 1 for n in range(12)}
    assert all(row.attempts == 1 for row in model.select())

"""The group commit's hand-over (storage/writer.py), with no database: who leads, who waits, what a batch
takes, and what each thread gets back."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import pytest

from dramatiq_unique.storage import writer


class Recorder:
    """A batch function that records its batches and answers each request doubled."""

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[Any]] = []
        self.fail = fail

    def __call__(self, requests: list[Any]) -> list[Any]:
        self.batches.append(list(requests))
        if self.fail:
            raise OSError("lost the server")
        return [request["n"] * 2 for request in requests]


def make(batch: Callable, **kwargs: Any) -> writer.Writer:
    return writer.Writer(batch=batch, keys=lambda request: (request["key"],), **kwargs)


def blocked_leader(made: writer.Writer) -> tuple[threading.Event, threading.Event, threading.Thread]:
    """A thread that leads alone and holds its statement until released: others queue behind it."""
    inside, release = threading.Event(), threading.Event()

    def alone() -> str:
        inside.set()
        release.wait(10)
        return "leader"

    thread = threading.Thread(target=made.write, args=({"n": -1, "key": "leader"}, alone))
    thread.start()
    assert inside.wait(10)
    return inside, release, thread


def queue_up(made: writer.Writer, requests: list[dict], alone: Callable[[dict], Any] = lambda r: ("alone", r["n"])):
    results: dict[int, Any] = {}

    def run(i: int, request: dict) -> None:
        try:
            results[i] = made.write(request, lambda: alone(request))
        except Exception as e:  # noqa: BLE001 - compared by the test
            results[i] = e

    threads = [threading.Thread(target=run, args=(i, r)) for i, r in enumerate(requests)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while len(made._queue) < len(requests) and time.monotonic() < deadline:
        time.sleep(0.001)
    return results, threads


def test_a_thread_alone_writes_its_own_statement_at_once():
    recorder = Recorder()
    made = make(recorder)
    began = time.monotonic()
    assert made.write({"n": 1, "key": 1}, lambda: "mine") == "mine"
    assert time.monotonic() - began < 0.05  # no wait for company
    assert recorder.batches == [] and not made._busy
    with pytest.raises(ValueError):
        made.write({"n": 1, "key": 1}, lambda: (_ for _ in ()).throw(ValueError("its own error")))
    assert not made._busy


def test_requests_queued_behind_a_write_go_as_one_batch_each_with_its_verdict():
    recorder = Recorder()
    made = make(recorder, wait_ms=10_000)
    _, release, leader = blocked_leader(made)
    results, threads = queue_up(made, [{"n": n, "key": n} for n in range(5)])
    release.set()
    for thread in [leader, *threads]:
        thread.join(10)
    assert len(recorder.batches) == 1 and sorted(r["n"] for r in recorder.batches[0]) == list(range(5))
    assert results == {n: n * 2 for n in range(5)}
    assert (made.tally.batches, made.tally.rows, made.tally.alone) == (1, 5, 1)  # the leader's own
    assert not made._busy and made._queue == []


def test_a_key_twice_goes_in_the_next_batch_in_its_order():
    recorder = Recorder()
    made = make(recorder, wait_ms=10_000)
    _, release, leader = blocked_leader(made)
    requests = [{"n": 1, "key": "a"}, {"n": 2, "key": "b"}, {"n": 3, "key": "a"}, {"n": 4, "key": "c"},
                {"n": 5, "key": "a"}]
    order: list[int] = []

    def alone(request: dict) -> Any:
        order.append(request["n"])
        return ("alone", request["n"])

    results, threads = [], []
    for request in requests:  # queued in this order
        got, started = queue_up(made, [request], alone)
        results.append(got)
        threads += started
    release.set()
    for thread in [leader, *threads]:
        thread.join(10)
    assert recorder.batches == [[requests[0], requests[1], requests[3]]]
    assert order == [3, 5]  # each after the batch before it: a batch of one is its own statement
    assert [got[0] for got in results] == [2, 4, ("alone", 3), 8, ("alone", 5)]


def test_a_batch_that_fails_leaves_each_thread_its_own_statement_and_error():
    recorder = Recorder(fail=True)
    made = make(recorder, wait_ms=10_000)
    _, release, leader = blocked_leader(made)

    def alone(request: dict) -> Any:
        if request["n"] % 2:
            raise ConnectionError(f"own error {request['n']}")
        return ("alone", request["n"])

    results, threads = queue_up(made, [{"n": n, "key": n} for n in range(4)], alone)
    release.set()
    for thread in [leader, *threads]:
        thread.join(10)
    assert len(recorder.batches) == 1 and made.tally.failed == 1
    assert results[0] == ("alone", 0) and results[2] == ("alone", 2)
    assert [str(results[n]) for n in (1, 3)] == ["own error 1", "own error 3"]
    assert not made._busy


def test_a_queued_request_waits_at_most_its_bound_then_writes_alone():
    recorder = Recorder()
    made = make(recorder, wait_ms=20)
    _, release, leader = blocked_leader(made)
    began = time.monotonic()
    assert made.write({"n": 1, "key": 1}, lambda: "alone") == "alone"
    waited = time.monotonic() - began
    release.set()
    leader.join(10)
    assert 0.015 <= waited < 1.0
    assert made.tally.alone == 2 and recorder.batches == [] and made._queue == []  # the leader's, and its own


def test_a_batch_takes_at_most_max_rows_and_the_rest_lead_the_next():
    recorder = Recorder()
    made = make(recorder, wait_ms=10_000, max_rows=3)
    _, release, leader = blocked_leader(made)
    results, threads = queue_up(made, [{"n": n, "key": n} for n in range(7)])
    release.set()
    for thread in [leader, *threads]:
        thread.join(10)
    sizes = [len(batch) for batch in recorder.batches]
    assert sizes[:2] == [3, 3] and sum(sizes) <= 7  # the last one alone runs its own statement
    assert all(results[n] in (n * 2, ("alone", n)) for n in range(7))
    assert not made._busy


def test_a_queued_thread_interrupted_before_a_batch_took_it_leaves_the_queue():
    made = make(Recorder(), wait_ms=10_000)
    _, release, leader = blocked_leader(made)
    slot = writer._Slot({"n": 1, "key": 1}, lambda: None, (1,))
    made._queue.append(slot)

    class Interrupted(BaseException):
        pass

    class Gate:
        def acquire(self, timeout: Any = None) -> bool:
            raise Interrupted

    slot.gate = Gate()
    with pytest.raises(Interrupted):
        made._follow(slot)
    assert made._queue == []
    release.set()
    leader.join(10)
    assert not made._busy


def test_groupable_only_on_postgres_own_connections_outside_a_transaction():
    import peewee as pw

    assert not writer.groupable(pw.SqliteDatabase(":memory:"))
    db = pw.PostgresqlDatabase("x")
    assert writer.groupable(db)

    class Borrowed(pw.PostgresqlDatabase):
        def connection(self) -> Any:
            return None

    assert not writer.groupable(Borrowed("x"))


def test_a_forked_child_starts_with_fresh_writers():
    import os

    made = writer.of(test_a_forked_child_starts_with_fresh_writers, "kind", lambda: make(Recorder()))
    made._lock.acquire()  # held by a thread of the parent as it forks
    try:
        pid = os.fork()
        if pid == 0:  # the child
            fresh = writer.of(test_a_forked_child_starts_with_fresh_writers, "kind", lambda: make(Recorder()))
            os._exit(0 if fresh is not made and fresh.write({"n": 1, "key": 1}, lambda: 7) == 7 else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        made._lock.release()

"""The deck hand-over verifies before it delivers.

A row reserved on deck (dramatiq_unique.parking.lot) is started in the database, by a compare-and-set on
what the reservation read (revision, reservation owner, broker id, fencing token),
before its message is delivered: a row replaced, or taken by another process, while it
waited on deck is not delivered from the deck, and no fencing token goes to two attempts.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import dramatiq
import pytest

import dramatiq_unique
from dramatiq_unique import JobModel
from dramatiq_unique.parking import lot
from dramatiq_unique.slots.gate import gate_of
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import after_ms, utcnow
from tests.helpers import wait_until
from tests.integration.parking.helpers import reserved
from tests.integration.slots.helpers import rows


class Runs:
    """Every actor call: (label, row id, fencing token), from any worker thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[Any, int, int]] = []

    def add(self, label: Any) -> None:
        job = dramatiq_unique.current_job()
        with self.lock:
            self.calls.append((label, job.id, job.fencing_token))

    def labels(self) -> list[Any]:
        with self.lock:
            return [c[0] for c in self.calls]

    def assert_tokens_distinct(self) -> None:
        with self.lock:
            attempts = [(row_id, token) for _, row_id, token in self.calls]
        assert len(set(attempts)) == len(attempts), f"a fencing token went to two attempts: {self.calls}"


def queue_behind_a_holder(make_worker: Any, actor: Any, runs: Runs, waiting: int) -> None:
    """A worker of four threads; job 0 holds the group's one slot (its actor waits to be released),
    jobs 1..``waiting`` queue behind it, as many of them on deck as fit."""
    make_worker(4)
    actor.send(0)
    wait_until(lambda: runs.labels() == [0], timeout=10, what="the holder to start")
    for i in range(1, waiting + 1):
        actor.send(i)
    on_deck = min(waiting, lot.DEPTH)
    wait_until(lambda: len(reserved(actor.actor_name)) == on_deck, timeout=10, what=f"{on_deck} rows on deck")


def only_job_2_ran(runs: Runs, taken: list[int]) -> None:
    """Jobs 0 and 2 of actor ``late`` ran, job 2 to its outcome; job 1, taken over (``taken``) by
    "another attempt" while it waited, did not run here and its row is that attempt's."""
    wait_until(lambda: 2 in runs.labels(), timeout=15, what="job 2 to run")
    wait_until(lambda: JobModel.get_by_id(rows("late")[2].id).status == "succeeded", timeout=10, what="job 2's outcome")
    assert sorted(runs.labels()) == [0, 2] and len(taken) == 1
    row = JobModel.get_by_id(taken[0])
    assert (row.status, row.worker) == ("running", "elsewhere:1:1")


def test_a_job_replaced_on_deck_runs_its_new_arguments_once(suite, broker, make_worker):
    """Given a holder running and two jobs reserved on deck behind it (limit 1, ``replace``), When the first
    is replaced while on deck, Then it runs once, with the new arguments, and records their result; the
    replaced arguments never run; each attempt has its own fencing token."""
    runs, release = Runs(), threading.Event()

    @dramatiq.actor(concurrency_limit=1, unique_args=["key"], unique_lock="until_executed",
                    unique_on_conflict="replace", max_retries=0)
    def edit(key: str, version: int) -> int:
        runs.add((key, version))
        if key == "holder":
            release.wait(20)
        return version

    make_worker(4)
    edit.send("holder", 0)
    wait_until(lambda: runs.labels() == [("holder", 0)], timeout=10, what="the holder to start")
    edit.send("a", 1)
    edit.send("b", 1)
    wait_until(lambda: len(reserved("edit")) == lot.DEPTH, timeout=10, what="two rows on deck")
    edit.send("a", 2)  # replaces a's arguments while a waits on deck
    wait_until(lambda: [r.args for r in rows("edit") if r.unique_key and r.args[0] == "a"] == [["a", 2]],
               timeout=5, what="the replace")
    release.set()
    wait_until(lambda: {("a", 2), ("b", 1)} <= set(runs.labels()), timeout=15, what="a and b to run")
    wait_until(lambda: all(r.status == "succeeded" for r in rows("edit")), timeout=10, what="outcomes")
    assert sorted(runs.labels()) == [("a", 2), ("b", 1), ("holder", 0)], runs.calls
    runs.assert_tokens_distinct()
    found = {r.args[0]: r for r in rows("edit")}
    assert len(found) == 3 == len(rows("edit"))
    assert (found["a"].result, found["a"].attempts) == (2, 1)


def test_a_reserved_row_another_process_took_is_not_delivered_from_the_deck(suite, broker, make_worker):
    """Given two jobs reserved on deck behind a holder, When another process takes the first (as after this
    one stalled past the reservation, or with its clock ahead) and starts it, Then this process, when its
    holder ends, does not run that job from its deck, leaves its row to the other attempt, and runs the
    next one; no fencing token goes to two attempts."""
    runs, release = Runs(), threading.Event()

    @dramatiq.actor(concurrency_limit=1, max_retries=0)
    def step(i: int) -> None:
        runs.add(i)
        if i == 0:
            release.wait(20)

    queue_behind_a_holder(make_worker, step, runs, 2)
    first = min(reserved("step"), key=lambda r: r.id)
    assert first.args == [1]
    # The reservation ran out (as the other process sees it), and the other process claims and starts it.
    JobModel.update(lease_until=after_ms(-60_000)).where(JobModel.id == first.id).execute()
    group = first.parked_on
    other = jobs.claim_parked(JobModel, group, "created_at", utcnow(), "other-ref",
                                     (after_ms(60_000), "elsewhere:1:woken", False), app=suite.app)
    assert other is not None and other.id == first.id and other.status == "running"
    release.set()
    wait_until(lambda: 2 in runs.labels(), timeout=15, what="job 2 to run")
    wait_until(lambda: JobModel.get_by_id(rows("step")[2].id).status == "succeeded", timeout=10, what="job 2's outcome")
    assert sorted(runs.labels()) == [0, 2], runs.calls
    runs.assert_tokens_distinct()
    row = JobModel.get_by_id(first.id)
    assert (row.status, row.worker, row.fencing_token, row.attempts) == (
        "running", "elsewhere:1:woken", other.fencing_token, 1)


def test_a_hand_over_whose_slot_cannot_pass_gives_the_row_back_unstarted(suite, broker, make_worker, monkeypatch):
    """Given a row on deck, When its start is written but the slot cannot be passed (the holder's slot ran out),
    Then the start is undone (parked again, no attempt counted) and the job still runs once, later."""
    runs, release = Runs(), threading.Event()
    from dramatiq_unique.slots.gate import SlotGate

    passed = SlotGate.pass_and_deliver
    refused: list[int] = []

    def refuse_once(self, *args, **kwargs):
        if not refused:
            refused.append(1)
            return False
        return passed(self, *args, **kwargs)

    monkeypatch.setattr(SlotGate, "pass_and_deliver", refuse_once)

    @dramatiq.actor(concurrency_limit=1, max_retries=0)
    def once(i: int) -> None:
        runs.add(i)
        if i == 0:
            release.wait(20)

    queue_behind_a_holder(make_worker, once, runs, 1)
    release.set()
    wait_until(lambda: sorted(runs.labels()) == [0, 1], timeout=15, what="job 1 to run")
    wait_until(lambda: all(r.status == "succeeded" for r in rows("once")), timeout=10, what="outcomes")
    assert refused == [1]
    runs.assert_tokens_distinct()
    assert [r.attempts for r in rows("once")] == [1, 1]


def parked_rows(actor_name: str) -> list[JobModel]:
    """The actor's rows that wait parked on a group (reserved for a deck or not)."""
    return [r for r in rows(actor_name) if r.parked_on and r.status == "pending"]


def _state(suite: Any, actor_name: str, group: str) -> str:
    """What a failed wait saw: the rows (status, worker, lease, parked_on), the group's slot holders and the
    wake-up flags in Redis, with the database's and Redis's clocks to judge the leases by."""
    import redis

    from tests.conftest import REDIS_URL

    client = redis.Redis.from_url(REDIS_URL)
    db = JobModel._meta.database
    lines = [f"db now {db.execute_sql(f'SELECT {jobs.db_now(db)}').fetchone()[0]}; redis {client.time()}"]
    for r in rows(actor_name):
        lines.append(f"row {r.id} args={r.args} status={r.status} worker={r.worker} lease_until={r.lease_until} "
                     f"parked_on={r.parked_on} attempts={r.attempts} ref={r.broker_ref}")
    lines.append(f"slot {group}: {client.zrange(gate_of(suite)._keys(group)[0], 0, -1, withscores=True)}")
    lines.append(f"flags: {client.zrange(suite.keys.wakeups(), 0, -1, withscores=True)}")
    return "\n".join(lines)


def test_a_worker_stopped_with_rows_on_deck_does_not_run_them_when_it_resumes(suite, broker, database_url, key_prefix,
                                                                              tmp_path):
    """Given a worker process holding a group's slot (limit 1) with two rows reserved on its deck, When it is
    SIGSTOPped past its slot's and its reservations' leases, another process takes the group over and runs
    every waiting job, and the first is SIGCONTed, Then the first does not run the rows it had reserved: every
    job ran exactly once, and every row records one successful attempt."""
    from tests.conftest import REDIS_URL
    from tests.slots_app import Tally, WorkerProcess, declare

    declare(REDIS_URL, key_prefix, limit=1, ttl=3_000)
    job = broker.get_actor("slot_job")
    tally = Tally(REDIS_URL, key_prefix)
    env = dict(redis_url=REDIS_URL, namespace=broker.namespace, database_url=database_url, key_prefix=key_prefix,
               limit=1, ttl=3_000, threads=4, debug=True)
    first = WorkerProcess(**env, stderr_path=tmp_path / "first.err")
    second = None
    stopped: list[int] = []
    try:
        job.send("t", 0, run_ms=1_500)
        wait_until(lambda: tally.log(), timeout=30, interval=0.05, what="the holder to start")
        for i in range(1, 5):
            job.send("t", i, run_ms=50)
        # Every waiting job parked (its row pending on the group), not just the two on deck: a message the
        # first process has fetched but not parked yet is that process's until it resumes (Dramatiq's Redis
        # broker hands a silent consumer's messages back only after its heartbeat timeout, a minute, and the
        # re-drive is off here), so stopping it then strands that job whatever the suite does.
        wait_until(lambda: len(parked_rows("slot_job")) == 4 and len(reserved("slot_job")) == lot.DEPTH,
                   timeout=10, what="every waiting job parked, two on deck")
        on_deck = {r.args[1] for r in reserved("slot_job")}
        group = reserved("slot_job")[0].parked_on
        (pid,) = first.children()
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)
        second = WorkerProcess(**env, stderr_path=tmp_path / "second.err")
        # Bound: the second process boots, then the holder's slot lease and the deck reservations (3 s each,
        # both begun before the stop) run out, its watchdog looks within 0.5 s and the four 50 ms jobs run:
        # about 4 s after its boot (3.4-3.7 s seen on a loaded 2-core machine, boot included); the rest of
        # the 30 s is for a slow boot.
        try:
            wait_until(lambda: {e[2] for e in tally.log() if e[0] == "end"} >= {1, 2, 3, 4}, timeout=30,
                       interval=0.1, what="the second process to run the waiting jobs")
        except AssertionError:
            print(_state(suite, "slot_job", group), "\nlog", tally.log(), "\nstopped", pid, "second", second.children(),
                  f"\nthe workers' stderr (debug log): {tmp_path}")
            raise
        os.kill(pid, signal.SIGCONT)
        stopped.clear()
        wait_until(lambda: tally.ended() == 5, timeout=15, interval=0.1, what="the holder to end")
        wait_until(lambda: all(r.status == "succeeded" for r in rows("slot_job")), timeout=15, interval=0.1,
                   what="every outcome")
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        err = first.stop()
        if second is not None:
            err += second.stop()
    starts = sorted(e[2] for e in tally.log() if e[0] == "start")
    assert starts == [0, 1, 2, 3, 4], err[-3000:]
    assert all(e[4] != pid for e in tally.log() if e[0] == "start" and e[2] in on_deck)
    assert [r.attempts for r in rows("slot_job")] == [1] * 5


def test_replaces_racing_hand_overs_never_run_stale_arguments(suite, broker, make_worker):
    """Given one slot (limit 1) and ten keys (``replace``), When jobs are sent and replaced over and over while
    jobs pass the slot on, many through the deck, Then every job row runs exactly once, with the arguments
    its row holds (the last replace it took before it started), and each attempt has its own fencing token."""
    runs = Runs()

    @dramatiq.actor(concurrency_limit=1, unique_args=["key"], unique_lock="until_executed",
                    unique_on_conflict="replace", max_retries=0)
    def churn(key: str, version: int) -> int:
        runs.add((key, version))
        time.sleep(0.003)
        return version

    make_worker(4)
    version = 0
    for _ in range(12):
        for k in range(10):
            version += 1
            churn.send(f"k{k}", version)
        time.sleep(0.01)
    wait_until(lambda: all(r.status == "succeeded" for r in rows("churn")), timeout=30, interval=0.1,
               what="every job to run")
    found = rows("churn")
    by_row: dict[int, list] = {}
    for label, row_id, _ in runs.calls:
        by_row.setdefault(row_id, []).append(label)
    assert sorted(by_row) == [r.id for r in found], "a job ran twice, or not at all"
    for r in found:
        assert by_row[r.id] == [(r.args[0], r.args[1])], (r.id, r.args, by_row[r.id])
        assert (r.result, r.attempts) == (r.args[1], 1)
    runs.assert_tokens_distinct()


def test_reservations_run_by_the_database_clock_not_by_a_skewed_waker(suite, broker):
    """Given a row reserved by another process for a minute, When a waker whose clock runs two minutes ahead
    looks for the group's next job, Then it does not take the reserved row (a reservation is judged by the
    database's clock, not by each process's), and its "ms until a reservation runs out" is about a minute."""

    @dramatiq.actor(concurrency_limit=1)
    def job(i: int) -> None:
        pass

    group = "slot:job:all"
    JobModel.create(message_id="m0", actor_name="job", queue_name="default", args=[0], status="pending",
                    parked_on=group, created_at=after_ms(-10_000), app=suite.app)
    info = gate_of(suite).describe(group)
    assert jobs.reserve(info.model, group, info.order_by, "elsewhere:1:deck", 60_000, app=suite.app)
    ahead = after_ms(120_000)
    assert jobs.claim_parked(JobModel, group, "created_at", ahead, "ref", app=suite.app) is None
    assert 50_000 < lot.waiting_in(info, group, app=suite.app) <= 60_000


def test_a_job_started_ahead_and_picked_up_late_runs_under_that_start(suite, broker, make_worker, monkeypatch):
    """Given jobs started ahead of their delivery (from the deck, or by their claim), When their pick-up comes
    late (the slot reservation no longer counts as fresh), Then each runs under the start written for it, once
    its row shows no other attempt took over: one attempt each, one token per attempt, all succeeded."""
    monkeypatch.setattr(dramatiq_unique.ConcurrencySlots, "_fresh_here", lambda self, wake, ttl: False)
    runs, release = Runs(), threading.Event()

    @dramatiq.actor(concurrency_limit=1, max_retries=0)
    def late(i: int) -> None:
        runs.add(i)
        if i == 0:
            release.wait(20)

    queue_behind_a_holder(make_worker, late, runs, 4)
    release.set()
    wait_until(lambda: sorted(runs.labels()) == [0, 1, 2, 3, 4], timeout=15, what="every job to run")
    wait_until(lambda: all(r.status == "succeeded" for r in rows("late")), timeout=10, what="outcomes")
    assert [r.attempts for r in rows("late")] == [1] * 5
    runs.assert_tokens_distinct()
    assert all(r.worker.endswith(":woken") for r in rows("late")[1:])


def test_a_job_taken_over_before_its_late_pick_up_is_not_run(suite, broker, make_worker, monkeypatch):
    """Given a job started ahead of its delivery and picked up late, When another attempt took the job over in
    between (a newer token on its row), Then the late pick-up does not run it and writes nothing; the slot goes
    on to the next job, which runs."""
    cls = dramatiq_unique.ConcurrencySlots
    monkeypatch.setattr(cls, "_fresh_here", lambda self, wake, ttl: False)
    still_ours = cls._still_ours
    taken: list[int] = []

    def overtaken(self, config, message, group, token, started):
        if message.args == (1,):  # another attempt starts job 1 meanwhile
            JobModel.update(fencing_token=JobModel.fencing_token + 1, worker="elsewhere:1:1").where(
                JobModel.id == started.id).execute()
            taken.append(started.id)
        return still_ours(self, config, message, group, token, started)

    monkeypatch.setattr(cls, "_still_ours", overtaken)
    runs, release = Runs(), threading.Event()

    @dramatiq.actor(concurrency_limit=1, max_retries=0)
    def late(i: int) -> None:
        runs.add(i)
        if i == 0:
            release.wait(20)

    queue_behind_a_holder(make_worker, late, runs, 2)
    release.set()
    only_job_2_ran(runs, taken)


@pytest.mark.parametrize("path", ["deck", "claim"])
def test_a_start_ahead_whose_reply_came_late_does_not_run_a_job_taken_over_meanwhile(
        suite, broker, make_worker, monkeypatch, path):
    """Given a job started ahead of its delivery, from the deck or by its claim, When the start's reply
    comes late (a stalled link: longer than the fresh tenth of the slot's lease) and another attempt took
    the job over in between, Then the woken job does not run, however soon after the reply it is picked
    up: its reservation counts from before the start was asked for.  The next job runs."""
    name = "start_reserved" if path == "deck" else "claim_parked"
    real = getattr(jobs, name)
    taken: list[int] = []

    def late_reply(*args, **kwargs):
        row = real(*args, **kwargs)
        if row is not None and row.args == [1] and row.status == "running":
            JobModel.update(fencing_token=JobModel.fencing_token + 1, worker="elsewhere:1:1").where(
                JobModel.id == row.id).execute()
            taken.append(row.id)
            time.sleep(0.3)
        return row

    monkeypatch.setattr(jobs, name, late_reply)
    if path == "claim":
        lot.of(suite).ondeck.enabled = False
    runs, release = Runs(), threading.Event()

    @dramatiq.actor(concurrency_limit=1, concurrency_ttl=1_000, max_retries=0)
    def late(i: int) -> None:
        runs.add(i)
        while i == 0 and not release.wait(0.1):
            dramatiq_unique.heartbeat()

    make_worker(4)
    late.send(0)
    wait_until(lambda: runs.labels() == [0], timeout=10, what="the holder to start")
    late.send(1)
    late.send(2)
    if path == "deck":
        wait_until(lambda: len(reserved("late")) == 2, timeout=10, what="2 rows on deck")
    else:
        wait_until(lambda: [r.status for r in rows("late")] == ["running", "pending", "pending"], timeout=10,
                   what="2 parked jobs")
    release.set()
    only_job_2_ran(runs, taken)


def test_a_slot_whose_grant_came_after_its_lease_is_not_used(suite, broker, make_worker, monkeypatch):
    """Given a group of one slot leased for 0.5 s, When a job's grant of the slot comes back after the
    lease ran out (a stalled link) and another job took the slot meanwhile, Then the late job does not
    run beside it: it waits its turn and runs after, once; the two runs never overlap."""
    gate = gate_of(suite)
    real = type(gate).enter
    spans: list[tuple[int, float, float]] = []
    lock = threading.Lock()

    @dramatiq.actor(concurrency_limit=1, concurrency_ttl=500, max_retries=0)
    def one(i: int) -> None:
        began = time.monotonic()
        for _ in range(30 if i == 2 else 0):  # longer than the lease, which it keeps
            time.sleep(0.1)
            dramatiq_unique.heartbeat()
        with lock:
            spans.append((i, began, time.monotonic()))

    def late_grant(self, group, token, ttl, limit, reserved=None, own=None):
        entered = real(self, group, token, ttl, limit, reserved, own)
        if entered[0] and not spans and threading.current_thread().name != "late" and not late_grant.done:
            late_grant.done = True
            one.send(2)  # takes the slot once this grant's lease has run out
            time.sleep(2.0)
        return entered

    late_grant.done = False
    monkeypatch.setattr(type(gate), "enter", late_grant)
    make_worker(4)
    one.send(1)
    wait_until(lambda: len(spans) == 2, timeout=20, what="both jobs to run")
    (a, a0, a1), (b, b0, b1) = sorted(spans, key=lambda s: s[1])
    assert (a, b) == (2, 1) and a1 <= b0, f"runs overlapped: {spans}"
    wait_until(lambda: [r.status for r in rows("one")] == ["succeeded"] * 2, timeout=10, what="outcomes")
    assert [r.attempts for r in rows("one")] == [1, 1]

"""Parking (dramatiq_unique.parking.lot) as a primitive: park, hand over, wake, recover.

Uses a small gate of its own (a Redis lock per group, as a concurrency
slot of one would be), on real Redis with SQLite and PostgreSQL.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import redis

from dramatiq_unique import JobModel
from dramatiq_unique.context import MARKER
from dramatiq_unique.observe import events
from dramatiq_unique.parking import lot
from dramatiq_unique.parking.groups import GroupInfo
from dramatiq_unique.storage.models import utcnow
from dramatiq_unique.suite import current
from tests.integration.parking.helpers import ORDER, Delivery, TestGate, sent


@pytest.fixture
def park(suite):
    ORDER["value"] = "created_at"
    spot = lot.of(suite)
    gate = TestGate(suite, spot.wakeups)
    spot.register(gate)
    return spot, gate


def new_row(n: int, **fields) -> JobModel:
    """A job row of the suite's app (``app=`` for another's)."""
    fields.setdefault("app", current().app)
    return JobModel.create(message_id=f"job-{n}", actor_name="parked_actor", queue_name="default",
                           args=[n], options={MARKER: {"qt": "x"}}, **fields)


def park_row(spot, gate, group, job: JobModel) -> bool:
    return spot.park(gate, group, Delivery(job.message_id), JobModel, job.id, job.revision, retry_in_ms=60_000)


def test_a_parked_job_waits_and_each_release_wakes_exactly_one_in_order(park, broker):
    spot, gate = park
    holder = gate.take("t:g", 5_000)
    jobs = [new_row(n) for n in range(3)]
    assert all(park_row(spot, gate, "t:g", job) for job in jobs)

    row = JobModel.get_by_id(jobs[0].id)
    assert (row.status, row.parked_on, row.options["retries"]) == ("pending", "t:g", 2)
    assert spot.wakeups.is_flagged("t:g") and sent(broker) == []

    spot.leave(gate, "t:g", holder)
    first = sent(broker)
    assert [m.message_id for m in first] == ["job-0"], "one waiter per release"
    message = first[0]
    wake = message.options[MARKER].pop("wake")
    parked_at = message.options[MARKER].pop(events.PARKED_AT)  # when it parked: its wait's metric
    assert message.options[MARKER] == {"qt": "queue-lock-of-job-0", "id": jobs[0].id, "rev": 0}
    assert 0 <= events.now_ms() - parked_at < 60_000 and 0 <= events.now_ms() - wake[events.HANDED_AT] < 60_000
    assert message.args == (0,) and message.options["retries"] == 2
    assert (JobModel.get_by_id(jobs[0].id).status, JobModel.get_by_id(jobs[0].id).parked_on) == ("queued", None)
    assert gate.take("t:g", 1000) is None, "the gate is reserved for the woken job"

    spot.leave(gate, "t:g", wake["t"])  # the woken job ran and leaves
    assert [m.message_id for m in sent(broker)] == ["job-0", "job-1"]
    spot.leave(gate, "t:g", sent(broker)[1].options[MARKER]["wake"]["t"])
    spot.leave(gate, "t:g", sent(broker)[2].options[MARKER]["wake"]["t"])
    assert len(sent(broker)) == 3 and not spot.wakeups.is_flagged("t:g")
    assert gate.take("t:g", 1000) is not None, "released once nobody waits"


def test_process_after_order_serves_the_first_ready(park, broker):
    spot, gate = park
    ORDER["value"] = "process_after"
    holder = gate.take("t:g", 5_000)
    now = utcnow()
    late = new_row(0, process_after=now - timedelta(seconds=1))
    early = new_row(1, process_after=now - timedelta(seconds=5))
    for job in (late, early):
        park_row(spot, gate, "t:g", job)
    spot.leave(gate, "t:g", holder)
    assert [m.message_id for m in sent(broker)] == ["job-1"]


def test_a_waiter_that_parks_as_the_holder_leaves_wakes_itself(park, broker):
    """Given a free gate (its holder left before the waiter parked), then the
    waiter's own second look takes the gate and wakes the head of the queue."""
    spot, gate = park
    job = new_row(0)
    assert park_row(spot, gate, "t:g", job)
    assert [m.message_id for m in sent(broker)] == ["job-0"]
    assert JobModel.get_by_id(job.id).status == "queued"


def test_a_woken_jobs_reservation_counts_from_when_its_gate_was_asked_for(park, broker, monkeypatch):
    """Given a waiter whose own second look takes the free gate, When the reply to that take comes late,
    Then the reservation it hands the woken job is dated from before the take was asked for: the woken
    job does not take a gate whose lease ran out as freshly granted (ConcurrencySlots._fresh_here)."""
    spot, gate = park
    taken = gate.flag_and_take

    def late_reply(group, ttl_ms, delay_ms):
        token = taken(group, ttl_ms, delay_ms)
        time.sleep(0.3)
        return token

    monkeypatch.setattr(gate, "flag_and_take", late_reply)
    job = new_row(0)
    before = time.monotonic()
    assert park_row(spot, gate, "t:g", job)
    (message,) = sent(broker)
    assert int(before * 1000) <= message.options[MARKER]["wake"]["at"] <= int(before * 1000) + 250


def test_with_the_flags_unreachable_a_job_parking_as_the_holder_leaves_is_not_stranded(park, broker, monkeypatch):
    """Given the first master down (the wake-up flags unreachable: the holder goes by the database alone),
    When a job parks after the leaving holder found nobody waiting and before it released the gate (its
    own try of the gate fails: still held), Then the holder looks again after the release and wakes it."""
    spot, gate = park

    def unreachable(*args, **kwargs):
        raise redis.ConnectionError("the first master is down")

    for name in ("flag", "clear", "is_flagged"):
        monkeypatch.setattr(spot.wakeups, name, unreachable)
    holder = gate.take("t:g", 5_000)
    job = new_row(0)
    looked = lot.waiting_in
    parked = []

    def waiting_in(info, group, *, app):
        found = looked(info, group, app=app)
        if not parked:  # the waiter parks right after the holder's look
            parked.append(park_row(spot, gate, "t:g", job))
        return found

    monkeypatch.setattr(lot, "waiting_in", waiting_in)
    assert spot.pass_on(gate, "t:g", holder) is not None, "woken"
    assert parked == [True]
    assert [m.message_id for m in sent(broker)] == ["job-0"]
    assert JobModel.get_by_id(job.id).status == "queued"


def test_only_waiting_jobs_park(park):
    spot, gate = park
    gate.take("t:g", 5_000)
    running = new_row(0, status="running", lease_until=utcnow() + timedelta(seconds=30))
    crashed = new_row(1, status="running", lease_until=utcnow() - timedelta(seconds=1))
    finished = new_row(2, status="succeeded")
    replaced = new_row(3, revision=1)
    assert not park_row(spot, gate, "t:g", running), "a live attempt: this is a duplicate delivery"
    assert park_row(spot, gate, "t:g", crashed), "a crashed attempt of this job: it waits again"
    assert not park_row(spot, gate, "t:g", finished)
    assert not spot.park(gate, "t:g", Delivery("job-3"), JobModel, replaced.id, 0, retry_in_ms=1000)


def test_a_parked_job_not_yet_due_is_not_woken(park, broker):
    """A parked job given a later due time ("replace") waits for its own message."""
    spot, gate = park
    holder = gate.take("t:g", 5_000)
    job = new_row(0)
    park_row(spot, gate, "t:g", job)
    JobModel.update(process_after=utcnow() + timedelta(minutes=5)).where(JobModel.id == job.id).execute()
    spot.leave(gate, "t:g", holder)
    assert sent(broker) == [] and JobModel.get_by_id(job.id).parked_on == "t:g"
    assert gate.take("t:g", 1000) is not None


def test_the_watchdog_wakes_the_waiters_of_a_dead_holder(park, broker):
    """Given a holder that died (its lease of 300 ms runs out, nobody leaves),
    then a watchdog pass before the expiry does nothing and one after wakes."""
    spot, gate = park
    gate.take("t:g", 300)
    job = new_row(0)
    spot.park(gate, "t:g", Delivery(job.message_id), JobModel, job.id, 0, retry_in_ms=gate.retry_in("t:g"))
    assert spot.tick() == 0 and sent(broker) == []
    threading.Event().wait(0.4)
    assert spot.tick() == 1
    assert [m.message_id for m in sent(broker)] == ["job-0"]


def test_wake_orphans_recovers_from_lost_flags(park, broker, redis_client):
    """Given parked jobs whose Redis flags were lost, then wake_orphans() wakes
    those whose gate is free, and restores the flag of those whose gate is held."""
    spot, gate = park
    free, held = new_row(0), new_row(1)
    gate.take("t:free", 300)
    holder = gate.take("t:held", 5_000)
    park_row(spot, gate, "t:free", free)
    park_row(spot, gate, "t:held", held)
    redis_client.delete(spot.wakeups.key)
    threading.Event().wait(0.4)

    assert spot.wake_orphans() == 1
    assert [m.message_id for m in sent(broker)] == ["job-0"]
    assert JobModel.get_by_id(held.id).parked_on == "t:held" and spot.wakeups.is_flagged("t:held")
    spot.leave(gate, "t:held", holder)
    assert [m.message_id for m in sent(broker)] == ["job-0", "job-1"]


def test_another_apps_rows_on_the_same_group_are_never_woken(park, broker):
    """Given a row of another app parked on the group first (apps that share the table share group
    names), When the holder leaves and the re-drive looks for orphans, Then only this app's parked
    job is woken, the gate is released once it is done, and the other app's rows stay parked."""
    spot, gate = park
    holder = gate.take("t:g", 5_000)
    theirs = [new_row(0, app="another-app", status="pending", parked_on="t:g"),
              new_row(2, app="another-app", status="pending", parked_on="t:alone")]
    mine = new_row(1)
    assert park_row(spot, gate, "t:g", mine)
    spot.leave(gate, "t:g", holder)
    assert [m.message_id for m in sent(broker)] == ["job-1"]
    spot.leave(gate, "t:g", sent(broker)[0].options[MARKER]["wake"]["t"])
    assert gate.take("t:g", 1000) is not None, "released: nobody of this app waits"
    assert spot.wake_orphans() == 0 and not spot.wakeups.is_flagged("t:alone")
    assert len(sent(broker)) == 1
    assert [(r.status, r.parked_on, r.broker_ref) for r in map(JobModel.get_by_id, [t.id for t in theirs])] == [
        ("pending", "t:g", None), ("pending", "t:alone", None)]


def test_many_waiters_and_releases_at_once_strand_nobody(park, broker):
    """Given 8 threads parking 40 jobs while holders come and go, then every job
    is woken exactly once, without the watchdog."""
    spot, gate = park
    jobs = [new_row(n) for n in range(40)]
    barrier = threading.Barrier(8)
    errors = []

    def waiter(chunk):
        try:
            barrier.wait(10)
            for job in chunk:
                token = gate.take("t:g", 5_000)
                if token is not None:  # it got the gate: it "runs" and leaves
                    JobModel.update(status="succeeded").where(JobModel.id == job.id).execute()
                    spot.leave(gate, "t:g", token)
                else:
                    park_row(spot, gate, "t:g", job)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=waiter, args=(jobs[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    # Play the woken jobs: each runs and leaves, until nothing is left.
    seen = set()
    for _ in range(100):
        fresh = [m for m in sent(broker) if m.message_id not in seen]
        if not fresh:
            break
        for message in fresh:
            seen.add(message.message_id)
            JobModel.update(status="succeeded").where(JobModel.message_id == message.message_id).execute()
            spot.leave(gate, "t:g", message.options[MARKER]["wake"]["t"])
    statuses = [str(j.status) for j in JobModel.select().order_by(JobModel.id)]
    assert statuses == ["succeeded"] * 40, "no waiter stranded"
    assert len(seen) == len(sent(broker)), "none woken twice"


def test_a_job_woken_for_one_gate_that_parks_on_another_hands_the_first_on(park, broker):
    """Given a job woken for gate t:a (holding its reservation) that finds t:b
    held, then parking on t:b hands t:a to t:a's next waiter (or frees it)."""
    spot, gate = park
    reservation = gate.take("t:a", 5_000)
    gate.take("t:b", 5_000)
    job = new_row(0)
    delivery = Delivery(job.message_id)
    delivery.options[MARKER]["wake"] = {"g": "t:a", "t": reservation}
    assert spot.park(gate, "t:b", delivery, JobModel, job.id, 0, retry_in_ms=60_000)
    assert gate.take("t:a", 1000) is not None, "the reservation of t:a was given back"
    assert "wake" not in JobModel.get_by_id(job.id).options[MARKER]


def test_parking_moves_keep_the_callers_transaction_and_the_sessions_settings(park, suite):
    """park and claim commit without waiting for the WAL flush on their own (PostgreSQL);
    inside a caller's transaction they follow its rules, and nothing leaks into the session."""
    spot, gate = park
    db = suite.db
    first, second = new_row(1), new_row(2)
    assert gate.take("t:tx", 5_000) is not None  # held: parking does not wake anyone itself
    with db.atomic():
        assert park_row(spot, gate, "t:tx", first)
        assert spot._claim_next(GroupInfo(JobModel, "created_at", 5_000), "t:tx", time.monotonic()).id == first.id
    assert park_row(spot, gate, "t:tx", second)
    assert spot._claim_next(GroupInfo(JobModel, "created_at", 5_000), "t:tx", time.monotonic()).id == second.id
    if db.__class__.__name__.startswith("Postgres"):
        assert db.execute_sql("SHOW synchronous_commit").fetchone()[0] == "on"
    assert JobModel.get_by_id(second.id).status == "queued"


def test_a_claim_can_start_the_woken_attempt_unless_its_message_brought_unique_options(suite):
    """Given two parked rows, one whose message brought its own unique_lock, When each is claimed
    with a start (parking/lot.py), Then the plain one is running (attempt counted, fencing token drawn,
    unique hold released) and the other is only claimed, left to start the ordinary way."""
    from dramatiq_unique.storage import jobs as store
    from dramatiq_unique.storage.models import after_ms

    plain = new_row(1, status="pending", parked_on="t:pre", unique_hold="k1", fencing_token=4)
    own = new_row(2, status="pending", parked_on="t:pre", unique_hold="k2")
    own.options = {**own.options, "unique_lock": "while_executing"}  # sent with an option of its own
    own.save()
    now = utcnow()
    start = (after_ms(60_000, now), "host:1:woken", True)
    first = store.claim_parked(JobModel, "t:pre", "created_at", now, "ref-1", start, app=suite.app)
    second = store.claim_parked(JobModel, "t:pre", "created_at", now, "ref-2", start, app=suite.app)
    assert (first.id, first.status, first.attempts, first.fencing_token) == (plain.id, "running", 1, 5)
    assert (first.unique_hold, first.worker, first.broker_ref, first.parked_on) == (None, "host:1:woken", "ref-1", None)
    assert (second.id, second.status, second.attempts, second.unique_hold) == (own.id, "queued", 0, "k2")

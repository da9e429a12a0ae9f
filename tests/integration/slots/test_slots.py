"""Concurrency slots (dramatiq_unique.context, dramatiq_unique.slots.gate,
dramatiq_unique.slots.limits), on real Redis with the job table on SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import defaultdict

import dramatiq
import pytest

import dramatiq_unique
from dramatiq_unique import InvalidOption, JobModel, concurrency_status, set_concurrency_limit
from dramatiq_unique.slots.gate import gate_of
from tests.conftest import REDIS_URL
from tests.durable import free_port
from tests.helpers import wait_until
from tests.integration.slots.helpers import Recorder, assert_all_succeeded_once, queue_behind_a_holder, rows
from tests.slots_app import Tally, WorkerProcess, declare


def busy_fraction(spans: list[tuple[float, float]], limit: int, until: float) -> float:
    """The mean number running between the first start and ``until``, over ``limit``."""
    start = spans[0][0]
    busy = sum(max(0.0, min(e, until) - s) for s, e in spans if s < until)
    return busy / ((until - start) * limit)


def handover_gaps(spans: list[tuple[float, float]]) -> list[float]:
    """For each job that ended while others waited: the time until the next job started."""
    starts = sorted(s for s, _ in spans)
    return [min(s for s in starts if s >= e) - e for _, e in spans if any(s >= e for s in starts)]


# -- the limit ---------------------------------------------------------------------------------------


def test_the_limit_holds_across_two_worker_processes_and_no_attempt_is_wasted(suite, broker, database_url, key_prefix):
    """Given two ``dramatiq`` worker processes of 12 threads each, limit 2 per tenant, tenant "t0" raised to 3
    and tenant "t7" halted, When 8 tenants send 10 jobs each (more slots than one process has threads for),
    Then at no moment do more than 2 (3) jobs of a tenant run, each limit is reached, both processes run
    jobs, nothing of "t7" starts until this process (which runs no worker) resumes it, and every job ran
    exactly once."""
    declare(REDIS_URL, key_prefix, limit=2, ttl=60_000)
    set_concurrency_limit("slot_job", 3, key="t0")
    set_concurrency_limit("slot_job", 0, key="t7")
    job = broker.get_actor("slot_job")
    tenants = [f"t{n}" for n in range(8)]
    for i in range(10):  # sent first, so that both processes find work when they start
        for tenant in tenants:
            job.send(tenant, i, run_ms=150)
    tally = Tally(REDIS_URL, key_prefix)
    workers = WorkerProcess(redis_url=REDIS_URL, namespace=broker.namespace, database_url=database_url,
                            key_prefix=key_prefix, limit=2, processes=2, threads=12)
    try:
        wait_until(lambda: tally.ended() == 70, timeout=45, interval=0.1, what="70 jobs to end")
        wait_until(lambda: concurrency_status("slot_job", key="t7").parked == 10, timeout=10, what="t7 parked")
        assert "t7" not in tally.peaks()
        assert set_concurrency_limit("slot_job", None, key="t7") == 2  # woken through the broker
        wait_until(lambda: tally.ended() == 80, timeout=30, interval=0.1, what="t7's jobs to end")
    finally:
        err = workers.stop()
    assert tally.peaks() == {t: 3 if t == "t0" else 2 for t in tenants}, err[-3000:]
    assert len({e[4] for e in tally.log()}) == 2, "both worker processes ran jobs"
    assert_all_succeeded_once("slot_job", 80)
    assert concurrency_status("slot_job").holders == 0


def test_all_slots_are_used_while_work_waits(suite, broker, make_worker):
    """Given limit 3 and 8 threads, When 24 jobs of 100 ms are sent, Then three run at all times
    until the queue is empty, the rest wait parked (holding no thread), and none is attempted twice."""
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=3)
    def export(i: int) -> None:
        rec.run("export", i, 100)

    for i in range(24):
        export.send(i)
    make_worker(8)
    wait_until(lambda: rec.started() >= 4, timeout=10, what="jobs to start")
    status = concurrency_status("export")
    assert (status.limit, status.holders) == (3, 3)
    assert status.parked > 0
    wait_until(lambda: rec.ended() == 24, timeout=20, what="24 jobs to end")
    spans = rec.intervals("export")
    assert rec.peak["export"] == 3
    # Until the last job started, work was waiting: a freed slot went to the next job at once
    # (a few ms: no polling, whose first look comes after the watchdog's 500 ms), and the slots were
    # busy nearly all the time.  The bound leaves room for a loaded machine.
    assert statistics.median(handover_gaps(spans)) < 0.05
    assert busy_fraction(spans, 3, until=spans[-1][0]) > 0.7
    assert_all_succeeded_once("export", 24)


def test_parked_jobs_start_in_fifo_order(suite, broker, make_worker):
    """Given a halted group with eight parked jobs, When it resumes with limit 1, Then they run in the order sent."""
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1, concurrency_key=["tenant"])
    def sync(tenant: str, i: int) -> None:
        rec.run(tenant, i, 5)

    set_concurrency_limit("sync", 0, key="t")
    for i in range(8):
        sync.send("t", i)
    make_worker(4)
    wait_until(lambda: concurrency_status("sync", key="t").parked == 8, timeout=10, what="8 parked jobs")
    assert rec.started() == 0
    # One free slot: at most one woken here.  The worker thread that parked the
    # eighth job may still be taking its second look at the gate, and start it first.
    assert set_concurrency_limit("sync", None, key="t") <= 1
    wait_until(lambda: rec.ended() == 8, timeout=10, what="8 jobs to end")
    assert rec.order("t") == list(range(8))
    assert_all_succeeded_once("sync", 8)


def test_a_slot_is_handed_on_before_the_outcome_is_written(suite, broker, make_worker, monkeypatch):
    """Given a limit of 1 and slow outcome writes, When a job ends, Then the next starts without
    waiting for its predecessor's outcome to be committed: a slot orders nothing."""
    from dramatiq_unique.middleware import job_tracking
    finish = job_tracking.jobs.finish

    def slow_finish(*args, **kwargs):
        time.sleep(2.0)
        return finish(*args, **kwargs)

    monkeypatch.setattr(job_tracking.jobs, "finish", slow_finish)
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1)
    def step(i: int) -> None:
        rec.run("g", i, 5)

    for i in range(3):
        step.send(i)
    make_worker(4)
    wait_until(lambda: rec.ended() == 3, timeout=10, what="3 jobs to end")
    spans = rec.intervals("g")
    assert rec.peak["g"] == 1
    assert max(handover_gaps(spans)) < 1.5  # not the 2 s outcome write
    assert_all_succeeded_once("step", 3)


def test_a_woken_job_is_started_by_its_claim_when_the_slot_is_all_it_waits_for(suite, broker, make_worker):
    """Given a limit of 1 and jobs parked behind the first, When they are woken in this process,
    Then each is started by the statement that claims it (one write fewer) and runs once;
    an actor that also takes an execution lock still starts the ordinary way."""
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1)
    def plain(i: int) -> None:
        rec.run("plain", i, 5)

    @dramatiq.actor(concurrency_limit=1, unique_args=["i"], unique_lock="while_executing")
    def locked(i: int) -> None:
        rec.run("locked", i, 5)

    for i in range(4):
        plain.send(i)
        locked.send(i)
    make_worker(4)
    wait_until(lambda: rec.ended() == 8, timeout=10, what="8 jobs to end")
    assert_all_succeeded_once("plain", 4)
    assert_all_succeeded_once("locked", 4)
    woken = lambda name: sum(r.worker.endswith(":woken") for r in JobModel.select().where(JobModel.actor_name == name))  # noqa: E731
    assert woken("plain") >= 1
    assert woken("locked") == 0


def test_process_after_order_serves_the_first_ready(suite, broker, make_worker):
    """Given unique_order_by="process_after" and a halted group, When a delayed job is sent before two others,
    Then, resumed, the two that were due first run first."""
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1, unique_order_by="process_after")
    def sync(name: str) -> None:
        rec.run("g", name, 5)

    set_concurrency_limit("sync", 0)
    sync.send_with_options(args=("late",), delay=300)
    sync.send("first")
    sync.send("second")
    make_worker(4)
    wait_until(lambda: concurrency_status("sync").parked == 3, timeout=10, what="3 parked jobs")
    set_concurrency_limit("sync", None)
    wait_until(lambda: rec.ended() == 3, timeout=10, what="3 jobs to end")
    assert rec.order("g") == ["first", "second", "late"]


# -- tenants and run-time limits ---------------------------------------------------------------------


def test_per_tenant_limits(suite, broker, make_worker):
    """Given limit 1 per tenant and tenant "big" given 3 at run time,
    When both tenants send work, Then "big" runs three at once and "small" one; the overrides layer as documented."""
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1, concurrency_key=["tenant"])
    def report(tenant: str, i: int) -> None:
        rec.run(tenant, i, 80)

    assert set_concurrency_limit("report", 3, key="big") == 0
    for i in range(9):
        report.send("big", i)
    for i in range(3):
        report.send("small", i)
    make_worker(8)
    wait_until(lambda: rec.ended() == 12, timeout=15, what="12 jobs to end")
    assert (rec.peak["big"], rec.peak["small"]) == (3, 1)
    assert_all_succeeded_once("report", 12)

    wait_until(lambda: concurrency_status("report", key="big").holders == 0, timeout=5, what="the slots to be left")
    big = concurrency_status("report", key="big")
    assert (big.limit, big.default, big.override, big.holders, big.parked) == (3, 1, 3, 0, 0)
    set_concurrency_limit("report", 2)  # actor-wide: every tenant without a limit of its own
    assert concurrency_status("report", key="small").limit == 2
    assert concurrency_status("report", key="big").limit == 3
    assert concurrency_status("report").limit == 2
    set_concurrency_limit("report", None, key="big")
    assert concurrency_status("report", key="big").limit == 2
    set_concurrency_limit("report", None)
    assert concurrency_status("report", key="big").limit == 1


def test_a_key_without_a_declared_limit_is_unlimited_until_a_tenant_gets_one(suite, broker, make_worker):
    rec = Recorder()

    @dramatiq.actor(concurrency_key=["tenant"])
    def report(tenant: str, i: int) -> None:
        rec.run(tenant, i, 150)

    set_concurrency_limit("report", 1, key="noisy")
    for i in range(4):
        report.send("noisy", i)
        report.send("quiet", i)
    make_worker(8)
    wait_until(lambda: rec.ended() == 8, timeout=15, what="8 jobs to end")
    assert (rec.peak["noisy"], rec.peak["quiet"]) == (1, 4)
    assert concurrency_status("report", key="quiet").limit is None


def test_an_actor_wide_limit_applies_to_every_tenant_without_its_own(suite, broker, make_worker):
    """Given two tenants with parked jobs, When the actor-wide limit is raised, Then each tenant gets one more
    job running at once, but not a tenant that has a limit of its own."""
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1, concurrency_key=["tenant"])
    def sync(tenant: str, i: int) -> None:
        rec.run(tenant, i, 400)

    set_concurrency_limit("sync", 1, key="own")
    for i in range(3):
        for tenant in ("a", "b", "own"):
            sync.send(tenant, i)
    make_worker(8)
    wait_until(lambda: concurrency_status("sync").parked == 6, timeout=10, what="6 parked jobs")
    assert set_concurrency_limit("sync", 2) == 2
    # Each tenant's peak, not both at 2 in one instant: a loaded machine may end a's first 400 ms
    # job before b's second starts, and the claim is per tenant.
    wait_until(lambda: rec.peak["a"] == rec.peak["b"] == 2, timeout=2, interval=0.005,
               what="a second job of a and of b running beside the first")
    assert rec.running["own"] <= 1
    wait_until(lambda: rec.ended() == 9, timeout=10, what="9 jobs to end")
    assert (rec.peak["a"], rec.peak["b"], rec.peak["own"]) == (2, 2, 1)


def test_a_message_may_bring_its_own_limit(suite, broker, make_worker, caplog):
    """Given a tracked actor without slot options, When messages are sent with concurrency_limit=1,
    Then they run one at a time, each waiting job parked once (hand-overs know the message's limit)."""
    rec = Recorder()
    caplog.set_level(logging.DEBUG, logger="dramatiq_unique.events")

    @dramatiq.actor(track=True)
    def sync(i: int) -> None:
        rec.run("g", i, 60)

    for i in range(4):
        sync.send_with_options(args=(i,), concurrency_limit=1)
    make_worker(4)
    wait_until(lambda: rec.ended() == 4, timeout=10, what="4 jobs to end")
    assert rec.peak["g"] == 1
    assert_all_succeeded_once("sync", 4)
    assert sum("parked on" in r.getMessage() for r in caplog.records) <= 3


def test_halt_and_resume_lose_nothing(suite, broker, make_worker):
    """Given two running jobs, When the group is halted, Then they finish, nothing new starts and the rest
    stay pending; When it resumes, Then the rest run, two at a time, once each."""
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=2)
    def sync(i: int) -> None:
        rec.run("g", i, 200)

    make_worker(8)
    sync.send(0)
    sync.send(1)
    wait_until(lambda: rec.started() == 2, timeout=10, what="two jobs to start")
    assert set_concurrency_limit("sync", 0) == 0
    for i in range(2, 6):
        sync.send(i)
    wait_until(lambda: rec.ended() == 2, timeout=10, what="the running jobs to end")
    time.sleep(0.3)
    status = concurrency_status("sync")
    assert (status.limit, status.holders, status.parked, rec.started()) == (0, 0, 4, 2)
    assert {r.status for r in rows("sync")[2:]} == {"pending"}

    assert set_concurrency_limit("sync", None) == 2  # two free slots: two woken at once
    wait_until(lambda: rec.ended() == 6, timeout=10, what="the halted jobs to end")
    assert rec.peak["g"] == 2
    assert_all_succeeded_once("sync", 6)


def test_raising_a_limit_starts_parked_jobs_at_once(suite, broker, make_worker):
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1)
    def sync(i: int) -> None:
        rec.run("g", i, 1_500)

    for i in range(5):
        sync.send(i)
    make_worker(8)
    wait_until(lambda: concurrency_status("sync").parked == 4, timeout=10, what="4 parked jobs")
    raised = time.perf_counter()
    assert set_concurrency_limit("sync", 4) == 3
    wait_until(lambda: rec.started() == 4, timeout=2, interval=0.005, what="3 more jobs to start")
    assert time.perf_counter() - raised < 0.75, "the parked jobs started at once, not at the next job's end"
    assert rec.running["g"] == 4


def test_lowering_a_limit_lets_running_jobs_finish_and_starts_none_until_under_it(suite, broker, make_worker):
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=3)
    def sync(i: int) -> None:
        rec.run("g", i, 250)

    for i in range(6):
        sync.send(i)
    make_worker(8)
    wait_until(lambda: rec.started() == 3, timeout=10, what="three jobs to start")
    set_concurrency_limit("sync", 1)
    wait_until(lambda: rec.ended() == 6, timeout=15, what="6 jobs to end")
    spans = rec.intervals("g")
    first_three_end = max(e for _, e in spans[:3])
    later = spans[3:]
    assert all(s >= first_three_end for s, _ in later), "nothing started while over the new limit"
    assert all(b[0] >= a[1] for a, b in zip(later, later[1:], strict=False)), "one at a time under the new limit"
    assert_all_succeeded_once("sync", 6)


# -- retries, delays, uniqueness, heartbeat ---------------------------------------------------------


def test_a_retry_gives_up_its_slot_and_queues_again(suite, broker, make_worker):
    """Given limit 1 and a job that fails once, When it waits for its retry, Then another job uses the slot,
    and the retry queues for it again and runs as the same job (attempts 2)."""
    rec = Recorder()
    attempts: dict = defaultdict(int)

    @dramatiq.actor(concurrency_limit=1, max_retries=3, min_backoff=300, max_backoff=300)
    def sync(name: str) -> None:
        attempts[name] += 1
        rec.run("g", f"{name}-{attempts[name]}", 50)
        if name == "flaky" and attempts[name] == 1:
            raise RuntimeError("first attempt fails")

    make_worker(4)
    sync.send("flaky")
    wait_until(lambda: rec.started() == 1, timeout=10, what="the first attempt to start")
    sync.send("steady")
    wait_until(lambda: rec.ended() == 3, timeout=10, what="three attempts to end")
    assert rec.order("g") == ["flaky-1", "steady-1", "flaky-2"]
    # The actor's end is seen before its outcome is written: let it settle, within a bound.
    wait_until(lambda: rows("sync")[0].status == "succeeded", timeout=10, what="the retry's outcome")
    flaky, steady = rows("sync")
    assert (flaky.status, flaky.attempts, steady.attempts) == ("succeeded", 2, 1)
    assert rec.peak["g"] == 1


def test_a_delayed_message_holds_no_slot_until_due(suite, broker, make_worker):
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1)
    def sync(name: str) -> None:
        rec.run("g", name, 100)

    sync.send_with_options(args=("later",), delay=400)
    sync.send("now")
    make_worker(4)
    wait_until(lambda: rec.ended() == 2, timeout=10, what="both jobs to end")
    assert rec.order("g") == ["now", "later"]
    assert_all_succeeded_once("sync", 2)


def test_slots_and_execution_locks_together(suite, broker, make_worker):
    """Given an actor with one running job per order (while_executing) and two per customer,
    When three orders of one customer get three jobs each, Then no two jobs of an order overlap,
    at most two of the customer run, and every job runs once (the slot is taken first, then the lock)."""
    rec = Recorder()
    lock = threading.Lock()
    per_order: dict = defaultdict(int)
    overlaps = []

    @dramatiq.actor(unique_args=["order"], unique_lock="while_executing", concurrency_limit=2,
                    concurrency_key=["customer"])
    def ship(customer: str, order: str, i: int) -> None:
        with lock:
            per_order[order] += 1
            if per_order[order] > 1:
                overlaps.append(order)
        try:
            rec.run(customer, (order, i), 40)
        finally:
            with lock:
                per_order[order] -= 1

    for i in range(3):
        for order in ("o1", "o2", "o3"):
            ship.send("c1", order, i)
    make_worker(8)
    wait_until(lambda: rec.ended() == 9, timeout=20, what="9 jobs to end")
    assert overlaps == []
    assert rec.peak["c1"] == 2
    assert_all_succeeded_once("ship", 9)
    # The slot is left after the outcome is recorded: a moment after the last job returned.
    wait_until(lambda: concurrency_status("ship", key="c1").holders == 0, timeout=5, what="the slots to be left")


def test_a_parked_unique_job_keeps_its_key_so_a_duplicate_send_is_skipped(suite, broker, make_worker):
    """Given until_and_while_executing (the default) and limit 1, When a job waits parked for the slot and its
    key is sent again, Then the second send resolves to the parked job, which runs once when the slot frees."""
    rec = Recorder()

    @dramatiq.actor(unique_args=["order"], concurrency_limit=1)
    def ship(order: str) -> None:
        rec.run("g", order, 300 if order == "blocker" else 10)

    make_worker(4)
    ship.send("blocker")
    wait_until(lambda: rec.started() == 1, timeout=10, what="the blocker to start")
    first = ship.send("x")
    wait_until(lambda: concurrency_status("ship").parked == 1, timeout=10, what="x parked")
    assert ship.send("x").message_id == first.message_id
    wait_until(lambda: rec.ended() == 2, timeout=10, what="x to run")
    assert rec.order("g") == ["blocker", "x"]
    assert_all_succeeded_once("ship", 2)


def test_heartbeat_renews_the_slot(suite, broker, make_worker):
    """Given a 300 ms slot lease, When a job runs 900 ms calling heartbeat(), Then it keeps its slot throughout."""
    rec = Recorder()
    left = []

    @dramatiq.actor(concurrency_limit=1, concurrency_ttl=300)
    def walk(i: int) -> None:
        rec.start("g", i)
        try:
            for _ in range(9 if i == 0 else 1):
                time.sleep(0.1)
                left.append(dramatiq_unique.heartbeat())
        finally:
            rec.end("g", i)

    walk.send(0)
    walk.send(1)
    make_worker(4)
    wait_until(lambda: rec.ended() == 2, timeout=10, what="both jobs to end")
    (s0, e0), (s1, _) = rec.intervals("g")
    assert s1 >= e0, "the second job waited for the first, whose slot never ran out"
    assert all(0 < x <= 0.3 for x in left)
    assert_all_succeeded_once("walk", 2)


# -- failures ----------------------------------------------------------------------------------------


def test_parking_list_loss_is_recovered_by_the_redrive(suite, broker, make_worker, key_prefix, redis_client):
    """Given one running job and three parked behind it, When Redis loses the group's keys and the wake-up
    flags, Then the parked jobs stay pending in the database, and the re-drive wakes them."""
    # Rows on deck would be put back and their group flagged again by this very process: this
    # test is about what nobody here knows any more.
    dramatiq_unique.parking.lot.of(suite).ondeck.enabled = False
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1)
    def sync(i: int) -> None:
        rec.run("g", i, 400 if i == 0 else 20)

    make_worker(4)
    queue_behind_a_holder(sync, rec, 4)
    wait_until(lambda: concurrency_status("sync").parked == 3, timeout=10, what="3 parked jobs")
    lost = [k for k in redis_client.scan_iter(match=f"{key_prefix}:*", count=1000)
            if b":slots:" in k or b":limit" in k or k.endswith(b":wakeups")]
    assert lost and redis_client.delete(*lost)
    wait_until(lambda: rec.ended() == 1, timeout=10, what="the first job to end")
    time.sleep(0.6)  # a watchdog pass or more: nothing is flagged any more
    assert rec.started() == 1
    assert [r.status for r in rows("sync")[1:]] == ["pending"] * 3

    counts = dramatiq_unique.redrive()
    assert counts.woken == 1
    wait_until(lambda: rec.ended() == 4, timeout=10, what="the parked jobs to run")
    assert rec.order("g") == [0, 1, 2, 3]
    assert_all_succeeded_once("sync", 4)


def test_redis_unreachable_means_no_unlimited_run(broker, sqlite_url, key_prefix):
    """Given the suite's Redis down, When a slot-limited job is processed, Then it does not run: its message
    fails with RedisUnavailable and Retries sends it again later; no attempt is recorded."""
    dead = free_port()  # a port nobody listens on
    suite = dramatiq_unique.setup(broker, database=sqlite_url, redis=f"redis://127.0.0.1:{dead}/0",
                                  key_prefix=key_prefix, redriver=False, check_redis=False)
    ran = []

    @dramatiq.actor(concurrency_limit=1, min_backoff=60_000, max_backoff=60_000)
    def sync() -> None:
        ran.append(1)

    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
    worker.start()
    try:
        message = sync.send()
        delayed = f"{broker.namespace}:default.DQ.msgs"
        wait_until(lambda: broker.client.hlen(delayed) == 1, timeout=15, what="the retry in the delay queue")
    finally:
        worker.stop(timeout=10_000)
        suite.db.close()
    assert ran == []
    assert dramatiq_unique.get_job(message.message_id).attempts == 0
    retry = dramatiq.Message.decode(next(iter(broker.client.hvals(delayed))))
    assert retry.options["retries"] == 1 and "RedisUnavailable" in retry.options["traceback"]


@pytest.mark.slow
def test_a_sigkilled_holder_frees_its_slot_after_its_lease(suite, broker, database_url, key_prefix, redis_client):
    """Given a job holding the only slot in a worker process, When that process is SIGKILLed,
    Then a parked job in another process starts once the slot's 2 s lease has run out, not before."""
    declare(REDIS_URL, key_prefix, limit=1, ttl=2_000)
    tally = Tally(REDIS_URL, key_prefix)
    holder = WorkerProcess(redis_url=REDIS_URL, namespace=broker.namespace, database_url=database_url,
                           key_prefix=key_prefix, limit=1, ttl=2_000, threads=2)
    worker = None
    try:
        actor = broker.get_actor("slot_job")
        actor.send("t", 0, run_ms=60_000)
        wait_until(lambda: tally.log(), timeout=30, what="the holder to start its job")
        worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
        worker.start()
        second = actor.send("t", 1, run_ms=10)
        wait_until(lambda: concurrency_status("slot_job", key="t").parked == 1, timeout=10, what="a parked job")
        assert concurrency_status("slot_job", key="t").holders == 1
        # Killed between its park and its flag, the holder's process would leave the job to the
        # re-drive (off here): kill once the group is flagged, as the test means to.
        flags = dramatiq_unique.parking.lot.of(suite).wakeups.key
        wait_until(lambda: redis_client.zcard(flags) == 1, timeout=10, what="the group flagged")
        (child,) = holder.children()
        holder.kill_child(child)
        killed = time.time()
        wait_until(lambda: tally.ended() == 1, timeout=10, what="the parked job to run")
    finally:
        if worker is not None:
            worker.stop(timeout=10_000)
        holder.stop()
    started = [e for e in tally.log() if e[0] == "start" and e[2] == 1][0][3]
    first = tally.log()[0][3]
    assert started - first >= 1.9, "not before the lease ran out"
    assert started - killed < 2.0 + 1.5, "soon after it ran out (watchdog every 0.5 s)"
    assert dramatiq_unique.get_job(second.message_id).attempts == 1


# -- the gate itself and bad input -------------------------------------------------------------------


@pytest.fixture
def sqlite_suite(broker, sqlite_url, key_prefix):
    suite = dramatiq_unique.setup(broker, database=sqlite_url, redis=REDIS_URL, key_prefix=key_prefix,
                                  redriver=False)
    yield suite
    suite.db.close()


def test_the_slot_gate_counts_leases_and_honours_the_limit_at_every_step(sqlite_suite):
    @dramatiq.actor(concurrency_limit=2, concurrency_ttl=200)
    def sync() -> None:
        pass

    gate, group = gate_of(sqlite_suite), "slot:sync:all"
    a, b = gate.take(group, 200), gate.take(group, 200)
    assert a and b and gate.take(group, 200) is None
    assert 0 < gate.retry_in(group) <= 200
    set_concurrency_limit("sync", 1)
    assert gate.pass_to(group, a, 200) is None, "over the new limit: the slot is given up, not handed on"
    c = gate.pass_to(group, b, 200)
    assert c is not None and gate.status(group)[0] == 1
    time.sleep(0.25)  # the lease runs out: the holder no longer counts
    assert gate.status(group)[0] == 0
    assert gate.renew(group, c, 200, 2), "a lapsed holder gets back in while there is room"
    set_concurrency_limit("sync", 0)
    assert gate.take(group, 200) is None and gate.retry_in(group) > 1_000
    gate.release(group, c)
    assert gate.status(group)[:2] == (0, 0)


def test_bad_options_fail_at_declaration(sqlite_suite):
    for options in ({"concurrency_ttl": 0}, {"concurrency_ttl": -5}, {"concurrency_limit": -1},
                    {"concurrency_limit": 1.5}, {"concurrency_limit": True}, {"concurrency_key": ["missing"]}):
        with pytest.raises(InvalidOption):
            dramatiq.actor(actor_name="bad", **options)(lambda tenant: None)


def test_bad_limits_and_unknown_actors_fail_at_the_call(sqlite_suite):
    @dramatiq.actor(concurrency_limit=1, concurrency_key=["tenant", "region"])
    def keyed(tenant: str, region: str) -> None:
        pass

    @dramatiq.actor(concurrency_limit=1)
    def whole() -> None:
        pass

    @dramatiq.actor(track=True)
    def plain() -> None:
        pass

    for limit in (-1, 1.5, True, "3"):
        with pytest.raises(InvalidOption):
            set_concurrency_limit("keyed", limit)
    for name in ("missing", "plain"):
        with pytest.raises(InvalidOption):
            set_concurrency_limit(name, 1)
        with pytest.raises(InvalidOption):
            concurrency_status(name)
    with pytest.raises(InvalidOption):
        set_concurrency_limit("whole", 1, key="acme")  # no concurrency_key to name
    with pytest.raises(InvalidOption):
        set_concurrency_limit("keyed", 1, key={"tenant": "acme"})  # region missing
    set_concurrency_limit("keyed", 4, key={"tenant": "acme", "region": "eu"})
    assert concurrency_status("keyed", key=("acme", "eu")).limit == 4


# -- the RabbitMQ broker -----------------------------------------------------------------------------


@pytest.fixture
def rabbit_suite(sqlite_url, key_prefix):
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    from dramatiq.common import dq_name, xq_name

    from tests.conftest import RABBITMQ_URL

    queue = f"du_{key_prefix[-10:]}"
    rabbit = RabbitmqBroker(url=RABBITMQ_URL)
    dramatiq.set_broker(rabbit)
    suite = dramatiq_unique.setup(rabbit, database=sqlite_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    yield rabbit, suite, queue
    suite.db.close()
    for name in (queue, dq_name(queue), xq_name(queue)):
        rabbit.channel.queue_delete(queue=name)
    rabbit.close()


def test_slots_on_the_rabbitmq_broker(rabbit_suite):
    """Given the RabbitMQ broker (woken jobs are published, not handed to the worker in-process),
    When a group with limit 2 gets 8 jobs and is halted and resumed meanwhile, Then 2 run at most and all run once."""
    rabbit, suite, queue = rabbit_suite
    rec = Recorder()

    @dramatiq.actor(queue_name=queue, concurrency_limit=2)
    def sync(i: int) -> None:
        rec.run("g", i, 80)

    for i in range(8):
        sync.send(i)
    worker = dramatiq.Worker(rabbit, worker_timeout=50, worker_threads=6)
    worker.start()
    try:
        wait_until(lambda: rec.started() >= 2, timeout=10, what="two jobs to start")
        set_concurrency_limit("sync", 0)
        wait_until(lambda: concurrency_status("sync").holders == 0, timeout=10, what="the running jobs to end")
        halted_at = rec.started()
        time.sleep(0.3)
        assert rec.started() == halted_at
        assert set_concurrency_limit("sync", None) == 2
        wait_until(lambda: rec.ended() == 8, timeout=20, what="8 jobs to end")
    finally:
        worker.stop(timeout=10_000)
    assert rec.peak["g"] == 2
    assert_all_succeeded_once("sync", 8)

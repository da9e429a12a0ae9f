"""The middlewares added one by one (dramatiq_unique.options): the combinations
that make sense work, the others are refused when the actor is declared, naming the actor,
the option and the middleware to add.  On real Redis, the job table on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import dramatiq
import pytest
from dramatiq.middleware import Retries

import dramatiq_unique
from dramatiq_unique import ConcurrencySlots, ExecutionLocks, InvalidOption, JobModel, JobTracking, Suite
from tests.conftest import REDIS_URL
from tests.helpers import wait_until


@pytest.fixture
def bare_suite(broker, database_url: str, key_prefix: str) -> Iterator[Suite]:
    """A suite whose middlewares the test adds itself, as a user would without setup()."""
    suite = Suite(database=database_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    yield suite
    suite.db.close()


@pytest.fixture
def run_worker(broker) -> Iterator:
    started: list[dramatiq.Worker] = []

    def run(threads: int = 4) -> dramatiq.Worker:
        worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=threads)
        worker.start()
        started.append(worker)
        return worker

    yield run
    for worker in started:
        worker.stop(timeout=10_000)


class Peak:
    """How many jobs ran at once, at most."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = self.peak = self.done = 0

    def run(self, ms: float) -> None:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(ms / 1000)
        with self.lock:
            self.running -= 1
            self.done += 1


def rows(actor_name: str) -> list[JobModel]:
    return list(JobModel.select().where(JobModel.actor_name == actor_name).order_by(JobModel.id))


def settled(actor_name: str, count: int) -> list[JobModel]:
    """The actor's rows once ``count`` of them recorded their outcome."""
    wait_until(lambda: sum(r.status in ("succeeded", "failed") for r in rows(actor_name)) == count,
               timeout=15, what=f"{count} {actor_name} rows to record their outcome")
    return rows(actor_name)


def add_tracking(broker, suite: Suite) -> None:
    broker.add_middleware(JobTracking(suite=suite), before=Retries)


# -- combinations that work -------------------------------------------------------------------


def test_slots_without_execution_locks_limit_and_park_jobs(broker, bare_suite, run_worker):
    """Given ConcurrencySlots and JobTracking and no ExecutionLocks, When six jobs of a
    one-slot actor are sent, Then one runs at a time, the others wait parked, and all succeed once."""
    add_tracking(broker, bare_suite)
    broker.add_middleware(ConcurrencySlots(suite=bare_suite), before=JobTracking)
    peak = Peak()

    @dramatiq.actor(concurrency_limit=1, concurrency_ttl=5_000)
    def slot_only(i: int) -> None:
        peak.run(60)

    for i in range(6):
        slot_only.send(i)
    run_worker(threads=4)
    found = settled("slot_only", 6)
    assert {r.status for r in found} == {"succeeded"}, [(r.id, r.status, r.last_error) for r in found]
    assert {r.attempts for r in found} == {1}, "an attempt was wasted"
    assert peak.peak == 1


def test_slots_without_execution_locks_serve_keys_and_unique_sends(broker, bare_suite, run_worker):
    """Given no ExecutionLocks, When an actor limits per tenant and sends uniquely with a lock type
    that takes no execution lock, Then duplicates are skipped and each tenant runs one at a time."""
    add_tracking(broker, bare_suite)
    broker.add_middleware(ConcurrencySlots(suite=bare_suite), before=JobTracking)
    peaks: dict[str, Peak] = {"a": Peak(), "b": Peak()}

    @dramatiq.actor(concurrency_limit=1, concurrency_key=["tenant"], unique_args=["tenant", "i"],
                    unique_lock="until_executed")
    def per_tenant(tenant: str, i: int) -> None:
        peaks[tenant].run(40)

    for tenant in ("a", "b"):
        for i in range(3):
            per_tenant.send(tenant, i)
            per_tenant.send(tenant, i)  # a duplicate: skipped at send
    run_worker(threads=4)
    found = settled("per_tenant", 6)
    assert len(found) == 6
    assert {r.status for r in found} == {"succeeded"}
    assert peaks["a"].peak == 1 and peaks["b"].peak == 1


def test_execution_locks_without_slots_run_one_job_per_key(broker, bare_suite, run_worker):
    """Given ExecutionLocks and JobTracking and no ConcurrencySlots, When four jobs of one key are
    sent with ``while_executing``, Then they run one at a time, each with a fencing token."""
    add_tracking(broker, bare_suite)
    broker.add_middleware(ExecutionLocks(suite=bare_suite), before=JobTracking)
    peak = Peak()

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing")
    def locked(key: str, i: int) -> None:
        peak.run(40)

    for i in range(4):
        locked.send("k", i)
    run_worker(threads=4)
    found = settled("locked", 4)
    assert {r.status for r in found} == {"succeeded"}
    assert peak.peak == 1
    assert sorted(r.fencing_token for r in found) == [1, 2, 3, 4]


def test_job_tracking_alone_keeps_rows_and_unique_sends(broker, bare_suite, run_worker):
    """Given JobTracking alone, Then a tracked actor gets its rows, and a unique actor whose lock
    type takes no execution lock is unique at send."""
    add_tracking(broker, bare_suite)

    @dramatiq.actor(track=True)
    def tracked(i: int) -> int:
        return i * 2

    @dramatiq.actor(unique_args=["i"], unique_lock="until_executing")
    def once(i: int) -> None:
        pass

    first, second = once.send(1), once.send(1)
    assert first.message_id == second.message_id
    message = tracked.send(21)
    run_worker(threads=2)
    wait_until(lambda: (dramatiq_unique.get_job(message.message_id) or JobModel()).status == "succeeded", timeout=10)
    assert dramatiq_unique.get_job(message.message_id).result == 42
    assert [r.status for r in settled("once", 1)] == ["succeeded"]


def test_setup_twice_on_one_broker_still_declares_actors(broker, database_url, key_prefix):
    """setup() called again for the same broker (tests do) doubles the middlewares; the
    order check takes each one's first place, so actors are declared as before."""
    for _ in range(2):
        dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)

    @dramatiq.actor(unique_args=["i"], concurrency_limit=2)
    def twice(i: int) -> None:
        pass

    assert twice.options["concurrency_limit"] == 2


# -- combinations refused when the actor is declared -----------------------------------------


def test_execution_locks_without_job_tracking_are_refused_at_declaration(broker, bare_suite):
    broker.add_middleware(ExecutionLocks(suite=bare_suite))
    with pytest.raises(InvalidOption) as error:
        @dramatiq.actor(unique_args=["i"])
        def no_rows(i: int) -> None:
            pass
    text = str(error.value)
    assert "'no_rows'" in text and "unique_args" in text and "add JobTracking" in text


def test_concurrency_slots_without_job_tracking_are_refused_at_declaration(broker, bare_suite):
    broker.add_middleware(ConcurrencySlots(suite=bare_suite))
    with pytest.raises(InvalidOption) as error:
        @dramatiq.actor(concurrency_limit=2)
        def no_rows(i: int) -> None:
            pass
    text = str(error.value)
    assert "'no_rows'" in text and "concurrency_limit" in text and "add JobTracking" in text


def test_an_execution_lock_without_execution_locks_is_refused(broker, bare_suite):
    """The default lock type holds an execution lock: without ExecutionLocks the job would run unlocked."""
    add_tracking(broker, bare_suite)
    with pytest.raises(InvalidOption) as error:
        @dramatiq.actor(unique_args=["i"])
        def unlocked(i: int) -> None:
            pass
    text = str(error.value)
    assert "'unlocked'" in text and "unique_lock='until_and_while_executing'" in text and "add ExecutionLocks" in text


def test_a_message_that_asks_for_an_execution_lock_without_execution_locks_is_refused(broker, bare_suite):
    """Given JobTracking alone and an actor whose lock type takes no execution lock, When one message
    asks for one (send_with_options), Then the send raises and nothing is recorded: the job would run
    unlocked.  The actor's own sends still go."""
    add_tracking(broker, bare_suite)

    @dramatiq.actor(unique_args=["i"], unique_lock="until_executing")
    def once(i: int) -> None:
        pass

    with pytest.raises(InvalidOption) as error:
        once.send_with_options(args=(1,), unique_lock="while_executing")
    assert "unique_lock='while_executing'" in str(error.value) and "add ExecutionLocks" in str(error.value)
    assert rows("once") == []
    once.send_with_options(args=(1,), unique_lock=None)  # None: the actor's own lock type
    assert len(rows("once")) == 1


def test_a_concurrency_option_without_concurrency_slots_is_refused_by_dramatiq(broker, bare_suite):
    add_tracking(broker, bare_suite)
    with pytest.raises(ValueError, match="concurrency_limit"):
        @dramatiq.actor(concurrency_limit=2)
        def unlimited(i: int) -> None:
            pass


def test_middlewares_out_of_order_are_refused(broker, bare_suite):
    add_tracking(broker, bare_suite)
    broker.add_middleware(ConcurrencySlots(suite=bare_suite))  # after JobTracking: its row would start first
    with pytest.raises(InvalidOption) as error:
        @dramatiq.actor(concurrency_limit=1)
        def disordered(i: int) -> None:
            pass
    assert "ConcurrencySlots, then JobTracking" in str(error.value)


def test_job_tracking_after_retries_is_refused(broker, bare_suite):
    broker.add_middleware(JobTracking(suite=bare_suite))  # appended: after Retries
    with pytest.raises(InvalidOption, match="before=Retries"):
        @dramatiq.actor(track=True)
        def late(i: int) -> None:
            pass


@pytest.mark.parametrize("middleware", [ExecutionLocks, ConcurrencySlots, JobTracking])
def test_a_bad_value_is_refused_whichever_middleware_is_installed(broker, bare_suite, middleware):
    broker.add_middleware(middleware(suite=bare_suite), before=Retries)
    options = {"concurrency_ttl": 0} if middleware is ConcurrencySlots else {"unique_args": ["i"], "unique_ttl": 0}
    with pytest.raises(InvalidOption, match="_ttl must be positive"):
        dramatiq.actor(**options)(lambda i: None)


def test_untracked_actors_need_no_suite_middleware(broker, bare_suite):
    """An actor with no suite option is declared whatever is installed, as before."""
    broker.add_middleware(ExecutionLocks(suite=bare_suite))
    broker.add_middleware(ConcurrencySlots(suite=bare_suite))

    @dramatiq.actor(max_retries=1)
    def plain(i: int) -> None:
        pass

    assert bare_suite.actor_config("plain") is None


def test_slots_alone_can_publish_woken_jobs_through_the_broker(broker, bare_suite, run_worker):
    """``local_handoff`` is ConcurrencySlots' too, for a broker without ExecutionLocks."""
    add_tracking(broker, bare_suite)
    slots = ConcurrencySlots(suite=bare_suite, local_handoff=False)
    broker.add_middleware(slots, before=JobTracking)
    assert slots.parking.delivery.local is False
    assert ConcurrencySlots(suite=bare_suite).parking.delivery.local is False  # None leaves it as set
    peak = Peak()

    @dramatiq.actor(concurrency_limit=1)
    def published(i: int) -> None:
        peak.run(30)

    for i in range(3):
        published.send(i)
    run_worker(threads=3)
    assert {r.status for r in settled("published", 3)} == {"succeeded"}
    assert peak.peak == 1


def test_heartbeat_renews_the_slot_and_row_without_execution_locks(broker, bare_suite, run_worker):
    """heartbeat() in a slot-limited job on a broker without ExecutionLocks: its slot's lease and
    its row's lease are renewed, and it reports the time left."""
    add_tracking(broker, bare_suite)
    broker.add_middleware(ConcurrencySlots(suite=bare_suite), before=JobTracking)
    left: list[float] = []

    @dramatiq.actor(concurrency_limit=1, concurrency_ttl=3_000, unique_ttl=5_000)
    def beating() -> None:
        time.sleep(0.05)
        left.append(dramatiq_unique.heartbeat())

    message = beating.send()
    run_worker(threads=2)
    wait_until(lambda: (dramatiq_unique.get_job(message.message_id) or JobModel()).status == "succeeded", timeout=10)
    assert len(left) == 1 and 2.5 < left[0] <= 3.0  # the shortest lease: the slot's

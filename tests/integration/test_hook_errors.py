"""Every error in the suite's before_* hooks reaches the caller as a DramatiqUniqueError
(dramatiq_unique.guard): Dramatiq would log any other one and send or run the job
unprotected.  On SQLite and PostgreSQL."""

from __future__ import annotations

import datetime
import json
import threading
import time

import dramatiq
import peewee as pw
import pytest
from dramatiq.encoder import PickleEncoder

import dramatiq_unique
from dramatiq_unique import (
    DramatiqUniqueError,
    DuplicateJob,
    HookFailed,
    InvalidOption,
    JobModel,
    JobRejected,
    submit,
)
from dramatiq_unique.middleware import gates, job_tracking
from dramatiq_unique.storage import jobs as store
from dramatiq_unique.unique import recent
from tests.helpers import queue_size, wait_until


def rows(actor_name: str) -> int:
    return JobModel.select().where(JobModel.actor_name == actor_name).count()


def failing(original, times=1):
    """``original``, but its first ``times`` calls raise RuntimeError; counts the calls."""
    calls = []

    def patched(*args, **kwargs):
        calls.append(1)
        if len(calls) <= times:
            raise RuntimeError("boom in the hook")
        return original(*args, **kwargs)

    patched.calls = calls
    return patched


def assert_wrapped(error):
    assert isinstance(error, HookFailed) and isinstance(error, DramatiqUniqueError)
    assert "RuntimeError: boom in the hook" in str(error)
    assert isinstance(error.__cause__, RuntimeError)


# -- before_enqueue: the send raises, nothing is published ---------------------------------


def test_an_error_in_job_tracking_before_enqueue_fails_the_send(suite, broker, monkeypatch):
    @dramatiq.actor(unique_args=True)
    def hooked_send(x):
        pass

    monkeypatch.setattr(job_tracking, "on_enqueue", failing(job_tracking.on_enqueue, times=99))
    with pytest.raises(DramatiqUniqueError) as error:
        hooked_send.send(1)
    assert_wrapped(error.value)
    assert "JobTracking.before_enqueue of hooked_send job" in str(error.value)
    assert queue_size(broker) == 0 and rows("hooked_send") == 0


def test_an_error_in_the_early_duplicate_check_fails_the_send(suite, broker, monkeypatch):
    @dramatiq.actor(unique_args=True)
    def early_send(x):
        pass

    monkeypatch.setattr(recent, "skip_early", failing(recent.skip_early, times=99))
    with pytest.raises(DramatiqUniqueError) as error:
        early_send.send(1)
    assert_wrapped(error.value)
    assert queue_size(broker) == 0 and rows("early_send") == 0


# -- before_process_message: the actor does not run, Retries retries -----------------------


@pytest.mark.parametrize(
    "module, name, options",
    [
        (job_tracking, "store", {"track": True}),
        (gates, "derive_key", {"unique_args": True, "unique_lock": "while_executing"}),
        (gates, "group_key", {"concurrency_limit": 2}),
    ],
    ids=["JobTracking", "ExecutionLocks", "ConcurrencySlots"],
)
def test_an_error_in_before_process_message_fails_the_attempt_and_retries_decide(
    suite, broker, worker, monkeypatch, module, name, options
):
    if name == "store":  # JobTracking starts the row through store.start
        patched = failing(store.start)
        monkeypatch.setattr(store, "start", patched)
    else:
        patched = failing(getattr(module, name))
        monkeypatch.setattr(module, name, patched)
    ran_after = []

    @dramatiq.actor(max_retries=3, min_backoff=20, max_backoff=50, **options)
    def hooked_run(x):
        ran_after.append(len(patched.calls))

    message = hooked_run.send(1)
    wait_until(lambda: getattr(dramatiq_unique.get_job(message.message_id), "status", None) == "succeeded", timeout=20)
    # The first attempt failed in the hook: the actor ran only on the retry.
    assert ran_after == [2]
    job = dramatiq_unique.get_job(message.message_id)
    assert job.attempts >= 1 and rows("hooked_run") == 1


# -- the cases seen --------------------------------------------------------------------------


@pytest.fixture
def pickle_encoder():
    previous = dramatiq.get_encoder()
    dramatiq.set_encoder(PickleEncoder())
    yield
    dramatiq.set_encoder(previous)


def test_a_pickled_date_gets_a_row_a_stable_key_and_one_holder_at_a_time(pickle_encoder, suite, broker, worker):
    """Seen: a PickleEncoder app sending a datetime.date to a while_executing actor had
    three holders of one key at once (the row's insert raised TypeError, swallowed)."""
    running, peak, seen = [0], [0], []
    guard = threading.Lock()

    @dramatiq.actor(unique_args=True, unique_lock="while_executing", unique_ttl=10_000)
    def on_day(day):
        with guard:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        seen.append(day)
        time.sleep(0.2)
        with guard:
            running[0] -= 1

    day = datetime.date(2024, 2, 29)
    messages = [on_day.send(day) for _ in range(3)]
    jobs = [dramatiq_unique.get_job(m.message_id) for m in messages]
    assert all(job is not None for job in jobs)
    assert len({job.unique_key for job in jobs}) == 1  # one key, whatever process derives it
    wait_until(lambda: all(dramatiq_unique.get_job(m.message_id).status == "succeeded" for m in messages), timeout=20)
    assert peak[0] == 1
    # Parked jobs are re-sent from their rows: they still get a date, not its text.
    assert seen == [day, day, day]


def test_until_executed_with_raise_and_a_pickled_date_refuses_duplicates(pickle_encoder, suite, broker, worker):
    """Seen: until_executed with raise: 3 messages, 0 rows, 3 runs."""
    runs = []

    @dramatiq.actor(unique_args=True, unique_lock="until_executed", unique_on_conflict="raise")
    def report_day(day):
        time.sleep(0.3)
        runs.append(day)

    day = datetime.date(2024, 3, 1)
    first = report_day.send(day)
    for _ in range(2):
        with pytest.raises(DuplicateJob):
            report_day.send(day)
    assert rows("report_day") == 1
    wait_until(lambda: dramatiq_unique.get_job(first.message_id).status == "succeeded", timeout=20)
    time.sleep(0.2)
    assert runs == [day]


def test_an_owner_too_long_is_refused_before_anything_is_sent(suite, broker):
    """Seen on PostgreSQL: submit(owner="o"*300) published the message, then LookupError."""

    @dramatiq.actor(track=True)
    def charge(amount):
        pass

    with pytest.raises(InvalidOption) as error:
        submit(charge, 1, idempotency_key="k1", owner="o" * 300)
    assert "owner" in str(error.value)
    with pytest.raises(InvalidOption):
        charge.send_with_options(args=(1,), idempotency_key="k2", owner="o" * 300)
    assert queue_size(broker) == 0 and rows("charge") == 0


class NarrowJob(JobModel):
    region = pw.CharField(max_length=5, null=True)

    class Meta:
        table_name = "narrow_jobs"


def test_a_value_its_column_cannot_hold_is_a_job_rejected(suite, broker, database_url):
    """A value too long for a job_model column: PostgreSQL raises DataError, which must not be swallowed."""

    @dramatiq.actor(job_model=NarrowJob)
    def regional(region):
        pass

    if "postgresql" in database_url:
        with pytest.raises(JobRejected) as error:
            regional.send("much-too-long")
        assert "DataError" in str(error.value)
        assert queue_size(broker) == 0 and NarrowJob.select().count() == 0
    else:  # SQLite does not enforce lengths
        regional.send("much-too-long")
        assert queue_size(broker) == 1 and NarrowJob.select().count() == 1


# -- the guard and the row encoding, without services ----------------------------------------

from decimal import Decimal  # noqa: E402

import redis  # noqa: E402
from dramatiq.middleware import SkipMessage  # noqa: E402

from dramatiq_unique import DatabaseUnavailable, RedisUnavailable  # noqa: E402
from dramatiq_unique.durable.messages import ENCODED, args_from_row, args_to_row  # noqa: E402
from dramatiq_unique.guard import hook  # noqa: E402
from dramatiq_unique.storage.models import dumps  # noqa: E402


class _Message:
    actor_name, message_id = "a", "m-1"


@pytest.mark.parametrize(
    "raised, expected",
    [
        (pw.OperationalError("server closed the connection"), DatabaseUnavailable),
        (pw.InterfaceError("connection already closed"), DatabaseUnavailable),
        (pw.DataError("value too long"), JobRejected),
        (redis.ConnectionError("refused"), RedisUnavailable),
        (redis.TimeoutError("timed out"), RedisUnavailable),
        (redis.ResponseError("ERR invalid expire time"), HookFailed),
        (TypeError("Object of type date is not JSON serializable"), HookFailed),
        (LookupError("no row"), HookFailed),
    ],
)
def test_the_guard_turns_every_error_into_a_suite_error_keeping_the_cause(raised, expected):
    class M:
        @hook
        def before_process_message(self, broker, message):
            raise raised

    with pytest.raises(expected) as error:
        M().before_process_message(None, _Message())
    assert error.value.__cause__ is raised
    assert type(raised).__name__ in str(error.value) and "M.before_process_message of a job m-1" in str(error.value)


@pytest.mark.parametrize(
    "raised", [SkipMessage("parked"), DuplicateJob("taken"), InvalidOption("bad"), KeyboardInterrupt()]
)
def test_the_guard_lets_skips_our_errors_and_interrupts_through_untouched(raised):
    class M:
        @hook
        def before_enqueue(self, broker, message, delay):
            raise raised

    with pytest.raises(type(raised)) as error:
        M().before_enqueue(None, _Message(), None)
    assert error.value is raised


def test_arguments_json_cannot_hold_survive_the_row_with_a_pickle_encoder(pickle_encoder):
    args = (datetime.date(2024, 2, 29), {1: "a"}, (1, 2), Decimal("1.5"), {"x"}, "plain", [1, {"k": None}])
    kwargs = {"when": datetime.datetime(2024, 1, 1, 12), "n": 3}
    row_args, row_kwargs = args_to_row(args, kwargs)
    text_args, text_kwargs = dumps(row_args), dumps(row_kwargs)  # what the JSON columns hold
    assert "datetime.date(2024, 2, 29)" in text_args  # readable by a person
    assert row_args[5:] == ["plain", [1, {"k": None}]] and row_kwargs["n"] == 3
    assert args_from_row(json.loads(text_args), json.loads(text_kwargs)) == (args, kwargs)


def test_with_the_json_encoder_plain_arguments_are_stored_as_they_are_and_others_refused():
    assert args_to_row((1, (2, 3), {1: "a"}), {"k": [None]}) == ([1, (2, 3), {1: "a"}], {"k": [None]})
    with pytest.raises(JobRejected, match="argument 0 \\(date\\) cannot be stored"):
        args_to_row((datetime.date(2024, 2, 29),), {})
    assert ENCODED == "__dramatiq_unique_encoded__"


def test_an_error_declaring_a_tracked_actor_is_raised_not_logged(suite, monkeypatch):
    """Dramatiq would log it and declare the actor untracked: its sends unprotected."""

    def broken(model):
        raise pw.OperationalError("could not create the job table")

    monkeypatch.setattr(suite, "register_model", broken)

    class OwnTable(JobModel):
        class Meta:
            table_name = "own_table_jobs"

    with pytest.raises(DatabaseUnavailable, match="JobTracking.before_declare_actor of actor declared_badly"):

        @dramatiq.actor(unique_args=True, job_model=OwnTable)
        def declared_badly(x):
            pass

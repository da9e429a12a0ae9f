"""A send's own options (send_with_options, submit) are checked at send, before anything is
written or published, with the errors of a declaration.  On SQLite and PostgreSQL."""

from __future__ import annotations

import dramatiq
import pytest
from dramatiq.encoder import PickleEncoder

import dramatiq_unique
from dramatiq_unique import InvalidOption, JobModel, JobRejected, submit
from dramatiq_unique.durable.messages import rebuild
from tests.helpers import queue_size

HUGE = "x" * 100_000


def rows() -> int:
    return JobModel.select().count()


@pytest.fixture
def unique(suite):
    @dramatiq.actor(unique_args=["report_id"], unique_lock="until_executed")
    def unique(report_id, user=None):
        pass

    return unique


@pytest.fixture
def limited(suite):
    @dramatiq.actor(concurrency_limit=2, concurrency_key=["tenant"])
    def limited(tenant):
        pass

    return limited


BAD = [
    ("unique_lock", "bogus", "unique_lock must be one of"),
    ("unique_lock", HUGE, "unique_lock must be one of"),
    ("unique_lock", ["until_executed"], "unique_lock must be one of"),
    ("unique_on_conflict", {"raise": 1}, "unique_on_conflict must be one of"),
    ("unique_order_by", 7, "unique_order_by must be one of"),
    ("unique_args", ["nope"], "names 'nope'"),
    ("unique_args", "report_id", "list of parameter names"),
    ("unique_args", [["report_id"]], "entries must be parameter names"),
    ("unique_args", False, "not False"),
    ("unique_ttl", -5, "unique_ttl must be positive"),
    ("unique_ttl", 0, "unique_ttl must be positive"),
    ("unique_ttl", 0.5, "whole number of milliseconds"),
    ("unique_ttl", 1.5, "whole number of milliseconds"),
    ("unique_ttl", float("nan"), "whole number of milliseconds"),
    ("unique_ttl", "60000", "whole number of milliseconds"),
    ("unique_ttl", True, "whole number of milliseconds"),
    ("unique_window", [1000], "whole number of milliseconds"),
    ("unique_window", 0.25, "whole number of milliseconds"),
    ("concurrency_limit", -1, "concurrency_limit must be a whole number"),
    ("concurrency_limit", "3", "concurrency_limit must be a whole number"),
    ("concurrency_limit", True, "concurrency_limit must be a whole number"),
    ("concurrency_limit", 2.5, "concurrency_limit must be a whole number"),
    ("concurrency_ttl", 0.9, "whole number of milliseconds"),
    ("concurrency_key", ["nope"], "names 'nope'"),
    ("job_model", JobModel, "job_model cannot be set per message"),
    ("track", "yes", "track must be True or False"),
    ("idempotency_key", HUGE, "idempotency_key must be"),
    ("owner", {"a": [1]}, "owner must be a str"),
]


@pytest.mark.parametrize("name, value, fragment", BAD, ids=[f"{n}={str(v)[:12]}" for n, v, _ in BAD])
def test_a_bad_option_at_send_raises_and_publishes_nothing(suite, broker, unique, name, value, fragment):
    with pytest.raises(InvalidOption, match=fragment) as error:
        unique.send_with_options(args=(1,), **{name: value})
    assert len(str(error.value)) < 500  # a huge value does not make a huge message
    assert queue_size(broker) == 0 and rows() == 0


@pytest.mark.parametrize(
    "name, value", [("concurrency_limit", -1), ("concurrency_ttl", 0.5), ("concurrency_key", ["x"])]
)
def test_a_slot_actor_refuses_bad_limits_at_send(suite, broker, limited, name, value):
    with pytest.raises(InvalidOption, match=name):
        limited.send_with_options(args=("t",), **{name: value})
    assert queue_size(broker) == 0 and rows() == 0


def test_good_options_at_send_still_pass(suite, broker, unique):
    unique.send_with_options(args=(1,), unique_ttl=5000, unique_lock="until_executing")
    unique.send_with_options(args=(2,), unique_ttl=5000.0, unique_args=True, max_retries=None)
    assert queue_size(broker) == 2 and rows() == 2


def test_unique_args_naming_no_parameter_does_not_merge_every_message(suite, broker, unique):
    """Seen: unique_args=["nope"] made one key of every message, so jobs were dropped."""
    unique.send(1)
    with pytest.raises(InvalidOption):
        unique.send_with_options(args=(2,), unique_args=["nope"])
    unique.send(2)
    assert queue_size(broker) == 2 and rows() == 2


def test_suite_options_on_a_message_of_an_untracked_actor_are_refused(suite, broker, unique):
    @dramatiq.actor
    def plain(x):
        pass

    with pytest.raises(InvalidOption, match="does not track"):
        plain.send_with_options(args=(1,), unique_args=True)
    plain.send(1)
    assert queue_size(broker) == 1


def test_a_sentinel_default_in_the_key_is_refused_at_declaration(suite):
    missing = object()
    with pytest.raises(InvalidOption, match="memory address"):

        @dramatiq.actor(unique_args=True)
        def sentinel(x, since=missing):
            pass


@pytest.fixture
def pickle_encoder():
    previous = dramatiq.get_encoder()
    dramatiq.set_encoder(PickleEncoder())
    yield
    dramatiq.set_encoder(previous)


def test_an_argument_without_a_stable_form_is_refused_at_send(pickle_encoder, suite, broker):
    @dramatiq.actor(unique_args=True)
    def addressed(x):
        pass

    with pytest.raises(InvalidOption, match="memory address"):
        addressed.send(Opaque())
    assert queue_size(broker) == 0 and rows() == 0


class Opaque:
    """No __repr__: its repr names its address."""


def test_a_dict_with_mixed_key_types_is_one_key(suite, broker):
    """Seen: a dict argument with mixed key types raised a raw TypeError (sort_keys)."""

    @dramatiq.actor(unique_args=True)
    def mixed(options):
        pass

    first = mixed.send({1: "a", "b": 2})
    again = mixed.send({"b": 2, 1: "a"})
    assert again.message_id == first.message_id  # the duplicate was skipped
    assert queue_size(broker) == 1 and rows() == 1


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"idempotency_key": "k", "owner": "o" * 300}, "owner must be a str of at most 255"),
        ({"idempotency_key": "k" * 256}, "idempotency_key must be"),
        ({"idempotency_key": ""}, "idempotency_key must be"),
        ({"idempotency_key": 5}, "idempotency_key must be"),
    ],
)
def test_submit_refuses_bad_keys_and_owners_before_sending(suite, broker, unique, kwargs, fragment):
    with pytest.raises(InvalidOption, match=fragment):
        submit(unique, 1, **kwargs)
    assert queue_size(broker) == 0 and rows() == 0


@pytest.mark.parametrize("delay", ["5", float("nan"), float("inf"), True, [5], 10**15])
def test_a_bad_delay_is_refused_before_anything_is_sent(suite, broker, unique, delay):
    with pytest.raises(InvalidOption, match="delay must be"):
        unique.send_with_options(args=(1,), delay=delay)
    with pytest.raises(InvalidOption, match="delay must be"):
        submit(unique, 2, idempotency_key="k", delay=delay)
    assert queue_size(broker) == 0 and rows() == 0


@pytest.mark.parametrize(
    "name, value", [("unique_window", 10**15), ("unique_ttl", 10**30), ("concurrency_ttl", 10**13)]
)
def test_a_time_past_ten_years_is_a_unit_mistake(suite, broker, unique, limited, name, value):
    actor = limited if name == "concurrency_ttl" else unique
    with pytest.raises(InvalidOption, match="at most"):
        actor.send_with_options(args=(1,), **{name: value})
    assert queue_size(broker) == 0 and rows() == 0


def by_report(report_id, user=None):
    return f"report-{report_id}"


def test_a_callable_key_on_one_message_needs_an_encoder_that_can_carry_it(suite, broker, unique):
    """The JSON encoder cannot carry a function: a clear JobRejected, nothing sent."""
    with pytest.raises(JobRejected, match="option unique_args \\(function\\) cannot be stored"):
        unique.send_with_options(args=(1,), unique_args=by_report)
    assert queue_size(broker) == 0 and rows() == 0


def test_a_callable_key_on_one_message_works_with_pickle_and_its_row_keeps_it(pickle_encoder, suite, broker, unique):
    first = unique.send_with_options(args=(1, "ann"), unique_args=by_report)
    again = unique.send_with_options(args=(1, "bob"), unique_args=by_report)
    assert again.message_id == first.message_id and queue_size(broker) == 1 and rows() == 1
    rebuilt = rebuild(dramatiq_unique.get_job(first.message_id))
    assert rebuilt.options["unique_args"] is by_report and rebuilt.args == (1, "ann")

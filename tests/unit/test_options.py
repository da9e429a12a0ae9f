"""Unit tests of dramatiq_unique.options: validation and look-up, no services."""

import pytest

from dramatiq_unique import InvalidOption
from dramatiq_unique.errors import DramatiqUniqueError
from dramatiq_unique.options import is_tracked, lookup, validate


def report(report_id, user=None):
    pass


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"unique_args": ["nope"]}, "names 'nope'"),
        ({"unique_args": "report_id"}, "list of parameter names"),
        ({"unique_args": False}, "not False"),
        ({"unique_args": True, "unique_lock": "until_lunch"}, "unique_lock must be one of"),
        ({"unique_args": True, "unique_on_conflict": "ignore"}, "unique_on_conflict must be one of"),
        ({"unique_args": True, "unique_ttl": -1}, "unique_ttl must be positive"),
        ({"unique_args": True, "unique_ttl": 0}, "unique_ttl must be positive"),
        ({"unique_args": True, "unique_window": -5}, "unique_window must be positive"),
        ({"unique_args": True, "unique_ttl": "60s"}, "number of milliseconds"),
        ({"unique_args": True, "unique_order_by": "priority"}, "unique_order_by must be one of"),
        ({"unique_lock": "until_executed"}, "no effect without unique_args"),
        ({"concurrency_limit": -1}, "concurrency_limit"),
        ({"concurrency_key": ["tenant"]}, "names 'tenant'"),
        ({"concurrency_ttl": 0}, "concurrency_ttl must be positive"),
        ({"track": "yes"}, "track must be True or False"),
    ],
)
def test_bad_option_values_name_the_option(options, fragment):
    with pytest.raises(InvalidOption) as error:
        validate(options, report)
    assert fragment in str(error.value)
    # A MiddlewareError, so Dramatiq does not swallow it at declaration.
    assert isinstance(error.value, DramatiqUniqueError)
    assert isinstance(error.value, ValueError)


@pytest.mark.parametrize(
    "options",
    [
        {"unique_args": ["report_id"]},
        {"unique_args": ["report_id", "user"], "unique_lock": "until_executed", "unique_on_conflict": "raise"},
        {"unique_args": True, "unique_window": 1000, "unique_lock": "until_expired"},
        {"unique_args": lambda report_id, user=None: str(report_id)},
        {"track": True, "unique_ttl": 5000},
        {"concurrency_limit": 0},
    ],
)
def test_good_option_values_pass(options):
    validate(options, report)


def test_lookup_prefers_message_then_actor_then_default_and_keeps_falsy_values():
    assert lookup({"x": 0}, {"x": 5}, "x", 9) == 0
    assert lookup({"x": None}, {"x": 5}, "x", 9) == 5
    assert lookup({}, {"x": False}, "x", True) is False
    assert lookup({}, {}, "x", 9) == 9


def test_any_suite_option_implies_tracking():
    assert not is_tracked({})
    assert not is_tracked({"max_retries": 3})
    assert is_tracked({"track": True})
    assert is_tracked({"unique_args": ["a"]})
    assert is_tracked({"concurrency_limit": 2})
    assert is_tracked({"track": False, "unique_args": ["a"]})


# -- issue 12, item 8: times, choices and keys that cannot be stable ---------------------------

from dramatiq_unique.options import validate_message  # noqa: E402

_SENTINEL = object()


def with_sentinel(report_id, since=_SENTINEL):
    pass


@pytest.mark.parametrize("name", ["unique_ttl", "unique_window", "concurrency_ttl", "idempotency_window"])
@pytest.mark.parametrize(
    "value", [0.5, 0.999, 1.5, float("nan"), float("inf"), "1000", True, [1000], {"ms": 1}, 10**12]
)
def test_times_are_whole_milliseconds_of_at_least_one(name, value):
    options = {"unique_args": True, name: value}
    with pytest.raises(InvalidOption, match=name):
        validate(options, report)


@pytest.mark.parametrize("value", [1, 1000, 60_000.0])
def test_whole_milliseconds_pass_even_as_a_float_with_no_fraction(value):
    validate({"unique_args": True, "unique_ttl": value, "unique_window": value}, report)


@pytest.mark.parametrize("name", ["unique_lock", "unique_on_conflict", "unique_order_by"])
@pytest.mark.parametrize("value", [["until_executed"], {"a": 1}, 3, "x" * 10_000])
def test_a_choice_of_any_type_is_an_invalid_option_with_a_short_message(name, value):
    with pytest.raises(InvalidOption, match=f"{name} must be one of") as error:
        validate({"unique_args": True, name: value}, report)
    assert len(str(error.value)) < 400


@pytest.mark.parametrize("spec", [True, ["since"]])
def test_a_key_default_with_a_memory_address_is_refused_at_declaration(spec):
    with pytest.raises(InvalidOption, match="memory address"):
        validate({"unique_args": spec}, with_sentinel)
    with pytest.raises(InvalidOption, match="memory address"):
        validate({"concurrency_key": spec}, with_sentinel)


def test_a_key_that_leaves_out_the_sentinel_is_fine():
    validate({"unique_args": ["report_id"]}, with_sentinel)
    validate({"unique_args": lambda report_id, since=None: str(report_id)}, with_sentinel)


@pytest.mark.parametrize(
    "message_options, fragment",
    [
        ({"unique_lock": "bogus"}, "unique_lock must be one of"),
        ({"unique_args": ["nope"]}, "names 'nope'"),
        ({"concurrency_limit": -1}, "concurrency_limit must be a whole number"),
        ({"concurrency_limit": "3"}, "concurrency_limit must be a whole number"),
        ({"concurrency_limit": True}, "concurrency_limit must be a whole number"),
        ({"unique_ttl": -5}, "unique_ttl must be positive"),
        ({"unique_ttl": 0.5}, "whole number of milliseconds"),
        ({"unique_window": "5s"}, "whole number of milliseconds"),
        ({"unique_on_conflict": ["raise"]}, "unique_on_conflict must be one of"),
        ({"job_model": object}, "job_model cannot be set per message"),
        ({"idempotency_key": ""}, "idempotency_key must be"),
        ({"owner": "o" * 300}, "owner must be a str of at most 255"),
        ({"owner": 5}, "owner must be a str"),
    ],
)
def test_a_message_option_is_checked_as_at_declaration(message_options, fragment):
    with pytest.raises(InvalidOption, match=fragment):
        validate_message(message_options, {"unique_args": ["report_id"]}, report)


def test_message_options_resolve_over_the_actor_before_the_check():
    # The actor's unique_args makes the message's unique_lock meaningful...
    validate_message({"unique_lock": "until_executed"}, {"unique_args": ["report_id"]}, report)
    # ...and a message's own unique_lock on an actor without unique_args does nothing.
    with pytest.raises(InvalidOption, match="no effect without unique_args"):
        validate_message({"unique_lock": "until_executed"}, {"track": True}, report)
    validate_message({"max_retries": 3, "unique_ttl": None}, {"track": True}, report)

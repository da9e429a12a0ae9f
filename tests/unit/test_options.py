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

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


# -- times, choices and keys that cannot be stable ---------------------------

from dramatiq_unique.options import check_send  # noqa: E402

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
        check_send(message_options, {"unique_args": ["report_id"]}, report)


def test_message_options_resolve_over_the_actor_before_the_check():
    # The actor's unique_args makes the message's unique_lock meaningful...
    check_send({"unique_lock": "until_executed"}, {"unique_args": ["report_id"]}, report)
    # ...and a message's own unique_lock on an actor without unique_args does nothing.
    with pytest.raises(InvalidOption, match="no effect without unique_args"):
        check_send({"unique_lock": "until_executed"}, {"track": True}, report)
    check_send({"max_retries": 3, "unique_ttl": None}, {"track": True}, report)


# -- each middleware declares the options it reads; which combinations are refused ---

from dramatiq_unique import options as opt  # noqa: E402
from dramatiq_unique.middleware import ConcurrencySlots, ExecutionLocks, JobTracking  # noqa: E402
from dramatiq_unique.options import LOCKS, RETRIES, SLOTS, TRACKING, check, needed  # noqa: E402


def declared(cls) -> set:
    return set(cls.actor_options)


def test_each_middleware_declares_the_options_it_reads_and_together_all_of_them():
    assert declared(JobTracking) == opt.TRACKING_OPTIONS | opt.UNIQUE_OPTIONS
    assert declared(ExecutionLocks) == {"unique_args", "unique_lock", "unique_ttl", "unique_order_by"}
    assert {"concurrency_limit", "concurrency_key", "concurrency_ttl"} <= declared(ConcurrencySlots)
    assert declared(JobTracking) | declared(ExecutionLocks) | declared(ConcurrencySlots) == opt.SUITE_OPTIONS
    assert not declared(ConcurrencySlots) & {"track", "job_model", "unique_args"}


def test_each_middleware_names_its_capability():
    assert (JobTracking.capability, ExecutionLocks.capability, ConcurrencySlots.capability) == (TRACKING, LOCKS, SLOTS)


@pytest.mark.parametrize(
    "options, needs",
    [
        ({}, set()),
        ({"max_retries": 2}, set()),
        ({"track": True}, {TRACKING}),
        ({"unique_args": ["a"]}, {LOCKS, TRACKING}),
        ({"unique_args": ["a"], "unique_lock": "while_executing"}, {LOCKS, TRACKING}),
        ({"unique_args": ["a"], "unique_lock": "until_executing"}, {TRACKING}),
        ({"unique_args": ["a"], "unique_lock": "until_executed"}, {TRACKING}),
        ({"unique_args": ["a"], "unique_lock": "until_expired", "unique_window": 10}, {TRACKING}),
        ({"concurrency_limit": 2}, {SLOTS, TRACKING}),
        ({"concurrency_key": ["a"]}, {SLOTS, TRACKING}),
        ({"concurrency_limit": 1, "unique_args": ["a"]}, {SLOTS, LOCKS, TRACKING}),
    ],
)
def test_what_an_actor_needs(options, needs):
    assert set(needed(options)) == needs


ALL = [SLOTS, LOCKS, TRACKING, RETRIES]


@pytest.mark.parametrize(
    "options, installed",
    [
        ({"unique_args": ["a"], "concurrency_limit": 1}, ALL),
        ({"unique_args": ["a"], "concurrency_limit": 1}, [None, SLOTS, None, LOCKS, TRACKING, None, RETRIES]),
        ({"unique_args": ["a"]}, [LOCKS, TRACKING]),  # no Retries: nothing to be before
        ({"concurrency_limit": 1}, [SLOTS, TRACKING, RETRIES]),
        ({"unique_args": ["a"], "unique_lock": "until_executed"}, [TRACKING, RETRIES]),
        ({"track": True}, [TRACKING, RETRIES, SLOTS, LOCKS]),  # what it does not need may sit anywhere
        ({}, []),
        ({"max_retries": 1}, [RETRIES, TRACKING]),
        # setup() twice on one broker: each one's first place counts
        ({"unique_args": ["a"], "concurrency_limit": 1}, [SLOTS, SLOTS, LOCKS, LOCKS, TRACKING, TRACKING, RETRIES]),
    ],
)
def test_combinations_that_work(options, installed):
    check("job", options, installed)


@pytest.mark.parametrize(
    "options, installed, fragments",
    [
        ({"unique_args": ["a"]}, [LOCKS, RETRIES], ["'job'", "unique_args", "add JobTracking"]),
        ({"concurrency_key": ["a"]}, [SLOTS, RETRIES], ["concurrency_key", "add JobTracking"]),
        ({"unique_args": ["a"]}, [TRACKING, RETRIES],
         ["unique_lock='until_and_while_executing'", "add ExecutionLocks"]),
        ({"concurrency_limit": 1}, [TRACKING, RETRIES], ["concurrency_limit", "add ConcurrencySlots"]),
        ({"concurrency_limit": 1}, [TRACKING, SLOTS, RETRIES], ["ConcurrencySlots, then JobTracking"]),
        ({"unique_args": ["a"]}, [TRACKING, LOCKS], ["ExecutionLocks, then JobTracking"]),
        ({"unique_args": ["a"], "concurrency_limit": 1}, [LOCKS, SLOTS, TRACKING],
         ["ConcurrencySlots, then ExecutionLocks, then JobTracking"]),
        ({"track": True}, [RETRIES, TRACKING], ["before=Retries"]),
    ],
)
def test_combinations_refused_name_the_actor_option_and_middleware(options, installed, fragments):
    with pytest.raises(InvalidOption) as error:
        check("job", options, installed)
    for fragment in fragments:
        assert fragment in str(error.value)

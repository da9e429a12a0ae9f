"""Unit tests of dramatiq_unique.keys: unique keys, no services."""

import pytest

from dramatiq_unique import InvalidOption
from dramatiq_unique.keys import RedisKeys, derive_key


def report(report_id, user=None, options=None):
    pass


def test_positional_and_keyword_calls_give_the_same_key():
    assert derive_key("report", report, ["report_id"], (1,), {}) == derive_key(
        "report", report, ["report_id"], (), {"report_id": 1}
    )


def test_only_the_selected_arguments_count():
    assert derive_key("report", report, ["report_id"], (1, "ann"), {}) == derive_key(
        "report", report, ["report_id"], (1, "bob"), {}
    )
    assert derive_key("report", report, ["report_id"], (1,), {}) != derive_key("report", report, ["report_id"], (2,), {})


def test_all_arguments_with_true_and_defaults_filled_in():
    assert derive_key("report", report, True, (1,), {}) == derive_key("report", report, True, (1, None), {})
    assert derive_key("report", report, True, (1, "ann"), {}) != derive_key("report", report, True, (1, "bob"), {})


def test_dict_order_does_not_matter():
    a = derive_key("report", report, True, (1,), {"options": {"a": 1, "b": 2}})
    b = derive_key("report", report, True, (1,), {"options": {"b": 2, "a": 1}})
    assert a == b


def test_the_key_names_the_actor_and_hides_the_arguments():
    key = derive_key("report", report, True, ("alice@example.com",), {})
    assert key.startswith("report:")
    assert "alice" not in key
    assert derive_key("other", report, True, (1,), {}) != derive_key("report", report, True, (1,), {})


def test_a_callable_chooses_the_key():
    key = derive_key("report", report, lambda report_id, **_: f"r{report_id}", (7,), {"user": "x"})
    assert key == derive_key("report", report, lambda report_id, **_: f"r{report_id}", (7,), {"user": "y"})
    with pytest.raises(InvalidOption):
        derive_key("report", report, lambda *a, **k: 7, (7,), {})


def test_arguments_that_do_not_fit_the_signature_are_a_clear_error():
    with pytest.raises(InvalidOption, match="do not fit"):
        derive_key("report", report, True, (1, 2, 3, 4), {})


def test_off_without_a_spec():
    assert derive_key("report", report, None, (1,), {}) is None


def test_redis_keys_share_one_prefix():
    keys = RedisKeys("p")
    assert keys.queue_lock("k") == "p:queue:k"
    assert keys.execution_lock("k").startswith("p:")

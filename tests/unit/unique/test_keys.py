"""Unit tests of dramatiq_unique.unique.keys and dramatiq_unique.redis.keys: unique keys, no services."""

import pytest

from dramatiq_unique import InvalidOption
from dramatiq_unique.redis.keys import RedisKeys
from dramatiq_unique.unique.keys import derive_key


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
    assert derive_key("report", report, ["report_id"], (1,), {}) != derive_key(
        "report", report, ["report_id"], (2,), {}
    )


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


# -- keys that are the same in every process -----------------------------------------

import datetime  # noqa: E402
import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from dramatiq_unique.unique.keys import canonical  # noqa: E402


def test_a_dict_with_mixed_key_types_has_one_key_whatever_its_order():
    a = derive_key("report", report, True, (1,), {"options": {1: "a", "b": 2, (3, 4): None}})
    b = derive_key("report", report, True, (1,), {"options": {(3, 4): None, "b": 2, 1: "a"}})
    assert a == b
    assert a != derive_key("report", report, True, (1,), {"options": {"1": "a", "b": 2, (3, 4): None}})


def test_a_str_keyed_dict_keeps_the_key_it_always_had():
    assert canonical({"b": 2, "a": [1, (2, 3)]}) == '{"a":[1,[2,3]],"b":2}'


def test_an_argument_with_a_memory_address_in_its_repr_is_an_invalid_option():
    with pytest.raises(InvalidOption, match="memory address"):
        derive_key("report", report, True, (object(),), {})


def test_dates_sets_and_mixed_dicts_give_the_same_key_in_another_process():
    """Hash randomisation changes set order and object addresses from process to process."""
    code = (
        "import datetime\n"
        "from tests.unit.unique.test_keys import report\n"
        "from dramatiq_unique.unique.keys import derive_key\n"
        "print(derive_key('report', report, True, (datetime.date(2024, 2, 29),),"
        " {'options': {'tags': {'x', 'y', 'z', 'w'}, 1: 'a', 'b': 2}}))\n"
    )
    keys = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=pathlib.Path(__file__).parents[3],
                       env={"PYTHONHASHSEED": str(seed), "PATH": "/usr/bin:/bin"}).stdout.strip()
        for seed in (1, 2, 3)
    }
    here = derive_key("report", report, True, (datetime.date(2024, 2, 29),),
                      {"options": {"tags": {"w", "z", "y", "x"}, "b": 2, 1: "a"}})
    assert keys == {here}

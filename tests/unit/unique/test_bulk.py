"""send_many's item forms and batching (dramatiq_unique.unique.bulk), without services."""

from __future__ import annotations

import pytest

from dramatiq_unique import InvalidOption
from dramatiq_unique.suite import Settings
from dramatiq_unique.unique.bulk import batches, items_of


def test_each_item_form_becomes_args_and_kwargs():
    assert items_of([(1, 2), [3], {"a": 1}, ((4,), {"b": 2}), ([5], {}), ()]) == [
        ((1, 2), {}), ((3,), {}), ((), {"a": 1}), ((4,), {"b": 2}), ((5,), {}), ((), {}),
    ]
    assert items_of(iter([(1,)])) == [((1,), {})], "any iterable"
    assert items_of([]) == []


def test_a_pair_needs_a_sequence_then_a_dict():
    # (1, {"a": 1}) is two positional arguments: the first is not an args sequence
    assert items_of([(1, {"a": 1})]) == [((1, {"a": 1}), {})]


@pytest.mark.parametrize("bad", [[1], [None], ["ab"], [{1: 2}], [((1,), {2: 3})], "ab", {"a": 1}])
def test_bad_items_are_refused_before_anything_is_sent(bad):
    with pytest.raises(InvalidOption):
        items_of(bad)


def test_batches_split_in_order():
    items = [((i,), {}) for i in range(7)]
    assert [len(b) for b in batches(items, 3)] == [3, 3, 1]
    assert [item for b in batches(items, 3) for item in b] == items
    assert batches([], 3) == []


@pytest.mark.parametrize("value", [0, -1, True, "10"])
def test_the_batch_setting_is_checked(value):
    with pytest.raises(InvalidOption):
        Settings(send_many_batch=value)
    assert Settings().send_many_batch == 1_000

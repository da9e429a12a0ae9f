"""Parking group names (dramatiq_unique.parking.groups): deployed data, byte for byte; no services."""

from __future__ import annotations

import pytest

from dramatiq_unique.parking.groups import (
    actor_of,
    kind_of,
    lock_group,
    slot_group,
    slot_groups_of,
    slot_key_of,
    unique_key_of,
    whole_actor,
)


def test_a_lock_group_is_lock_colon_its_unique_key_and_back():
    group = lock_group("report:0a1b")
    assert group == "lock:report:0a1b"
    assert (kind_of(group), unique_key_of(group), actor_of(group)) == ("lock", "report:0a1b", "report")


def test_a_slot_group_is_slot_colon_its_group_key_and_back():
    keyed, whole = slot_group("send_webhook:9f8e"), slot_group(whole_actor("send_webhook"))
    assert (keyed, whole) == ("slot:send_webhook:9f8e", "slot:send_webhook:all")
    assert (kind_of(keyed), slot_key_of(keyed), actor_of(keyed)) == ("slot", "send_webhook:9f8e", "send_webhook")
    assert actor_of(whole) == "send_webhook"
    assert keyed.startswith(slot_groups_of("send_webhook")) and whole.startswith(slot_groups_of("send_webhook"))
    assert not slot_group("send_webhook_v2:all").startswith(slot_groups_of("send_webhook"))


@pytest.mark.parametrize("make", [lock_group, slot_group])
def test_an_actor_name_with_colons_is_read_back_whole(make):
    group = make("billing:invoice:3c4d")
    assert actor_of(group) == "billing:invoice"
    assert kind_of(group) in ("lock", "slot")

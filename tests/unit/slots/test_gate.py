"""Slot groups and run-time limit arguments (dramatiq_unique.slots.gate, dramatiq_unique.slots.limits): no services."""

from __future__ import annotations

import pytest

from dramatiq_unique import InvalidOption, JobModel
from dramatiq_unique.parking.groups import actor_of, slot_group
from dramatiq_unique.slots.gate import UNLIMITED, declared_limit, group_key
from dramatiq_unique.slots.limits import _check_limit, key_group
from dramatiq_unique.suite import ActorConfig


def config(fn, **options) -> ActorConfig:
    return ActorConfig(fn.__name__, fn, options, JobModel, ())


def send_webhook(customer, url, attempt=1):
    pass


@pytest.mark.parametrize(
    "spec, args, kwargs, key",
    [
        (["customer"], ("acme", "https://a"), {}, "acme"),
        (["customer"], (), {"customer": "acme", "url": "https://b"}, "acme"),
        (["customer"], (42, "https://a"), {}, 42),
        (["customer", "url"], ("acme", "https://a"), {}, {"url": "https://a", "customer": "acme"}),
        (["customer", "url"], ("acme", "https://a"), {}, ("acme", "https://a")),
        (lambda customer, url, attempt=1: customer.upper(), ("acme", "https://a"), {}, "ACME"),
        (True, ("acme", "https://a"), {}, {"customer": "acme", "url": "https://a", "attempt": 1}),
    ],
)
def test_a_key_names_the_group_a_message_lands_in(spec, args, kwargs, key):
    """set_concurrency_limit(..., key=k) must address the very group the worker derives from the arguments."""
    cfg = config(send_webhook, concurrency_limit=2, concurrency_key=spec)
    assert key_group(cfg, key) == group_key(cfg, {}, args, kwargs)


def test_the_type_of_a_key_matters():
    cfg = config(send_webhook, concurrency_limit=2, concurrency_key=["customer"])
    assert key_group(cfg, "42") != group_key(cfg, {}, (42, "u"), {})


def test_groups_without_a_key_are_per_actor_and_name_their_actor():
    cfg = config(send_webhook, concurrency_limit=2)
    group = slot_group(group_key(cfg, {}, ("acme", "u"), {}))
    assert group == "slot:send_webhook:all"
    assert group == slot_group(group_key(cfg, {}, ("other", "v"), {}))
    keyed = slot_group(group_key(config(send_webhook, concurrency_key=["customer"]), {}, ("acme", "u"), {}))
    assert actor_of(group) == actor_of(keyed) == "send_webhook"
    assert "acme" not in keyed, "only a hash of the arguments reaches Redis"


def test_a_message_may_override_the_slot_options():
    cfg = config(send_webhook, concurrency_limit=2)
    assert (declared_limit(cfg), declared_limit(cfg.for_message({"concurrency_limit": 5}))) == (2, 5)
    assert declared_limit(config(send_webhook, concurrency_key=["customer"])) == UNLIMITED
    assert cfg.concurrency_ttl == 60_000 and cfg.for_message({"concurrency_ttl": 500}).concurrency_ttl == 500
    assert not config(send_webhook, track=True).has_slots
    assert config(send_webhook, track=True).for_message({"concurrency_limit": 1}).has_slots
    assert cfg.for_message({"concurrency_limit": None}) is cfg, "None: the actor's value"


@pytest.mark.parametrize("limit", [-1, 1.5, True, "3", [2], 2**31, 10**20])
def test_bad_limits(limit):
    with pytest.raises(InvalidOption):
        _check_limit(limit)


@pytest.mark.parametrize("limit", [None, 0, 1, 500, 2**31 - 1])
def test_good_limits(limit):
    _check_limit(limit)


@pytest.mark.parametrize(
    "spec, key",
    [
        (None, "acme"),
        (["customer", "url"], "acme"),
        (["customer", "url"], {"customer": "acme"}),
        (["customer", "url"], ("acme",)),
        (lambda customer, url, attempt=1: customer, 42),
        (True, "acme"),
    ],
)
def test_keys_that_name_no_group(spec, key):
    cfg = config(send_webhook, concurrency_limit=2, concurrency_key=spec)
    with pytest.raises(InvalidOption):
        key_group(cfg, key)

"""An operator's words as keys (dramatiq_unique.ops.keys): no service."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dramatiq_unique.ops import keys
from dramatiq_unique.storage.models import JobModel
from dramatiq_unique.suite import ActorConfig
from dramatiq_unique.unique.keys import derive_key


def deliver(customer, payload="", region="eu"):
    pass


def config(**options) -> ActorConfig:
    return ActorConfig("deliver", deliver, options, JobModel, ())


def test_words_hash_back_to_the_unique_keys_the_send_made():
    def derived(c: ActorConfig, text: str):
        return keys.derived(SimpleNamespace(actor_config=lambda name: c), "deliver", text)

    found = derived(config(unique_args=["customer"]), "customer=42")
    assert derive_key("deliver", deliver, ["customer"], (42,), {}) in found
    assert derive_key("deliver", deliver, ["customer"], ("42",), {}) in found
    assert derived(config(unique_args=["customer"]), "region=eu") == ()  # no job of it has such a key
    assert derived(config(unique_args=lambda *a: "x"), "x=1") is None  # matched row by row


def test_parse_and_limit_keys():
    assert keys.parse('customer=42 region=eu name="7"') == {"customer": 42, "region": "eu", "name": "7"}
    with pytest.raises(ValueError):
        keys.parse("customer")
    with pytest.raises(ValueError):
        keys.parse("=3")
    assert keys.candidates(config(concurrency_key=["customer"]), "customer=42") == [42, "42"]
    assert keys.candidates(config(concurrency_key=["customer"]), "42") == [42, "42"]
    assert keys.candidates(config(concurrency_key=lambda *a: "t"), "tenant=7") == ["tenant=7"]

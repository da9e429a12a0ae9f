"""An operator's words as keys (dramatiq_unique.ops.keys): no service."""

from __future__ import annotations

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
    c = config(unique_args=["customer"])
    found = keys.candidate_keys(c, "unique_args", "customer=42")
    assert derive_key("deliver", deliver, ["customer"], (42,), {}) in found
    assert derive_key("deliver", deliver, ["customer"], ("42",), {}) in found
    assert keys.candidate_keys(c, "unique_args", "region=eu") is None
    assert keys.candidate_keys(config(unique_args=lambda *a: "x"), "unique_args", "x=1") is None


def test_parse_and_limit_keys():
    assert keys.parse('customer=42 region=eu name="7"') == {"customer": 42, "region": "eu", "name": "7"}
    with pytest.raises(ValueError):
        keys.parse("customer")
    with pytest.raises(ValueError):
        keys.parse("=3")
    assert keys.candidates(config(concurrency_key=["customer"]), "customer=42") == [42, "42"]
    assert keys.candidates(config(concurrency_key=["customer"]), "42") == [42, "42"]
    assert keys.candidates(config(concurrency_key=lambda *a: "t"), "tenant=7") == ["tenant=7"]

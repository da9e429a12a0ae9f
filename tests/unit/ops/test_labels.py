"""Keys in words from a row and its actor's options (dramatiq_unique.ops.labels): no service."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from dramatiq_unique.ops import labels
from dramatiq_unique.storage.models import JobModel
from dramatiq_unique.suite import ActorConfig
from dramatiq_unique.unique.keys import derive_key


def deliver(customer, payload="", region="eu"):
    pass


def config(**options) -> ActorConfig:
    return ActorConfig("deliver", deliver, options, JobModel, ())


def row(*args, options=None, unique_key=None, **kwargs):
    return SimpleNamespace(args=list(args), kwargs=kwargs, options=options or {}, unique_key=unique_key)


def test_parameter_names_are_bound_as_the_send_binds_them():
    c = config(concurrency_key=["customer"])
    assert labels.render(c, "concurrency_key", row(42, "p")) == "customer=42"
    assert labels.render(c, "concurrency_key", row(customer="acme")) == "customer=acme"
    both = config(unique_args=["customer", "region"])
    assert labels.row_key(both, row(42, region="us", unique_key="deliver:ab")) == "customer=42 region=us"
    assert labels.render(config(unique_args=True), "unique_args", row(1)) == "customer=1 payload= region=eu"


def test_no_words_without_the_actor_or_with_arguments_that_no_longer_bind():
    assert labels.render(None, "unique_args", row(1), "deliver:0ef2770d1a2b3c4d") == "#0ef2770d1a2b"
    c = config(unique_args=["customer"])
    assert labels.render(c, "unique_args", row(1, 2, 3, 4, 5), "deliver:0ef2770d1a2b3c") == "#0ef2770d1a2b"
    assert labels.row_key(config(), row(1)) == ""


def test_a_key_callable_is_shown_by_its_result_unless_it_fails_or_is_slow():
    assert labels.render(config(unique_args=lambda customer, **_: f"c{customer}"), "unique_args", row(7)) == "c7"
    assert labels.render(config(unique_args=lambda *a: 1 / 0), "unique_args", row(7), "deliver:ffee") == "#ffee"

    def slow(*args, **kwargs):
        time.sleep(labels.SLOW_CALLABLE_MS / 1000 * 2)
        return "slow"

    c = config(unique_args=slow)
    assert labels.render(c, "unique_args", row(1), "deliver:aa") == "slow"  # then never called again
    assert labels.render(c, "unique_args", row(1), "deliver:aa") == "#aa"


def test_long_values_are_cut():
    text = labels.render(config(concurrency_key=["customer"]), "concurrency_key", row("x" * 500))
    assert len(text) == len("customer=") + labels.MAX_VALUE and text.endswith("…")


def test_words_hash_back_to_the_unique_keys_the_send_made():
    c = config(unique_args=["customer"])
    keys = labels.candidate_keys(c, "unique_args", "customer=42")
    assert derive_key("deliver", deliver, ["customer"], (42,), {}) in keys
    assert derive_key("deliver", deliver, ["customer"], ("42",), {}) in keys
    assert labels.candidate_keys(c, "unique_args", "region=eu") is None
    assert labels.candidate_keys(config(unique_args=lambda *a: "x"), "unique_args", "x=1") is None


def test_parse_and_limit_keys():
    assert labels.parse('customer=42 region=eu name="7"') == {"customer": 42, "region": "eu", "name": "7"}
    with pytest.raises(ValueError):
        labels.parse("customer")
    with pytest.raises(ValueError):
        labels.parse("=3")
    assert labels.limit_key(config(concurrency_key=["customer"]), "customer=42") == {"customer": 42}
    assert labels.limit_key(config(concurrency_key=["customer"]), "42") == 42
    assert labels.limit_key(config(concurrency_key=lambda *a: "t"), "tenant=7") == "tenant=7"

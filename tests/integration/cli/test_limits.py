"""Limits set at run time from the command line: kept with their keys' words, listed (``limits``,
``slots``), removed by words or by a group's hash; a key no job can have refused, one no job has
had yet warned about; the read-only ``slots`` does not pass a declared limit off as none."""

from __future__ import annotations

import json

import dramatiq

from dramatiq_unique import concurrency_status, set_concurrency_limit
from dramatiq_unique.slots import overrides


def _limits(run, app) -> list[tuple]:
    code, out, err = run(["limits", app, "--json"])
    assert code == 0, err
    return [(o["actor"], o["key"], o["limit"]) for o in json.loads(out)]


def test_a_limit_for_a_key_no_job_has_is_warned_listed_in_words_and_removed(run, app, suite):
    @dramatiq.actor(concurrency_limit=2, concurrency_key=["customer"])
    def notify(customer, text=""):
        pass

    code, out, err = run(["limit", app, "notify", "customer=typo", "3"])
    assert code == 0, err
    assert "warning: no job of notify has had the key customer=typo yet" in err
    assert _limits(run, app) == [("notify", "customer=typo", 3)]
    [group] = json.loads(run(["slots", app, "--json"])[1])
    assert (group["key"], group["limit"], group["limit_from"]) == ("customer=typo", 3, "override")
    assert "customer=typo" in run(["limits", app])[1]

    assert run(["limit", app, "notify", "customer=typo", "default"])[0] == 0
    assert _limits(run, app) == []

    # By its hash, as a view shows a group whose words are not known (adopted from Redis, say).
    run(["limit", app, "notify", "customer=typo", "0"])
    short = "#" + group["group"].rsplit(":", 1)[1][:12]
    assert run(["limit", app, "notify", "customer=other", "4"])[0] == 0
    code, _, err = run(["limit", app, "notify", short, "default"])
    assert code == 0, err
    assert _limits(run, app) == [("notify", "customer=other", 4)], "the hash's group, and no other"
    code, _, err = run(["limit", app, "notify", "#0000", "default"])
    assert code == 2 and "no slot group of 'notify' has the hash" in err
    assert run(["limit", app, "notify", "#zz", "1"])[0] == 2
    assert _limits(run, app) == [("notify", "customer=other", 4)]


def test_a_key_the_type_hints_rule_out_is_refused_and_an_int_is_told_from_its_text(run, app, suite):
    @dramatiq.actor(concurrency_limit=1, concurrency_key=["customer"])
    def billed(customer: int, amount: float = 0.0):
        pass

    @dramatiq.actor(concurrency_limit=1, concurrency_key=["region"])
    def mailed(region: str):
        pass

    code, _, err = run(["limit", app, "billed", "customer=typo", "3"])
    assert code == 2 and "no job of 'billed' can have the key 'customer=typo'" in err and "customer: int" in err
    assert _limits(run, app) == []

    assert run(["limit", app, "billed", "customer=42", "0"])[0] == 0
    assert concurrency_status("billed", key=42).limit == 0  # the int the jobs are sent with
    assert run(["limit", app, "mailed", "42", "0"])[0] == 0
    assert concurrency_status("mailed", key="42").limit == 0  # the str
    assert run(["limit", app, "billed", "customer", "3"])[0] == 2


def test_a_key_jobs_have_had_is_set_without_a_warning(run, app, suite, broker):
    @dramatiq.actor(concurrency_limit=1, concurrency_key=["customer"])
    def synced(customer):
        pass

    synced.send("7")  # sent as the str; the words read as JSON would make it the int
    code, _, err = run(["limit", app, "synced", "customer=7", "2"])
    assert code == 0 and "warning" not in err
    assert concurrency_status("synced", key="7").limit == 2
    assert concurrency_status("synced", key=7).override is None


def test_an_override_kept_without_words_is_listed_by_its_hash_and_removed(run, app, suite, redis_client):
    """One a release that kept none wrote to Redis: adopted, listed by its hash, removed by it."""

    @dramatiq.actor(concurrency_limit=2, concurrency_key=["customer"])
    def legacy(customer):
        pass

    set_concurrency_limit("legacy", 1, key="x")  # the marker and a row of ours
    group = overrides.listing(suite, "legacy")[0].group
    redis_client.delete(suite.keys.limits_loaded())
    overrides.write(suite, "legacy", group, None)
    redis_client.set(suite.keys.limit(group), 0)
    redis_client.delete(suite.keys.limits_loaded())
    assert overrides.restore_if_lost(suite) == 1
    [(actor, key, limit)] = _limits(run, app)
    assert (actor, limit) == ("legacy", 0) and key == "#" + group.rsplit(":", 1)[1][:12]
    assert run(["limit", app, "legacy", key, "default"])[0] == 0
    assert _limits(run, app) == [] and redis_client.get(suite.keys.limit(group)) is None


def test_read_only_slots_do_not_call_a_declared_limit_none(run, app, suite, broker):
    """From the environment the app's declared limit is not known: shown as such, not as "none"."""

    @dramatiq.actor(concurrency_limit=2, concurrency_key=["customer"], concurrency_ttl=30_000)
    def hold(customer):
        pass

    set_concurrency_limit("hold", 1, key="b")
    from dramatiq_unique.slots.gate import gate_of
    from dramatiq_unique.slots.limits import key_group

    gate_of(suite).enter("slot:" + key_group(suite.actor_config("hold"), "a"), "t", 30_000, 2, None)
    code, out, err = run(["slots", "--json"], env=True)
    assert code == 0, err
    found = {g["group"].rsplit(":", 1)[1][:6]: (g["limit"], g["limit_from"]) for g in json.loads(out)}
    assert sorted(found.values(), key=str) == [(1, "override"), (None, "unknown")]
    text = run(["slots"], env=True)[1]
    assert "none" not in text and "?: declared by the app" in text
    assert run(["slots", app, "--json"])[0] == 0
    assert {g["limit_from"] for g in json.loads(run(["slots", app, "--json"])[1])} == {"override", "declared"}

"""Tracked messages acked by our own script (dramatiq_unique.acks), on the Redis broker
with real Redis, SQLite and PostgreSQL."""

from __future__ import annotations

import dramatiq

import dramatiq_unique
from tests.helpers import wait_until


def test_a_tracked_message_is_acked_by_our_script_and_an_untracked_one_by_the_broker(suite, broker, worker, monkeypatch):
    """Given a tracked and an untracked actor, When both run, Then only the tracked message's
    ack goes through our script, and neither leaves its body or its id in the broker."""
    ran: list = []

    @dramatiq.actor(track=True)
    def tracked(x):
        ran.append(x)

    @dramatiq.actor
    def plain(x):
        ran.append(x)

    acked: list = []
    script = suite.acks.script

    def counted(keys=(), args=()):
        acked.append(args[2])
        return script(keys=keys, args=args)

    monkeypatch.setattr(suite.acks, "script", counted)
    sent = tracked.send(1)
    plain.send(2)
    wait_until(lambda: sorted(ran) == [1, 2], timeout=10)
    wait_until(lambda: dramatiq_unique.get_job(sent.message_id).status == "succeeded", timeout=10)
    ns = broker.namespace
    client = broker.client

    def left() -> int:
        ack_sets = list(client.scan_iter(match=f"{ns}:__acks__.*"))
        return client.hlen(f"{ns}:default.msgs") + sum(client.scard(s) for s in ack_sets)

    wait_until(lambda: left() == 0, timeout=10)
    assert len(acked) == 1
    assert client.zscore(f"{ns}:__heartbeats__", broker.broker_id) is not None


def test_a_tracked_job_that_failed_for_good_is_nacked_by_the_broker_as_usual(suite, broker, worker):
    """A rejected message is not acked: the broker's own nack moves it to the dead-letter
    queue, and the row says failed."""

    @dramatiq.actor(track=True, max_retries=0)
    def broken():
        raise RuntimeError("no")

    sent = broken.send()
    wait_until(lambda: dramatiq_unique.get_job(sent.message_id).status == "failed", timeout=10)
    ns = broker.namespace
    wait_until(lambda: broker.client.hlen(f"{ns}:default.msgs") == 0, timeout=10)
    assert broker.client.hlen(f"{ns}:default.XQ.msgs") == 1

"""Helpers shared by the tests of parking and of the deck: a test gate, deliveries, sent messages, reserved rows."""

from __future__ import annotations

from typing import Optional

import dramatiq

from dramatiq_unique import JobModel
from dramatiq_unique.context import MARKER
from dramatiq_unique.locks.redlock import new_token
from dramatiq_unique.parking.gates import GroupInfo
from tests.integration.slots.helpers import rows

ORDER = {"value": "created_at"}


class TestGate:
    """Groups ``t:<name>``, each a Redis lock; jobs in the shared table."""

    __test__ = False
    kind = "t"
    atomic_release = True

    def __init__(self, suite, flags: str, ttl_ms: float = 5_000) -> None:
        self.suite, self.flags, self.ttl_ms = suite, flags, ttl_ms

    def name(self, group: str) -> str:
        return f"{self.suite.keys.prefix}:test-gate:{group}"

    def describe(self, group: str) -> Optional[GroupInfo]:
        return GroupInfo(JobModel, ORDER["value"], self.ttl_ms)

    def take(self, group, ttl_ms):
        return self.suite.locks.acquire(self.name(group), ttl_ms, new_token())[0]

    def pass_to(self, group, token, ttl_ms):
        fresh = new_token()
        return fresh if self.suite.locks.transfer(self.name(group), token, fresh, ttl_ms) else None

    def release_unless_flagged(self, group, token):
        return self.suite.locks.release_unless(self.name(group), token, self.flags, group)

    def release(self, group, token):
        self.suite.locks.release(self.name(group), token)

    def retry_in(self, group):
        return self.suite.locks.pttl(self.name(group))


class Delivery:
    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self.options = {MARKER: {"qt": f"queue-lock-of-{message_id}", "wake": {"g": "old"}}, "retries": 2}


def sent(broker) -> list[dramatiq.Message]:
    """Messages the broker holds in the default queue, in queue order."""
    ids = broker.client.lrange(f"{broker.namespace}:default", 0, -1)
    return [dramatiq.Message.decode(broker.client.hget(f"{broker.namespace}:default.msgs", i)) for i in ids]


def reserved(actor_name: str) -> list[JobModel]:
    return [r for r in rows(actor_name) if (r.worker or "").endswith(":deck")]

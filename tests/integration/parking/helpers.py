"""Helpers shared by the tests of parking and of the deck: a test gate, deliveries, sent messages, reserved rows."""

from __future__ import annotations

from typing import Optional

import dramatiq

from dramatiq_unique import JobModel
from dramatiq_unique.context import MARKER
from dramatiq_unique.middleware.gates import LockGate
from dramatiq_unique.parking.groups import GroupInfo
from tests.integration.slots.helpers import rows

ORDER = {"value": "created_at"}


class TestGate(LockGate):
    """Groups ``t:<name>``, each a Redis lock; jobs in the shared table."""

    __test__ = False
    kind = "t"

    def __init__(self, suite, wakeups, ttl_ms: float = 5_000) -> None:
        super().__init__(suite, wakeups)
        self.ttl_ms, self.atomic_release = ttl_ms, True

    def name(self, group: str) -> str:
        return f"{self.suite.keys.prefix}:test-gate:{group}"

    def describe(self, group: str) -> Optional[GroupInfo]:
        return GroupInfo(JobModel, ORDER["value"], self.ttl_ms)


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

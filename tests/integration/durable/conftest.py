"""Fixtures of the durable tests."""

from __future__ import annotations

import dramatiq
import pytest


@pytest.fixture
def charge(suite):
    """A tracked actor, declared on the test's broker."""

    @dramatiq.actor(track=True)
    def charge(order):
        return order

    return charge

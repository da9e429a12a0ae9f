"""Fixtures of the durable tests."""

from __future__ import annotations

from typing import Any

import dramatiq
import peewee as pw
import pytest
from playhouse.db_url import parse


@pytest.fixture
def charge(suite):
    """A tracked actor, declared on the test's broker."""

    @dramatiq.actor(track=True)
    def charge(order):
        return order

    return charge


@pytest.fixture(params=["psycopg2", "psycopg3"])
def postgres_either_driver(request: pytest.FixtureRequest, pg_url: str) -> Any:
    """PostgreSQL on psycopg2 (the URL) or on psycopg 3 (a Database of the app's), for a module's
    ``database_url``."""
    if request.param == "psycopg2":
        return pg_url
    params = parse(pg_url)
    return pw.PostgresqlDatabase(params.pop("database"), prefer_psycopg3=True, **params)

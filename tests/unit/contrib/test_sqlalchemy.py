"""EngineDatabase.of: which engines it takes, and what it makes of one (nothing connects)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine

from dramatiq_unique.contrib.sqlalchemy import EngineDatabase
from dramatiq_unique.errors import InvalidOption
from dramatiq_unique.storage.database import is_psycopg3


def test_a_sqlite_engine_is_refused() -> None:
    with pytest.raises(InvalidOption, match="sync PostgreSQL engine"):
        EngineDatabase.of(create_engine("sqlite://"))


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg"])
def test_the_engines_url_and_driver_make_the_suites_own_connections(driver: str) -> None:
    engine = create_engine(f"postgresql+{driver}://app:s3cret@db.example:6543/shop?options=-csearch_path%3Dsales")
    db = EngineDatabase.of(engine)
    assert db.engine is engine and db.is_closed()
    assert db.database == "shop"
    assert db.connect_params["host"] == "db.example" and db.connect_params["port"] == 6543
    assert db.connect_params["password"] == "s3cret"
    assert "search_path=sales" in db.connect_params["options"] and "statement_timeout" in db.connect_params["options"]
    assert is_psycopg3(db) == (driver == "psycopg")
    assert not db.in_transaction()  # no session of this engine is in a transaction here

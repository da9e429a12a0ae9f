"""No message shows a password: URLs, libpq key/value strings, settings dicts (dramatiq_unique.redaction)."""

from __future__ import annotations

import json

import peewee as pw
import pytest

from dramatiq_unique import InvalidOption
from dramatiq_unique.errors import DatabaseUnavailable
from dramatiq_unique.redaction import redact
from dramatiq_unique.storage.database import address, describe, open_database
from dramatiq_unique.storage.stores import specs

SECRET = "s3cr3t-pw"


@pytest.mark.parametrize("text, shown", [
    (f"postgresql://app:{SECRET}@db:5432/jobs", "postgresql://app:***@db:5432/jobs"),
    (f"postgresql://app:{SECRET}@x@db/jobs", "postgresql://app:***@db/jobs"),  # an unencoded "@"
    (f"postgresql://app:{SECRET}/x@db/jobs", "postgresql://app:***@db/jobs"),  # an unencoded "/"
    (f"redis://:{SECRET}@cache:6379/0", "redis://:***@cache:6379/0"),
    (f"rediss://default:{SECRET}@cache:6380", "rediss://default:***@cache:6380"),
    (f"host=db password={SECRET} dbname=jobs", "host=db password=*** dbname=jobs"),
    (f"host=db password = '{SECRET} x\\' y' dbname=jobs", "host=db password = '***' dbname=jobs"),
    (f"host=db sslpassword={SECRET}", "host=db sslpassword=***"),
    (f"postgresql://db/jobs?password={SECRET}&sslmode=require", "postgresql://db/jobs?password=***&sslmode=require"),
    (f"{{'host': 'db', 'password': '{SECRET}'}}", "{'host': 'db', 'password': '***'}"),
    (f"{{'password': b'{SECRET}'}}", "{'password': '***'}"),
    (f"DB_PASSWORD={SECRET} client_secret={SECRET}", "DB_PASSWORD=*** client_secret=***"),
])
def test_passwords_are_written_as_stars(text, shown):
    assert redact(text) == shown


def test_text_without_a_password_is_left_as_it_is():
    for text in ("redis://localhost:6379/0", "postgresql://postgres@127.0.0.1:5432/test", "sqlite:////tmp/x.db",
                 'FATAL:  password authentication failed for user "app"', "fencing_token=7", "key=None", ""):
        assert redact(text) == text
    hidden = redact(json.dumps({"password": SECRET, "n": 1}))
    assert json.loads(hidden) == {"password": "***", "n": 1}  # JSON stays JSON


def test_setting_errors_never_show_a_password():
    for bad in (f"host=127.0.0.1 port=5432 user=app password={SECRET} dbname=jobs",
                f"host=db password='{SECRET}' dbname=jobs", {"host": "db", "password": SECRET}, [("db", SECRET)]):
        with pytest.raises(InvalidOption) as raised:
            open_database(bad)  # type: ignore[arg-type]
        assert SECRET not in str(raised.value), raised.value
    with pytest.raises(InvalidOption, match="key/value") as raised:
        open_database(f"host=db password={SECRET} dbname=jobs")
    assert "password=***" in str(raised.value)
    with pytest.raises(InvalidOption) as raised:
        specs({"password": SECRET})  # type: ignore[arg-type]
    assert SECRET not in str(raised.value)
    assert SECRET not in str(DatabaseUnavailable(f"postgresql://app:{SECRET}@db/jobs: down"))
    assert SECRET not in str(InvalidOption(f"redis must be a URL, not {({'password': SECRET})!r}"))


def test_a_database_named_by_a_libpq_string_or_url_is_described_without_it():
    for name in (f"host=db password={SECRET} dbname=jobs", f"postgresql://app:{SECRET}@db/jobs"):
        assert SECRET not in describe(pw.PostgresqlDatabase(name))
    assert describe(pw.PostgresqlDatabase("jobs", host="db", user="app", password=SECRET)) == \
        "PostgreSQL at postgresql://app@db/jobs"
    for url in (f"postgresql://app:{SECRET}/x@db/jobs", f"postgresql://app:{SECRET}@db:port/jobs",
                f"sqlite:///jobs.db?password={SECRET}"):
        assert SECRET not in address(url) and "app" in address(url) or url.startswith("sqlite"), address(url)

"""No password in what the suite says: set-up errors, ``check`` and ``status`` (text and JSON), with
URLs, libpq key/value strings and a peewee Database whose name is one."""

from __future__ import annotations

import io
import json

import peewee as pw
import pytest

import dramatiq_unique
from dramatiq_unique import DatabaseUnavailable, InvalidOption
from dramatiq_unique.cli import main
from dramatiq_unique.cli.context import Context
from dramatiq_unique.health import checks
from dramatiq_unique.health.target import of_suite
from tests.conftest import REDIS_URL
from tests.durable import free_port

SECRET = "s3cr3t-pw"


def _run(words, env):
    out, err = io.StringIO(), io.StringIO()
    code = main(words, context=Context(out=out, err=err, env=env))
    return code, out.getvalue() + err.getvalue()


def test_check_and_status_never_show_a_password():
    port = free_port()
    for database in (f"postgresql://postgres:{SECRET}@127.0.0.1:{port}/test",
                     f"postgresql://postgres:{SECRET}@127.0.0.1:{port}/test?sslpassword={SECRET}",
                     f"host=127.0.0.1 port={port} user=postgres password={SECRET} dbname=test",
                     f"host=127.0.0.1 password='{SECRET} x' dbname=test"):
        env = {"DRAMATIQ_UNIQUE_DATABASE_URL": database, "DRAMATIQ_UNIQUE_REDIS_URL": f"redis://:{SECRET}@127.0.0.1:1/0"}
        for words in (["check"], ["check", "--json"], ["status"], ["status", "--json"], ["jobs"]):
            code, said = _run(words, env)
            assert code != 0 and SECRET not in said and "Traceback" not in said, (database, words, said)


def test_set_up_errors_never_show_a_password(broker, key_prefix):
    dsn = f"host=127.0.0.1 port={free_port()} user=postgres password={SECRET} dbname=test"
    with pytest.raises(InvalidOption, match="key/value") as raised:
        dramatiq_unique.setup(broker, database=dsn, redis=REDIS_URL, key_prefix=key_prefix)
    assert SECRET not in str(raised.value)
    with pytest.raises(DatabaseUnavailable) as down:  # a libpq string given as the name (a mistake the driver quotes)
        dramatiq_unique.setup(broker, database=pw.PostgresqlDatabase(dsn), redis=REDIS_URL, key_prefix=key_prefix)
    assert SECRET not in str(down.value) and "127.0.0.1" in str(down.value)
    for bad in ({"database": {"host": "db", "password": SECRET}}, {"redis": [{"password": SECRET}]}):
        settings = {"database": "sqlite:///:memory:", "redis": REDIS_URL, **bad}
        with pytest.raises(InvalidOption) as raised:
            dramatiq_unique.setup(broker, key_prefix=key_prefix, **settings)
        assert SECRET not in str(raised.value)


def test_the_findings_name_a_store_without_its_password(suite):
    target = of_suite(suite)
    target.databases = [pw.PostgresqlDatabase(f"host=127.0.0.1 port={free_port()} password={SECRET} dbname=test")]
    report = checks.run(target, recheck=10)
    assert report.code == checks.CRITICAL and SECRET not in json.dumps(report.as_dict())

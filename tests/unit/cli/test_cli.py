"""The command line without services: argument parsing, exit codes, tables and values."""

from __future__ import annotations

import io
from datetime import datetime, timedelta

import pytest

from dramatiq_unique.cli import COMMANDS, Command, main, parser, since, split_words
from dramatiq_unique.cli.commands import cell, pairs, table
from dramatiq_unique.cli.context import Context
from dramatiq_unique.ops.actions import limit_value
from dramatiq_unique.ops.views import JobRow, Page


def run(words, env=None):
    out, err = io.StringIO(), io.StringIO()
    code = main(words, context=Context(out=out, err=err, env=env or {}))
    return code, out.getvalue(), err.getvalue()


def test_every_command_is_registered():
    parser()
    assert {"jobs", "job", "locks", "slots", "dead", "retry", "cancel", "limit", "stats", "prune", "redrive",
            "web", "retry-all", "cancel-all"} <= set(COMMANDS)
    assert {name for name, c in COMMANDS.items() if c.writes} >= {"retry", "cancel", "limit", "prune", "redrive",
                                                                   "retry-all", "cancel-all"}


def test_usage_errors_exit_2():
    assert run([])[0] == 2
    assert run(["nonsense"])[0] == 2
    assert run(["jobs", "--limit", "many"])[0] == 2
    code, _, err = run(["jobs"])  # no app, no environment
    assert code == 2 and "DRAMATIQ_UNIQUE_DATABASE_URL" in err
    code, _, err = run(["jobs"], env={"DRAMATIQ_UNIQUE_DATABASE_URL": "sqlite:////nonexistent/x.db",
                                      "DRAMATIQ_UNIQUE_REDIS_URL": "redis://127.0.0.1:1"})
    assert code == 1 and "no existing SQLite file" in err
    code, _, err = run(["jobs"], env={"DRAMATIQ_UNIQUE_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/test",
                                      "DRAMATIQ_UNIQUE_REDIS_URL": "redis://127.0.0.1:1"})
    assert code == 1 and "could not be reached" in err  # a store down: refused, said, no traceback
    assert run(["jobs", "--help"])[0] == 0


def test_the_app_word_is_told_from_the_command_s_own():
    job = Command("job", "", lambda c, a: 0, positionals=("ID",))
    limit_cmd = Command("limit", "", lambda c, a: 0, positionals=("ACTOR", "[KEY]", "N"))
    jobs = Command("jobs", "", lambda c, a: 0)
    never = lambda word: False  # noqa: E731
    assert split_words(job, ["app", "17"], never) == ("app", ["17"])
    assert split_words(job, ["17"], never) == (None, ["17"])
    assert split_words(jobs, ["app"], never) == ("app", [])
    words = ["deliver", "customer=42", "3"]
    assert split_words(limit_cmd, ["app", *words], never) == ("app", words)
    assert split_words(limit_cmd, ["deliver", "3"], never) == (None, ["deliver", "3"])
    assert split_words(limit_cmd, ["deliver", "customer=42", "3"], never) == (None, ["deliver", "customer=42", "3"])
    assert split_words(limit_cmd, ["app:b", "deliver", "3"], lambda w: ":" in w) == ("app:b", ["deliver", "3"])
    for words in ([], ["a", "b", "c"]):
        with pytest.raises(ValueError):
            split_words(job, words, never)


def test_tables_and_cells():
    assert table(("id", "status"), []) == "(none)"
    text = table(("id", "status"), [(1, "queued"), (12345, "succeeded")])
    assert text.splitlines() == ["ID     STATUS", "1      queued", "12345  succeeded"]
    assert cell(None) == "-" and cell([1, 2]) == "1,2"
    assert cell(datetime(2026, 1, 2, 3, 4, 5, 6)) == "2026-01-02 03:04:05"
    assert cell("a\nb") == "a b" and len(cell("x" * 100)) == 48
    assert pairs([("id", 1), ("message id", "m")]) == "id          1\nmessage id  m"


def test_page_json():
    row = JobRow(1, "1", "m", "a", "default", "queued", "customer=42", 0, datetime(2026, 1, 1), None, None, "t", 0)
    assert Page([row], "1.0").as_dict()["rows"][0]["created_at"] == "2026-01-01T00:00:00"


def test_values():
    assert limit_value("3") == 3 and limit_value("halt") == 0 and limit_value("DEFAULT") is None
    for bad in ("-1", "three", "1.5", "", "\u0660", str(2**31)):  # the dashboard's form reads limits the same way
        with pytest.raises(ValueError):
            limit_value(bad)
    assert since(None) is None
    assert abs((datetime.utcnow() - timedelta(minutes=15)) - since("15m")).total_seconds() < 5
    assert since("2026-11-24T21:00") == datetime(2026, 11, 24, 21, 0)
    assert since("2026-11-24T21:00+01:00") == datetime(2026, 11, 24, 20, 0)
    with pytest.raises(ValueError):
        since("yesterday")


@pytest.mark.parametrize("command", ["check", "status", "migrate", "jobs"])
def test_a_database_url_the_suite_does_not_run_on_is_a_usage_error_not_a_traceback(command):
    env = {"DRAMATIQ_UNIQUE_DATABASE_URL": "mysql://ops:s3cret@db.example/jobs",
           "DRAMATIQ_UNIQUE_REDIS_URL": "redis://127.0.0.1:1"}
    code, _, err = run([command], env=env)
    assert code == 2 and "SQLite" in err and "PostgreSQL" in err and "Traceback" not in err, err
    assert "s3cret" not in err


def test_a_value_of_one_job_is_shown_whole_up_to_a_bound():
    from dramatiq_unique.cli.commands import MAX_DETAIL, detail

    long = "x" * 500
    assert detail(long) == long
    cut = detail("y" * (MAX_DETAIL + 10))
    assert cut.startswith("y" * MAX_DETAIL) and cut.endswith("(10 characters more: --json prints them all)")

"""Unit tests of dramatiq_unique.storage.queries: every named query parses and renders for both
dialects, without a database server (a PostgreSQL Database object renders without connecting)."""

from __future__ import annotations

import re

import peewee as pw
import pytest

from dramatiq_unique import JobModel
from dramatiq_unique.storage import parking_statements, queries, statements

#: The slots each query that has some is rendered with (and the value each takes).
SLOTS = {
    "queue_head": {"order": "by_created_at"},
    "claim_parked": {"order": "by_process_after"},
    "claim_and_start": {"order": "by_created_at", "guard": "unique_free", "token": "next_token"},
    "reserve": {"order": "by_created_at"},
    "revoke_older": {"token": "given_token"},
    "draw_and_revoke": {"token": "drawn_token"},
    "record_refs": {"ref_rows": ("ref_row", 3)},
    "start_attempt": {"token": "given_or_next_token"},
    "start_attempt_fenced": {"token": "drawn_token"},
    "revoke_for_start": {"token": "drawn_token"},
    "start_set": {"token": "next_token"},
    "start_reserved": {"token": "next_token"},
    "table_columns": {"schema": "named_schema"},
    "no_flush_wait": {"statement": "park"},
}


class Jobs(JobModel):
    extra = pw.CharField(null=True)

    class Meta:
        table_name = "queries_unit_jobs"
        schema = "elsewhere"


def databases() -> list[pw.Database]:
    return [pw.SqliteDatabase(":memory:"), pw.PostgresqlDatabase("never_connected")]


@pytest.fixture(params=["sqlite", "postgresql"])
def model(request):
    db = databases()[0 if request.param == "sqlite" else 1]
    with db.bind_ctx([Jobs], bind_refs=False, bind_backrefs=False):
        yield Jobs


def queries_of(dialect: str) -> list[str]:
    return sorted({name for name, variant in queries.BLOCKS if variant in (None, dialect)})


def test_every_block_has_a_name_a_description_and_sql():
    text = open(queries.PATH, encoding="utf-8").read()
    summaries = re.findall(r"^-- name: .*\n(.*)", text, re.M)
    assert len(summaries) == len(queries.BLOCKS) > 20
    assert all(summary.startswith("-- ") and len(summary) > 10 for summary in summaries), summaries
    assert all(body.strip() for body in queries.BLOCKS.values())


def test_a_dialect_variant_never_shadows_a_shared_block():
    for name, variant in queries.BLOCKS:
        if variant is not None:
            assert (name, None) not in queries.BLOCKS, name


def test_every_query_renders_in_both_dialects(model):
    dialect = queries.dialect_of(model._meta.database)
    mark = model._meta.database.param
    for name in queries_of(dialect):
        statement = queries.build(model, name, **SLOTS.get(name, {}))
        assert "{" not in statement.sql and "%(" not in statement.sql, (name, statement.sql)
        marks = re.sub(r"'[^']*'", "''", statement.sql).count(mark)  # not a mark inside a literal ('%Y')
        assert marks == len(statement.names), name
        if "{jobs}" in queries.BLOCKS.get((name, dialect), queries.BLOCKS.get((name, None), "")):
            assert '"elsewhere"."queries_unit_jobs"' in statement.sql, name


def test_a_rendered_query_is_kept_per_dialect_and_its_parameters_are_filled_by_name(model):
    first = queries.render(model, "holder")
    assert queries.render(model, "holder") is first
    assert first.names == ("app", "hold")
    assert first.params({"hold": "h", "app": "a", "unused": 1}) == ["a", "h"]


def test_a_parking_move_without_the_flush_wait_is_one_statement(model):
    """One statement (psycopg 3 prepares it; two in one string it refuses with parameters), the move's
    own parameters in the move's order."""
    if queries.dialect_of(model._meta.database) != "postgresql":
        assert queries.build(model, "park").sql.startswith("UPDATE")  # SQLite: no WAL flush to skip
        return
    wrapped = queries.build(model, "no_flush_wait", statement="park")
    assert ";" not in wrapped.sql and wrapped.sql.startswith("WITH moved AS (UPDATE")
    assert "set_config('synchronous_commit', 'off', true)" in wrapped.sql
    assert wrapped.names == queries.build(model, "park").names


def test_a_whole_row_returned_names_every_column_of_the_model(model):
    sql = queries.build(model, "claim_parked", order="by_created_at").sql
    assert sql.endswith('"extra"') and sql.count('"missing_since"') == 2  # set, and returned


def test_the_returned_columns_are_those_the_rows_are_read_as(model):
    def returned(name: str) -> list[str]:
        sql = queries.build(model, name, **SLOTS.get(name, {})).sql
        return re.findall(r'"(\w+)"(?:,|$)', sql.split("RETURNING", 1)[1])

    assert returned("start_attempt") == list(statements.START_COLUMNS)
    assert returned("start_reserved") == list(parking_statements.DECK_COLUMNS)
    assert returned("reserve") == list(parking_statements.DECK_COLUMNS)
    holder = queries.build(model, "holder").sql
    assert re.findall(r'"(\w+)"', holder.split("FROM")[0]) == list(statements.HOLDER_COLUMNS)


def test_an_unknown_query_is_named_in_the_error(model):
    with pytest.raises(KeyError, match="no_such_query"):
        queries.build(model, "no_such_query")


def test_quoting_follows_the_database():
    db = pw.SqliteDatabase(":memory:")
    assert queries.table(db, "t") == '"t"' and queries.table(db, "t", "s") == '"s"."t"'


def test_the_three_starts_write_one_list(model):
    """start_attempt, claim_and_start and start_reserved write the same start (start_set): as it is,
    or, in a claim, each value guarded by the row having no unique option of its own."""
    plain = queries.build(model, "start_set", token="next_token").sql
    guarded = queries.build(model, "start_set", token="next_token", guard="unique_free").sql
    free = queries.build(model, "unique_free").sql
    assert plain.startswith('"status" = ') and "CASE" not in plain
    assert guarded.count(f"CASE WHEN {free} THEN ") == plain.count(" = ") == 6
    assert plain in queries.build(model, "start_reserved", token="next_token").sql
    assert guarded in queries.build(model, "claim_and_start", order="by_created_at", guard="unique_free",
                                    token="next_token").sql
    start = queries.build(model, "start_attempt", token="given_or_next_token").sql
    assert queries.build(model, "start_set", token="given_or_next_token").sql in start
    startable = queries.build(model, "startable_row").sql
    assert startable in start and startable in queries.build(model, "startable").sql


def test_a_query_of_the_fence_table_alone_renders_for_a_database():
    for db in databases():
        statement = queries.render_on(db, "current_token")
        assert statement.sql == f'SELECT "token" FROM "dramatiq_unique_fences" WHERE "key" = {db.param}'
        assert statement.names == ("key",)

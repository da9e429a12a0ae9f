"""Unit tests of dramatiq_unique.storage.queries: the statements of queries.sql parse and render for both
dialects, without a database server (a PostgreSQL Database object renders without connecting), and the
statements that repeat another's text repeat it exactly."""

from __future__ import annotations

import re

import peewee as pw
import pytest

from dramatiq_unique import JobModel
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable.messages import RETRY_BASE
from dramatiq_unique.storage import jobs, queries

DIALECTS = ("postgresql", "sqlite")
#: Expressions for peewee queries to embed, not statements.
EXPRESSIONS = {"now", "history_append", "unique_lock_option", "restarted_count", "queue_lock_token"}


class Jobs(JobModel):
    extra = pw.CharField(null=True)

    class Meta:
        table_name = "queries_unit_jobs"
        schema = "elsewhere"


def databases() -> list[pw.Database]:
    return [pw.SqliteDatabase(":memory:"), pw.PostgresqlDatabase("never_connected")]


@pytest.fixture(params=DIALECTS)
def model(request):
    db = databases()[0 if request.param == "sqlite" else 1]
    with db.bind_ctx([Jobs], bind_refs=False, bind_backrefs=False):
        yield Jobs


def names_of(dialect: str) -> list[str]:
    return sorted({name for name, variant in queries.STATEMENTS if variant in (None, dialect)})


def rendered(model, name: str) -> queries.Query:
    """Statement ``name`` for ``model``, with the per-call identifiers it names."""
    text = queries.text_of(name, queries.dialect_of(model._meta.database))
    kwargs: dict = {}
    if "{order_by}" in text:
        kwargs["order_by"] = "created_at"
    if "{values}" in text or "{assignments}" in text:
        kwargs["written"] = ("status", "app", "unique_hold")
    return queries.statement(model, name, **kwargs)


def test_every_statement_has_a_header_a_description_and_sql():
    text = open(queries.PATH, encoding="utf-8").read()
    headers = re.findall(r"^-- name: .*\n(.*)", text, re.M)
    assert len(headers) == len(queries.STATEMENTS) > 30
    assert all(line.startswith("-- ") and len(line) > 10 for line in headers), headers
    assert all(body.strip() and "--" not in body for body in queries.STATEMENTS.values())


def test_the_parser_refuses_a_statement_written_twice_or_empty():
    with pytest.raises(ValueError, match="written twice"):
        queries.parse("-- name: a --\nSELECT 1\n-- name: a --\nSELECT 2\n")
    with pytest.raises(ValueError, match="empty"):
        queries.parse("-- name: a (sqlite) --\n-- only a description\n")
    assert queries.parse("preamble\n-- name: a --\n-- described\nSELECT\n  1\n") == {("a", None): "SELECT 1"}


def test_a_dialect_variant_never_shadows_a_shared_statement_and_comes_in_pairs_where_both_run_it():
    for name, variant in queries.STATEMENTS:
        if variant is not None:
            assert (name, None) not in queries.STATEMENTS, name


def test_every_statement_renders_in_both_dialects(model):
    dialect = queries.dialect_of(model._meta.database)
    for name in names_of(dialect):
        if name == "insert_many":
            sql = queries.render(model, name, written=("status", "app"), rows=3)
            assert sql.count(f"({model._meta.database.param}, {model._meta.database.param})") == 3
            continue
        query = rendered(model, name)
        assert "{" not in query.sql, (name, query.sql)
        if "{jobs}" in queries.text_of(name, dialect):
            assert '"elsewhere"."queries_unit_jobs"' in query.sql, name
        if dialect == "sqlite":  # sqlite3's named marks, reading the same dict
            assert "%(" not in query.sql and not query.prepared_name, name
            assert set(re.findall(r":(\w+)", re.sub(r"'[^']*'", "''", query.sql))) == set(query.params), name
        else:
            assert "$" not in re.sub(r"'[^']*'", "''", query.sql), name
            marks = re.findall(r"\$(\d+)", re.sub(r"'[^']*'", "''", query.prepare_sql))
            assert sorted({int(n) for n in marks}) == list(range(1, len(query.params) + 1)), name
            # psycopg2 formats a statement with parameters: a literal % would need doubling; there is none.
            assert "%" not in re.sub(r"%\(\w+\)s", "", query.sql), name


def test_a_rendered_statement_is_kept_per_table_and_dialect(model):
    first = queries.statement(model, "holder")
    assert queries.statement(model, "holder") is first
    assert first.params == ("app", "hold")
    with pytest.raises(KeyError, match="no_such_statement"):
        queries.statement(model, "no_such_statement")


def test_the_columns_a_call_writes_are_named_by_their_parameters(model):
    query = queries.statement(model, "update_fenced", written=("status", "finished_at"))
    assert query.params == ("status", "finished_at", "row_id", "attempt_token")
    with pytest.raises(ValueError, match="not a column name"):
        queries.statement(model, "update_fenced", written=('status" = 1; --',))
    with pytest.raises(ValueError, match="none were named"):
        queries.statement(model, "insert")


def test_a_whole_row_returned_names_every_column_of_the_model(model):
    sql = rendered(model, "claim_parked").sql
    assert sql.endswith('"queries_unit_jobs"."extra"') and sql.count('"missing_since"') == 2  # set, and returned


def test_the_returned_columns_are_those_the_rows_are_read_as(model):
    def returned(name: str) -> list[str]:
        return re.findall(r'"(\w+)"(?:,|$)', rendered(model, name).sql.split("RETURNING", 1)[1])

    assert returned("start_attempt") == list(jobs.START_COLUMNS)
    assert returned("start_reserved") == list(jobs.DECK_COLUMNS)
    assert returned("reserve") == list(jobs.DECK_COLUMNS)
    if queries.dialect_of(model._meta.database) == "postgresql":
        assert returned("start_attempt_fenced") == list(jobs.START_COLUMNS)
    holder = rendered(model, "holder").sql
    assert re.findall(r'"(\w+)"', holder.split("FROM")[0]) == list(jobs.HOLDER_COLUMNS)


def test_quoting_follows_the_database():
    db = pw.SqliteDatabase(":memory:")
    assert queries.table(db, "t") == '"t"' and queries.table(db, "t", "s") == '"s"."t"'


def test_the_fence_table_is_named_alone_whatever_the_job_tables_schema(model):
    query = queries.statement(model, "draw_token")
    mark = "%(key)s" if isinstance(model._meta.database, pw.PostgresqlDatabase) else ":key"
    assert query.sql.startswith(f'INSERT INTO "dramatiq_unique_fences" ("key", "token") VALUES ({mark}, 1)')


# -- statements that repeat another's text ------------------------------------------------


def sets(sql: str) -> dict[str, str]:
    """The assignments of an UPDATE's SET list: {column: expression}."""
    body = re.search(r"UPDATE \S+ SET (.*?) (?:FROM|WHERE) ", sql).group(1)
    return dict(re.findall(r'"(\w+)" = ((?:CASE .*? END)|[^,]+(?:\([^)]*\))?)(?:, |$)', body))


def text(name: str, dialect: str) -> str:
    return queries.text_of(name, dialect)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_start_writes_what_start_attempt_writes(dialect):
    """start_attempt, its fenced form, start_reserved and a claim's start write one list of columns, each
    to the same value (a claim's guarded by the row having no unique option of its own)."""
    start = sets(text("start_attempt", dialect))
    assert set(start) == {"status", "attempts", "started_at", "lease_until", "worker", "fencing_token", "parked_on",
                          "unique_hold"}
    same = ("status", "attempts", "started_at", "lease_until", "worker", "parked_on")
    reserved = sets(text("start_reserved", dialect))
    assert {c: reserved[c] for c in same} == {c: start[c] for c in same}
    assert reserved["fencing_token"] == '"fencing_token" + 1'
    claim = sets(text("claim_and_start", dialect))
    free = "COALESCE(strpos" if dialect == "postgresql" else "COALESCE(instr"
    for column in ("status", "attempts", "started_at", "lease_until", "worker", "fencing_token"):
        value = start[column] if column not in ("status", "fencing_token") else None
        assert claim[column].startswith(f"CASE WHEN {free}"), column
        if value is not None:
            assert f" THEN {value} ELSE " in claim[column], column
    if dialect == "postgresql":
        fenced = text("start_attempt_fenced", dialect)
        main = fenced[fenced.index(") UPDATE ") + 2:]
        assert main == text("start_attempt", dialect).replace(
            'COALESCE(%(token)s, "fencing_token" + 1)', '(SELECT "token" FROM drawn)')


@pytest.mark.parametrize("dialect", DIALECTS)
def test_startable_reads_start_attempts_conditions(dialect):
    where = text("start_attempt", dialect).split(" WHERE ", 1)[1].split(" RETURNING ")[0]
    assert text("startable", dialect).endswith(f" WHERE {where}")


def head(sql: str) -> str:
    """A claim's or a reservation's queue head (its subquery)."""
    return re.search(r"\(SELECT \"id\" FROM \{jobs\} WHERE .*? LIMIT 1", sql).group(0)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_claim_and_reservation_serves_one_queue_head(dialect):
    moves = ["claim_parked", "claim_and_start", "reserve"]
    if dialect == "postgresql":
        moves += ["claim_parked_no_flush_wait", "reserve_no_flush_wait"]
    heads = {name: head(text(name, dialect)) for name in moves}
    assert len(set(heads.values())) == 1, heads
    assert text("now", dialect) in next(iter(heads.values()))


@pytest.mark.parametrize("move", ["park", "claim_parked", "reserve"])
def test_a_move_without_the_flush_wait_is_the_move_itself_wrapped(move):
    """One statement (psycopg 3 prepares it; two in one string it refuses with parameters): the move's own
    text in a CTE, the session's setting untouched."""
    wrapped = text(f"{move}_no_flush_wait", "postgresql")
    plain = queries.text_of(move, "postgresql")
    assert wrapped == (f"WITH moved AS ({plain}) SELECT moved.* FROM moved, "
                       "(SELECT set_config('synchronous_commit', 'off', true)) AS no_flush_wait")
    assert ";" not in wrapped


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_outcome_appends_to_the_history_as_peewee_writes_do(dialect):
    appended = text("update_fenced_with_history", dialect)
    assert f'"history" = {text("history_append", dialect)} WHERE ' in appended
    assert appended.replace(f', "history" = {text("history_append", dialect)}', "") == text("update_fenced", dialect)


def test_a_fenced_start_draws_as_draw_token_draws():
    drawn = text("start_attempt_fenced", "postgresql")
    assert drawn.startswith(f"WITH drawn AS ({text('draw_token', 'postgresql')}), revoked AS (UPDATE ")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_bulk_actions_expressions_read_the_suites_marker(dialect):
    assert set(EXPRESSIONS) <= set(names_of(dialect))
    assert f"'{MARKER}'" in text("restarted_count", dialect) and f"'{RETRY_BASE}'" in text("restarted_count", dialect)
    assert MARKER in text("queue_lock_token", dialect)

"""The suite's raw SQL, read once from ``queries.sql`` and rendered per table and dialect.

The hot statements (a send, an attempt's start, its outcome, the parking
moves) skip peewee's query builder, which costs more Python time than the
round trip it makes (:mod:`dramatiq_unique.storage.statements` says how
much).  Their text lives in one file, as Procrastinate keeps its own: a
block per statement, named by a ``-- name:`` line and described by the
comment lines under it.  A block whose name ends in ``(postgresql)`` or
``(sqlite)`` is that dialect's variant; a block without one serves both.

What a block may hold besides SQL, and what it renders to:

``{jobs}``, ``{fences}``
    the job table (with its schema) and the fencing-token table, quoted;
``{columns}``, ``{jobs_columns}``
    every column of the model, plain or qualified by the job table (a
    model may add columns: a RETURNING of the whole row names them all);
``{block}``
    another block, in the same dialect; ``{slot}`` a block the caller
    names at render time (``slot="block"``, or ``("block", n)`` for ``n``
    copies joined by commas);
``[a | b]``
    a value of a conditional write: ``a`` alone, or, when the caller names a
    ``guard`` block, ``CASE WHEN <guard> THEN a ELSE b END`` (a start that
    only some rows take, yet writes the same list as every other start);
``"column"``
    an identifier, quoted as the database quotes them;
``%(name)s``
    a parameter: rendered as the database's parameter mark, in order, and
    filled by name (:meth:`Statement.params`), so a statement's parameter
    order is written down once, in the SQL.

Rendered text is kept per (statement, model, slots, dialect, table): the
database's part by what the text depends on, not by ``id(database)``, which
a new Database object may reuse after the old one is gone.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Mapping, Optional, Union

import peewee as pw

#: A peewee model class with a job table (this module imports no model: the schema uses it too).
Model = type[pw.Model]

#: The file of named queries, next to this module (for messages).  It is package data, read
#: through importlib.resources as redis/lua.py reads the scripts: a zipped install has no file.
PATH = "dramatiq_unique/storage/queries.sql"
#: The fencing-token table (:mod:`dramatiq_unique.storage.fencing`).
FENCES = "dramatiq_unique_fences"

_HEADER = re.compile(r"^-- name: (\w+)(?: \((postgresql|sqlite)\))?\s*$")
_PLACE = re.compile(r"\{(\w+)\}")
_PARAM = re.compile(r"%\((\w+)\)s")
_IDENT = re.compile(r'"(\w+)"')
_CHOICE = re.compile(r"\[([^\[\]|]+)\|([^\[\]|]+)\]")

Slot = Union[str, tuple[str, int]]


def is_postgres(db: pw.Database) -> bool:
    return isinstance(db, pw.PostgresqlDatabase)


def dialect_of(db: pw.Database) -> str:
    return "postgresql" if is_postgres(db) else "sqlite"


def parse(text: str) -> dict[tuple[str, Optional[str]], str]:
    """The blocks of a queries file: {(name, dialect or None): body on one line}."""
    blocks: dict[tuple[str, Optional[str]], list[str]] = {}
    body: Optional[list[str]] = None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            key = (header.group(1), header.group(2))
            if key in blocks:
                raise ValueError(f"{PATH}: query {key} is defined twice")
            body = blocks[key] = []
        elif line.startswith("--") or not line.strip():
            continue  # a description, or a blank line between blocks
        elif body is None:
            raise ValueError(f"{PATH}: SQL before the first '-- name:' line: {line!r}")
        else:
            body.append(line.strip())
    return {key: " ".join(lines) for key, lines in blocks.items()}


BLOCKS = parse(resources.files(__package__).joinpath("queries.sql").read_text(encoding="utf-8"))


def quote(db: pw.Database, name: str) -> str:
    """``name`` quoted as an identifier of ``db``: the one quoting rule of the suite's SQL."""
    left, right = db.quote[0], db.quote[1]  # peewee keeps the pair of quote characters as one string
    return f"{left}{name}{right}"


def table(db: pw.Database, name: str, schema: Optional[str] = None) -> str:
    """A table's (or index's) name, in its schema if it has one, quoted for ``db``."""
    return f"{quote(db, schema)}.{quote(db, name)}" if schema else quote(db, name)


def jobs_table(model: Model) -> str:
    """The model's job table, quoted and in its schema."""
    meta = model._meta
    return table(meta.database, meta.table_name, meta.schema)


def dialect_key(model: Model) -> tuple:
    """What a statement's text depends on besides the statement itself."""
    meta, db = model._meta, model._meta.database
    return (meta.table_name, meta.schema, db.param, tuple(db.quote), is_postgres(db))


@dataclass(frozen=True)
class Statement:
    """A rendered query: its text and the names of its parameters, in order."""

    sql: str
    names: tuple[str, ...]

    def params(self, values: Mapping[str, Any]) -> list[Any]:
        """The statement's parameters, in order, from ``values`` by name."""
        return [values[name] for name in self.names]


_cache: dict[tuple, Any] = {}
_cache_lock = threading.Lock()


def kept(key: tuple, make: Callable[[], Any]) -> Any:
    """``make()``'s result, made once per ``key``: the one cache of rendered SQL."""
    found = _cache.get(key)
    if found is None:
        with _cache_lock:
            found = _cache.get(key)
            if found is None:
                found = _cache[key] = make()
    return found


def render(model: Model, name: str, **slots: Slot) -> Statement:
    """Query ``name`` for ``model``'s table in its database's dialect; rendered once."""
    # Slots in the caller's order (one per call site; not sorted: this runs per statement). Model: {columns}.
    key = (name, model, tuple(slots.items()), dialect_key(model))
    return kept(key, lambda: build(model, name, **slots))


def text(model: Model, name: str, **slots: Slot) -> str:
    """A block without parameters (an SQL expression, a fragment), rendered for ``model``."""
    statement = render(model, name, **slots)
    if statement.names:
        raise ValueError(f"query {name} takes parameters: render() it")
    return statement.sql


def render_on(db: pw.Database, name: str) -> Statement:
    """Query ``name``, which names no job table (the fence table's own), for ``db``; rendered once."""
    return kept((name, None, (db.param, tuple(db.quote), is_postgres(db))), lambda: _build(db, None, name, {}))


def build(model: Model, name: str, **slots: Slot) -> Statement:
    """:func:`render` without keeping the text: for a statement whose length varies by call."""
    return _build(model._meta.database, model, name, slots)


def _build(db: pw.Database, model: Optional[Model], name: str, slots: Mapping[str, Slot]) -> Statement:
    dialect = dialect_of(db)
    fixed = {"fences": quote(db, FENCES)}
    if model is not None:
        jobs = fixed["jobs"] = jobs_table(model)
        columns = [f.column_name for f in model._meta.sorted_fields]
        fixed["columns"] = ", ".join(quote(db, c) for c in columns)
        fixed["jobs_columns"] = ", ".join(f"{jobs}.{quote(db, c)}" for c in columns)

    def block(block_name: str, depth: int) -> str:
        body = BLOCKS.get((block_name, dialect)) or BLOCKS.get((block_name, None))
        if body is None:
            raise KeyError(f"no query {block_name!r} for {dialect} in {PATH}")
        if depth > 8:
            raise ValueError(f"query {name!r}: blocks include each other in a loop")
        if tuple(db.quote) != ('"', '"'):
            body = _IDENT.sub(lambda m: quote(db, m.group(1)), body)
        body = _CHOICE.sub(choose, body)
        return _PLACE.sub(lambda m: place(m.group(1), depth + 1), body)

    def choose(choice: re.Match) -> str:
        then, otherwise = choice.group(1).strip(), choice.group(2).strip()
        return f"CASE WHEN {{guard}} THEN {then} ELSE {otherwise} END" if "guard" in slots else then

    def place(word: str, depth: int) -> str:
        if word in fixed:
            return fixed[word]
        slot = slots.get(word)
        if isinstance(slot, tuple):
            return ", ".join([block(slot[0], depth)] * slot[1])
        return block(slot if slot is not None else word, depth)

    sql = block(name, 0)
    names = tuple(_PARAM.findall(sql))
    return Statement(_PARAM.sub(lambda _: db.param, sql), names)

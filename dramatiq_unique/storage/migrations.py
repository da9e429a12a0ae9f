"""The migrations from one schema version to the next, and applying them (``migrate``, ``status``):
additive, idempotent, one transaction per table under the set-up lock (docs/operations/migrations.md)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import peewee as pw
from playhouse import migrate as pw_migrate

from dramatiq_unique.storage import queries, schema
from dramatiq_unique.storage.models import RENAMED_INDEXES
from dramatiq_unique.storage.queries import Model
from dramatiq_unique.storage.schema import COLUMNS, CURRENT_VERSION

#: Indexes that a version dropped, by version: (columns, unique).  Version 1 led them with the app;
#: version 4 serves the running rows by the open rows' partial index.
OLD_INDEXES = {
    1: ((("status", "process_after"), False), (("status", "lease_until"), False), (("finished_at",), False),
        (("unique_hold",), True), (("idempotency_hold",), True), (("parked_on",), False)),
    4: ((("app", "status", "lease_until"), False),),
}


#: ms a migration step may wait for its table's lock on PostgreSQL: a failed migrate, run again later,
#: rather than every worker's statement stalled behind the ALTER TABLE.
DEFAULT_LOCK_TIMEOUT = 5_000


@dataclasses.dataclass(frozen=True)
class Step:
    """One change of a migration: what it does, in words, and doing it."""

    text: str
    run: Callable[[], None]


def _creating(model: Model) -> Callable[[], None]:
    return lambda: model._schema.create_indexes(safe=True)  # type: ignore[attr-defined]  # only those missing


def _dropping(model: Model, name: str) -> Callable[[], None]:
    db = model._meta.database
    return lambda: db.execute_sql(f"DROP INDEX IF EXISTS {queries.table(db, name, model._meta.schema)}")


def _to_v1(model: Model, names: set[str]) -> list[Step]:
    db = model._meta.database
    steps = []
    if "app" not in names:
        steps.append(Step("add column app VARCHAR(255) NOT NULL DEFAULT ''",
                          lambda: db.execute_sql(queries.statement(model, "add_app_column").sql)))
    steps.append(Step("create the model's indexes that are missing (app first)", _creating(model)))
    return steps + [Step(f"drop index {index} if it exists (replaced by an app-first one)", _dropping(model, index))
                    for index in _old_indexes(model, 1)]


def _old_indexes(model: Model, version: int) -> list[str]:
    """The names of the indexes ``version`` dropped, but those ``model`` declares itself (a subclass keeps them)."""
    wanted = {tuple(columns) for columns, _ in model._meta.indexes}
    return [_whole_name(model, columns) for columns, _ in OLD_INDEXES[version]
            if columns not in wanted and all(name in model._meta.fields for name in columns)]


def _whole_name(model: Model, columns: tuple[str, ...]) -> str:
    """Peewee's name of ``model``'s index of ``columns`` (a partial one of RENAMED_INDEXES has another)."""
    return pw.ModelIndex(model, [model._meta.fields[c] for c in columns])._name  # type: ignore[attr-defined]


def _adding(version: int) -> Callable[[Model, set[str]], list[Step]]:
    """The steps that add the columns ``version`` added, each as the model declares it but NULL; a column
    the table has already (a job_model that declared it) is left as it is."""
    def steps(model: Model, names: set[str]) -> list[Step]:
        migrator = pw_migrate.SchemaMigrator.from_database(model._meta.database, schema=model._meta.schema)
        fields = {name: type(model._meta.fields[name])(null=True) for name in COLUMNS[version] if name not in names}
        return [Step(f"add column {name} {field.field_type} NULL", lambda name=name, field=field: pw_migrate.migrate(  # type: ignore[misc]
            migrator.add_column(model._meta.table_name, name, field))) for name, field in fields.items()]
    return steps


def _found(model: Model) -> dict[str, str]:
    """The table's indexes: their names and definitions."""
    meta = model._meta
    return {index.name: index.sql or "" for index in meta.database.get_indexes(meta.table_name, schema.where(model))}


def _to_v4(model: Model, names: set[str]) -> list[Step]:
    meta = model._meta
    found = _found(model)
    # A whole index of a partial one's name is dropped first (CREATE INDEX IF NOT EXISTS would keep it); a
    # partial one made beforehand (CONCURRENTLY) is kept.
    whole = [index._name for index in meta.fields_to_index()
             if index._where is not None and " WHERE " not in found.get(index._name, " WHERE ").upper()]
    steps = [Step(f"drop index {name} (made again partial)", _dropping(model, name)) for name in whole]
    steps += [Step(f"drop index {name} (the open rows' index serves the running ones)", _dropping(model, name))
              for name in _old_indexes(model, 4) if name in found]
    return [*steps, Step("create the partial indexes that are missing (a row only in those it is looked for by)",
                         _creating(model))]


def _to_v5(model: Model, names: set[str]) -> list[Step]:
    return [Step("create the partial index of the unique holds (the whole one stays until migrate --contract) "
                 "and the index of the rows of no app", _creating(model))]


def replaced(model: Model) -> list[str]:
    """The whole indexes that ``model``'s table still has of those that partial ones of another name replaced
    (``RENAMED_INDEXES``): the earlier release's statements name them (``ON CONFLICT`` infers no partial
    index), so ``migrate`` leaves them to ``migrate --contract``, run once no process of that release runs."""
    names = [_whole_name(model, columns) for columns in RENAMED_INDEXES  # none on the limits' table
             if all(name in model._meta.fields for name in columns)]
    found = _found(model) if names else {}
    return [name for name in names if name in found and " WHERE " not in found[name].upper()]


def _contract(model: Model) -> list[Step]:
    return [Step(f"drop index {name} (replaced by a partial one; no process of an earlier release may run)",
                 _dropping(model, name)) for name in replaced(model)]


#: version: (its name, its steps for a table whose columns are given).
MIGRATIONS: dict[int, tuple[str, Callable[[Model, set[str]], list[Step]]]] = {
    1: ("app column and app-first indexes", _to_v1),
    2: ("per-attempt history", _adding(2)),
    3: ("time parked", _adding(3)),
    4: ("partial indexes", _to_v4),
    5: ("partial index of the unique holds", _to_v5),
}
assert max(MIGRATIONS) == CURRENT_VERSION, "a migration to every version up to CURRENT_VERSION"
# The suite's other tables (the limits' one) have had one version: none has a migration yet.


@dataclasses.dataclass
class TableStatus:
    """A job table in one store: its version (None: no table), the target, what migrate would do."""

    table: str
    store: str
    version: Optional[int]
    target: int = CURRENT_VERSION
    #: "version N (name): step", in order.
    pending: list[str] = dataclasses.field(default_factory=list)
    #: What ``migrate --contract`` would do after the upgrade: whole indexes the version replaced, still there.
    contract: list[str] = dataclasses.field(default_factory=list)
    #: What this run applied (migrate only).
    applied: list[str] = dataclasses.field(default_factory=list)
    error: Optional[str] = None

    @property
    def current(self) -> bool:
        return self.error is None and self.version is not None and self.version >= self.target

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "current": self.current}


def _plan(model: Model) -> tuple[Optional[int], list[Step]]:
    """The table's version, and its steps to the current one, each described as "version N (name): step"."""
    version = schema.version_of(model)
    if version is None:
        return None, []
    names, steps = schema.columns(model), []
    for target in range(version + 1, schema.target_version(model) + 1):
        # A later migration's look at the columns counts what the earlier ones add.
        after = names.union(*(COLUMNS.get(earlier, ()) for earlier in range(1, target)))
        name, make = MIGRATIONS[target]
        steps += [Step(f"version {target} ({name}): {step.text}", step.run) for step in make(model, after)]
    return version, steps


def status(model: Model, store: str = "") -> TableStatus:
    """``model``'s table in its store (read only)."""
    version, steps = _plan(model)
    pending = ["create the table at the current version (at set-up)"] if version is None else [
        step.text for step in steps]
    contract = [] if version is None else [step.text for step in _contract(model)]
    return TableStatus(schema.table_key(model), store, version, target=schema.target_version(model), pending=pending,
                       contract=contract)


def migrate(model: Model, store: str = "", *, dry_run: bool = False, contract: bool = False,
            lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> TableStatus:
    """Bring ``model``'s table to the current version (create it if missing); with ``contract``, then drop the
    whole indexes it replaced (once no process of an earlier release runs); with ``dry_run``, only say how.
    On PostgreSQL a step that waits more than ``lock_timeout`` ms for the table's lock rolls it all back."""
    if dry_run:
        planned = status(model, store)
        if contract:  # pending now, not after the upgrade
            planned.pending, planned.contract = planned.pending + planned.contract, []
        return planned
    db = model._meta.database
    with schema.locked(db):
        if isinstance(db, pw.PostgresqlDatabase):
            db.execute_sql(f"SET LOCAL lock_timeout TO {int(lock_timeout)}")  # an int: no injection
        version, steps = _plan(model)  # again, under the lock: another run may have migrated it
        current = schema.target_version(model)
        result = TableStatus(schema.table_key(model), store, version, target=current)
        if version is None:
            schema.create_or_migrate(model)
            result.applied.append(f"create the table at version {current}")
        else:
            for step in steps:
                step.run()
                result.applied.append(step.text)
            if version < current or schema.recorded(model) is None:
                schema.record(model, max(version, current))
        after = _contract(model)  # after the version's steps, which make the table's indexes
        for step in after if contract else []:
            step.run()
            result.applied.append(step.text)
        result.version = max(version or 0, current)
        result.contract = [] if contract else [step.text for step in after]
    return result

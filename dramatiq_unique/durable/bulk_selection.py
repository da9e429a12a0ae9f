"""Which rows a bulk action (:mod:`dramatiq_unique.durable.bulk_actions`) takes, and the pieces of its
statements that depend on the dialect: a row's lock type and its marker, read and written in SQL
(JSON functions of PostgreSQL and SQLite), so that no row is read into Python.

Conditions take the model or an alias of it (the statements' subqueries look at other rows of the
same table).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING, Any, Optional

import peewee as pw

from dramatiq_unique import options as opt
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable import claims
from dramatiq_unique.durable.scope import NO_APP, Scope
from dramatiq_unique.storage.models import WAITING, JobModel, JobStatus, is_postgres
from dramatiq_unique.storage.stores import base_of

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

FAILED = JobStatus.FAILED.value
RETRY, CANCEL = "retry", "cancel"


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which rows a bulk action takes, besides its own statuses and the app's scope."""

    #: One actor's rows only.
    actor: Optional[str] = None
    #: Rows of these unique keys only (an empty tuple: none); None: any key.
    unique_keys: Optional[tuple[str, ...]] = None
    #: Dead jobs that failed at or after it; waiting jobs created at or after it (naive UTC).
    since: Optional[datetime] = None
    #: Dead jobs whose error holds this text (any case).
    error: Optional[str] = None
    #: The waiting statuses a cancel takes (all of them by default).
    statuses: tuple[str, ...] = WAITING


@dataclasses.dataclass
class Outcome:
    """What a bulk action did, or (``preview``) would do."""

    action: str
    #: Rows taken (retried or cancelled); for a preview, the rows that match.
    done: int = 0
    #: Retry: rows left failed because another job holds (or takes) their key, and the first few of
    #: them as (job id, the id of the job holding its key, or None when another retried one takes it).
    blocked: int = 0
    blocked_by: list[tuple[int, Optional[int]]] = dataclasses.field(default_factory=list)
    #: Rows that match, of actors this process does not declare: left as they are.
    undeclared: int = 0
    #: Stores that did not answer: their rows were not acted on.
    down: list[str] = dataclasses.field(default_factory=list)
    preview: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def statusof(action: str, table: Any, sel: Selection) -> Any:
    return (table.status == FAILED) if action == RETRY else table.status.in_(sel.statuses)


def matching(suite: "Suite", action: str, table: Any, sel: Selection) -> Any:
    """This app's rows (legacy ones too) of ``action``'s statuses that ``sel`` selects, any actor.
    ``table`` is the model or an alias of it (the statements' subqueries)."""
    cond = table.app.in_((suite.app, NO_APP)) & statusof(action, table, sel)
    if sel.actor is not None:
        cond &= table.actor_name == sel.actor
    if sel.unique_keys is not None:
        cond &= table.unique_key.in_(sel.unique_keys) if sel.unique_keys else pw.SQL("1 = 0")
    if sel.since is not None:
        cond &= (table.finished_at if action == RETRY else table.created_at) >= sel.since
    if sel.error:
        cond &= table.last_error.contains(sel.error)  # ILIKE on PostgreSQL, LIKE on SQLite; wildcards escaped
    return cond


def declared(scope: Scope, model: type[JobModel]) -> tuple[str, ...]:
    return scope.actors.get(base_of(model), ())


def of(table: Any, names: tuple[str, ...]) -> Any:
    return table.actor_name.in_(names) if names else pw.SQL("1 = 0")


def holds(suite: "Suite", model: type[JobModel], table: Any, names: tuple[str, ...]) -> Any:
    """Whether the row of ``table`` (``model`` or an alias of it) holds its unique key while it waits
    (its lock type is not ``while_executing``), in SQL."""
    return table.unique_key.is_null(False) & (lock_type(suite, model, table, names) != opt.WHILE_EXECUTING)


def lock_type(suite: "Suite", model: type[JobModel], table: Any, names: tuple[str, ...]) -> Any:
    """The unique lock type of the row of ``table`` in SQL: its message's option, else its actor's, else
    the default.  Its options are named unqualified: the innermost query's row, which ``table`` must be."""
    if is_postgres(model._meta.database):
        own = pw.SQL("CAST(\"options\" AS jsonb) ->> 'unique_lock'")
    else:
        own = pw.SQL("json_extract(\"options\", '$.unique_lock')")
    locks = []
    for name in names:
        config = suite.actor_config(name)
        if config is not None:
            locks.append((name, config.unique_lock))
    actors = pw.Case(table.actor_name, locks, opt.DEFAULT_UNIQUE_LOCK) if locks else opt.DEFAULT_UNIQUE_LOCK
    return pw.fn.COALESCE(own, actors)


def restarted_count(model: type[JobModel]) -> Any:
    """The row's options with Retries' count restarted at its attempts (the marker's ``rb``, as
    retry_job writes it) and the message's own count dropped (claims.build_message gives it one)."""
    base = claims.RETRY_BASE
    if is_postgres(model._meta.database):
        return pw.SQL(
            f"CAST(jsonb_set(CAST(\"options\" AS jsonb) - 'retries', '{{{MARKER}}}', "
            f"COALESCE(CAST(\"options\" AS jsonb) -> '{MARKER}', '{{}}'::jsonb) "
            f"|| jsonb_build_object('{base}', \"attempts\")) AS text)"
        )
    # json_patch merges objects (RFC 7396): the marker's other entries stay, a missing marker is made.
    return pw.SQL(f"json_patch(json_remove(\"options\", '$.retries'), "
                  f"json_object('{MARKER}', json_object('{base}', \"attempts\")))")


def queue_lock_token(model: type[JobModel]) -> Any:
    """The token of the row's Redis queue lock, as its send wrote it in the marker (``qt``), in SQL."""
    if is_postgres(model._meta.database):
        return pw.SQL(f"CAST(\"options\" AS jsonb) -> '{MARKER}' ->> 'qt'")
    return pw.SQL(f"json_extract(\"options\", '$.{MARKER}.qt')")

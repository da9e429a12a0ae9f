"""Run-time limits, kept: each override a row in the database (the record), and a copy in Redis for the
slot scripts.  A marker key says Redis holds every override; a slot script that finds it missing
answers ``LIMITS_UNKNOWN`` rather than decide at the declared limit (:func:`restore_if_lost`).  How a
change and a restore take turns: docs/discussions/how-it-is-built.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import threading
import weakref
from datetime import datetime
from typing import TYPE_CHECKING, Any, Iterator, Optional

import peewee as pw

from dramatiq_unique.errors import DatabaseUnavailable, redis_errors
from dramatiq_unique.guard import guarded
from dramatiq_unique.redis.keys import glob_escape
from dramatiq_unique.storage import schema
from dramatiq_unique.storage.database import DB_ERRORS, describe, is_postgres
from dramatiq_unique.storage.models import LimitModel, bound_limits, utcnow

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

#: What a slot script answers when the marker is missing (redis/lua/_slot_prelude.lua).
LIMITS_UNKNOWN = "LIMITS_UNKNOWN"
#: Named in the PostgreSQL advisory lock that changes and restores of an app's limits take turns on.
LOCK_NAME = "dramatiq_unique.slots.overrides"
#: Overrides read at most by a listing or a restore (an app has a handful; a bound all the same).
MAX_OVERRIDES = 10_000

# Restores of one process take turns: after a flush every thread's next slot call finds the
# marker gone, and one restore is enough.
_restoring = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Override:
    """A limit set at run time: the actor's own (``group`` '') or one slot group's (``<actor>:<digest>``),
    with its key in words (``customer=42``) and as ``set_concurrency_limit`` took it, where known."""

    actor: str
    group: str
    limit: int
    words: Optional[str]
    key: Any
    set_at: Optional[datetime]


def redis_key(suite: "Suite", actor: str, group: str) -> str:
    return suite.keys.limit(group) if group else suite.keys.actor_limit(actor)


_models: "weakref.WeakKeyDictionary[Suite, type[LimitModel]]" = weakref.WeakKeyDictionary()
_models_lock = threading.Lock()


def writes(suite: "Suite") -> bool:
    """Whether ``suite`` may write (the command line's suite from the environment may not)."""
    return bool(getattr(suite, "writes", True))


def model_of(suite: "Suite") -> type[LimitModel]:
    """The limits' table of ``suite``'s primary store."""
    with _models_lock:
        model = _models.get(suite)
        if model is None:
            model = _models[suite] = bound_limits(suite.db)
        return model


def open_table(suite: "Suite") -> None:
    """Create the limits' table in the primary if missing; a primary that does not answer, of several
    stores, gets it at its first use."""
    if not writes(suite):
        return
    model = model_of(suite)
    try:
        suite.stores.ensure(model, 0)
    except DB_ERRORS as e:
        if not suite.stores.several:
            raise DatabaseUnavailable(f"creating {model._meta.table_name} in {describe(suite.db)}: {e}") from e
        logger.warning("Could not create %s in %s (%s); it is created at its first use.",
                       model._meta.table_name, describe(suite.db), e)


def _model(suite: "Suite") -> type[LimitModel]:
    model = model_of(suite)
    if writes(suite):
        with guarded("opening the run-time limits' table"):
            suite.stores.ensure(model, 0)  # a primary down at set-up gets the table now
    return model


@contextlib.contextmanager
def _turns(db: pw.Database, app: str) -> Iterator[None]:
    """A transaction no other change or restore of the app's limits runs in: on PostgreSQL an advisory
    lock of the app's, on SQLite the write lock from the start."""
    if isinstance(db, pw.SqliteDatabase) and not db.in_transaction():
        with db.atomic(lock_type="IMMEDIATE"):
            yield
    else:
        with db.atomic():
            if is_postgres(db):
                lock = int.from_bytes(hashlib.sha256(f"{LOCK_NAME}:{app}".encode()).digest()[:8], "big", signed=True)
                db.execute_sql("SELECT pg_advisory_xact_lock(%s)", [lock])
            yield


def _rows(model: type[LimitModel], app: str) -> list[Override]:
    query = model.select().where(model.app == app).order_by(model.actor_name, model.group_key).limit(MAX_OVERRIDES)
    return [Override(row.actor_name, row.group_key or "", int(row.concurrency_limit), row.words, row.key, row.set_at)
            for row in query]


def write(suite: "Suite", actor: str, group: str, limit: Optional[int], *, words: Optional[str] = None,
          key: Any = None) -> None:
    """Set (``limit`` an int) or remove (None) an override: the row, and Redis's copy in its transaction."""
    model = _model(suite)
    db = model._meta.database
    target = redis_key(suite, actor, group)
    level = (model.app == suite.app) & (model.actor_name == actor) & (model.group_key == group)
    with guarded(f"recording the concurrency limit of {actor!r}"), _turns(db, suite.app):
        if limit is None:
            model.delete().where(level).execute()
        else:
            now = utcnow()
            try:  # the key if JSON can keep it as it is (a tuple becomes a list: set_concurrency_limit takes both)
                kept = json.loads(json.dumps(key))
            except (TypeError, ValueError):
                kept = None
            model.insert(
                app=suite.app, actor_name=actor, group_key=group, concurrency_limit=int(limit), words=words, key=kept,
                set_at=now,
            ).on_conflict(
                conflict_target=[model.app, model.actor_name, model.group_key],
                update={model.concurrency_limit: int(limit), model.words: words, model.key: kept, model.set_at: now},
            ).execute()
        # Raised inside the transaction: the row is as it was.
        with redis_errors(f"setting the concurrency limit of {actor!r}"):
            if limit is None:
                suite.redis.delete(target)
            else:
                suite.redis.set(target, int(limit))


def listing(suite: "Suite", actor: Optional[str] = None) -> list[Override]:
    """The app's overrides (of ``actor``, or all), by actor and group."""
    with guarded("reading the run-time limits"):
        model = _model(suite)
        if not writes(suite) and not schema.columns(model):
            return []  # a database the app has not yet set up with this release: none kept
        rows = _rows(model, suite.app)
    return [override for override in rows if actor is None or override.actor == actor]


def find(suite: "Suite", actor: str, group: str) -> Optional[Override]:
    return next((o for o in listing(suite, actor) if o.group == group), None)


def restore(suite: "Suite") -> int:
    """Put every override of the app back in Redis and set the marker; when the marker was missing,
    adopt first the overrides Redis has without a row.  Returns how many overrides it wrote."""
    model = _model(suite)
    client, marker = suite.redis, suite.keys.limits_loaded()
    with guarded("restoring the run-time limits"), _turns(model._meta.database, suite.app):
        rows = _rows(model, suite.app)
        with redis_errors("restoring the run-time limits"):
            if not client.exists(marker):
                rows += _adopt(suite, model, rows)
            with client.pipeline(transaction=True) as pipe:
                for o in rows:
                    pipe.set(redis_key(suite, o.actor, o.group), o.limit)
                pipe.set(marker, 1)
                pipe.execute()
    return len(rows)


def restore_if_lost(suite: "Suite") -> int:
    """:func:`restore` if the marker is missing; 0 if another thread did it meanwhile, or if this suite
    may not write (the command line's from the environment)."""
    if not writes(suite):
        return 0
    with _restoring:
        with redis_errors("reading the run-time limits' marker"):
            if suite.redis.exists(suite.keys.limits_loaded()):
                return 0
        return restore(suite)


def check(suite: "Suite") -> int:
    """For each re-drive pass: :func:`restore` if Redis misses the marker or any override, or holds
    another value than the row; returns the overrides written (0 when all were in place)."""
    if not writes(suite):
        return 0
    model = _model(suite)
    with guarded("reading the run-time limits"):
        rows = _rows(model, suite.app)
    names = [redis_key(suite, override.actor, override.group) for override in rows]
    with redis_errors("reading the run-time limits"):
        values = suite.redis.mget([*names, suite.keys.limits_loaded()])
    if values[-1] is not None and all(
        value is not None and int(value) == override.limit for value, override in zip(values, rows, strict=False)
    ):
        return 0
    return restore(suite)


def _adopt(suite: "Suite", model: type[LimitModel], known: list[Override]) -> list[Override]:
    """Overrides in Redis without a row (a release that kept none wrote them): recorded, without words."""
    have = {redis_key(suite, o.actor, o.group) for o in known}
    found: list[Override] = []
    for prefix, of_group in ((suite.keys.limit(""), True), (suite.keys.actor_limit(""), False)):
        for listed in suite.redis.scan_iter(match=glob_escape(prefix) + "*", count=1000):
            full = listed.decode(errors="replace") if isinstance(listed, bytes) else str(listed)
            name = full[len(prefix):]
            if full in have or len(found) >= MAX_OVERRIDES:
                continue
            raw = suite.redis.get(full)
            try:
                limit = int(raw) if raw is not None else None
            except ValueError:
                limit = None
            if limit is None or limit < 0:
                continue
            actor, group = (name.rsplit(":", 1)[0], name) if of_group else (name, "")
            model.insert(app=suite.app, actor_name=actor, group_key=group, concurrency_limit=limit,
                         set_at=utcnow()).on_conflict_ignore().execute()
            found.append(Override(actor, group, limit, None, None, None))
    return found

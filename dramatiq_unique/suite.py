"""The suite's configuration: :class:`Suite` and per-actor resolved options."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import socket
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import peewee as pw
import redis as redis_lib

from dramatiq_unique import options as opt
from dramatiq_unique.errors import DatabaseUnavailable, InvalidOption, NotConfigured
from dramatiq_unique.locks.masters import DEFAULT_LOCK_TIMEOUT
from dramatiq_unique.locks.redlock import Locks
from dramatiq_unique.redis.keys import DEFAULT_KEY_PREFIX, RedisKeys
from dramatiq_unique.redis.servers import client_from_url
from dramatiq_unique.storage import queries
from dramatiq_unique.storage import stores as _stores
from dramatiq_unique.storage.database import DB_ERRORS, configure_pooler, describe, open_database
from dramatiq_unique.storage.database import check as check_database
from dramatiq_unique.storage.models import JobModel, base_field_names

if TYPE_CHECKING:
    import dramatiq

logger = logging.getLogger(__name__)

#: ms after its lease ran out (or it was due) that a job missing from the broker counts as lost.
DEFAULT_LOST_AFTER = 60_000
#: What happens to a lost job: "redrive" sends it again, "fail" marks it failed.
DEFAULT_ON_LOST = "redrive"
#: How long (ms) finished rows are kept before the re-drive prunes them: 7 days.
DEFAULT_RETENTION = 7 * 24 * 3600 * 1000
#: How long (ms) an idempotency key returns the same job: 24 hours.
DEFAULT_IDEMPOTENCY_WINDOW = 24 * 3600 * 1000

#: ms a new PostgreSQL connection may take.
DEFAULT_DATABASE_CONNECT_TIMEOUT = 5_000
#: ms a PostgreSQL statement may take, and a dead connection may go unnoticed.
DEFAULT_DATABASE_TIMEOUT = 30_000
#: ms each Redis server may take to answer setup()'s check.
DEFAULT_CHECK_TIMEOUT = 2_000

#: Longest app name the ``app`` column holds.
MAX_APP_LENGTH = 255


def app_name(key_prefix: str) -> str:
    """The app a suite with ``key_prefix`` writes into its rows (a too-long prefix is shortened, stably)."""
    if len(key_prefix) <= MAX_APP_LENGTH:
        return key_prefix
    digest = hashlib.sha256(key_prefix.encode("utf-8")).hexdigest()[:40]
    return f"{key_prefix[:MAX_APP_LENGTH - 41]}~{digest}"


RedisSpec = Union[str, redis_lib.Redis, Sequence[Union[str, redis_lib.Redis]]]


@dataclasses.dataclass
class Settings:
    """Suite-wide settings; every time is in milliseconds."""

    lost_after: int = DEFAULT_LOST_AFTER
    on_lost: str = DEFAULT_ON_LOST
    retention: int = DEFAULT_RETENTION
    idempotency_window: int = DEFAULT_IDEMPOTENCY_WINDOW
    #: Prefix of every Redis key the suite writes (tests give each run its own).
    key_prefix: str = DEFAULT_KEY_PREFIX
    #: Whether worker processes start the re-drive scheduler after boot.
    redriver: bool = True
    #: ms between re-drive passes.
    redrive_interval: int = 5_000
    #: Rows a re-drive pass handles per page.
    redrive_page_size: int = 500
    #: Whether the hot statements (send, start, outcome, parking moves) are prepared once per PostgreSQL
    #: connection (psycopg2: :mod:`dramatiq_unique.storage.queries`; psycopg 3: its ``prepare_threshold``);
    #: None: prepared unless the database is behind a pooler in transaction mode, where True is refused
    #: (:func:`dramatiq_unique.storage.database.configure_pooler`).
    prepared_statements: Optional[bool] = None
    #: ms a new PostgreSQL connection may take (libpq's ``connect_timeout``, in whole seconds, at least 2):
    #: bounds a server that takes the connection but never answers.
    database_connect_timeout: int = DEFAULT_DATABASE_CONNECT_TIMEOUT
    #: ms a PostgreSQL statement may run (``statement_timeout``), and a dead server or network may go
    #: unnoticed under an open connection (TCP keepalives and ``tcp_user_timeout``).  Both apply to a
    #: database given as a URL; a URL parameter of the same name wins.  SQLite keeps its 30 s busy timeout.
    database_timeout: int = DEFAULT_DATABASE_TIMEOUT
    #: Whether :func:`dramatiq_unique.setup` checks each Redis server once (a PING) and raises
    #: ``RedisUnavailable`` if one is down; False for an app that may start before its Redis.
    check_redis: bool = True
    #: ms each Redis server may take to answer the one-time check of :func:`dramatiq_unique.setup`.
    check_timeout: int = DEFAULT_CHECK_TIMEOUT
    #: With several Redis servers (Redlock masters): ms each master may take to connect or to answer
    #: a lock operation, asked over a client of the suite's own made from the one given (same address,
    #: password, TLS) with this timeout and no retries.  A master down or stalled then costs a lock
    #: operation this long at most, and is skipped for a second after it failed.  Keep it well below
    #: ``unique_ttl`` (a lease is only valid for its TTL less the time taken to take it).
    lock_timeout: int = DEFAULT_LOCK_TIMEOUT
    #: With several job stores (``database=[primary, secondary, ...]``): ms a store that failed is
    #: skipped by the sends that may go to another store, before it is tried again.
    store_down_for: int = _stores.DEFAULT_DOWN_FOR
    #: What a tracked send does when its publish fails because the broker is down: "defer" keeps its
    #: row ``pending`` for the re-drive and returns; "raise" raises as plain Dramatiq does, leaving no row.
    on_broker_down: str = "defer"
    #: With "defer": ms after a failed publish during which tracked sends are kept pending without
    #: trying the broker (each try can cost a connection attempt, or several on RabbitMQ).
    broker_down_backoff: int = 1_000
    #: Rows :func:`dramatiq_unique.send_many` writes in one INSERT and publishes in one round trip.
    send_many_batch: int = 1_000

    def __post_init__(self) -> None:
        for name in ("lost_after", "retention", "idempotency_window", "redrive_interval", "redrive_page_size",
                     "database_connect_timeout", "database_timeout", "check_timeout", "lock_timeout",
                     "store_down_for", "broker_down_backoff", "send_many_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise InvalidOption(f"setting {name} must be a positive number, not {value!r}")
        if not isinstance(self.key_prefix, str) or not self.key_prefix:  # "": rows any app adopts (scope.py)
            raise InvalidOption(f"setting key_prefix must be a non-empty str, not {self.key_prefix!r}: it names this "
                                "app's job rows, and '' names rows written before rows had an app, which apps adopt")
        if self.on_lost not in ("redrive", "fail"):
            raise InvalidOption(f"setting on_lost must be 'redrive' or 'fail', not {self.on_lost!r}")
        if self.on_broker_down not in ("defer", "raise"):
            raise InvalidOption(f"setting on_broker_down must be 'defer' or 'raise', not {self.on_broker_down!r}")


@dataclasses.dataclass(frozen=True)
class ActorConfig:
    """An actor's suite options, resolved once when it is declared."""

    actor_name: str
    fn: Callable[..., Any]
    options: dict
    model: type[JobModel]
    #: The actor's parameters that ``job_model`` has columns for.
    extra_fields: tuple[str, ...]
    #: The app its rows belong to (the suite's ``key_prefix``; see scope.py).
    app: str = ""

    def get(self, message_options: dict, name: str, default: Any = None) -> Any:
        return opt.lookup(message_options, self.options, name, default)


def _redis_clients(spec: RedisSpec) -> list[redis_lib.Redis]:
    items = [spec] if isinstance(spec, (str, redis_lib.Redis)) else list(spec)
    if not items:
        raise InvalidOption("redis must name at least one server")
    clients = []
    for item in items:
        if isinstance(item, str):
            clients.append(client_from_url(item))
        elif isinstance(item, redis_lib.Redis):
            clients.append(item)
        else:
            raise InvalidOption(f"redis must be a URL, a redis.Redis or a list of them, not {item!r}")
    return clients


class Suite:
    """Holds the suite's configuration; :func:`dramatiq_unique.setup` returns one.

    Parameters:
      database: a URL (``sqlite:///jobs.db``, ``postgresql://...``) or a peewee Database, or a
        non-empty list of them: several job stores, the primary first, listed in the same order by
        every process (see :mod:`dramatiq_unique.storage.stores`).  A
        PostgreSQL URL opens a :class:`~dramatiq_unique.storage.database.ReconnectingPostgresqlDatabase`
        bounded by the ``database_connect_timeout`` and ``database_timeout`` settings; a given
        ``PostgresqlDatabase`` is made to reconnect in place and keeps its own timeouts (a missing
        ``connect_timeout`` is added).  See :mod:`dramatiq_unique.storage.database`.
      redis: a URL, a ``redis.Redis``, or a list of them (Redlock masters).
      **settings: see :class:`Settings`.
    """

    #: An outbox block that every transaction of ``db`` is in: a framework's (dramatiq_unique.contrib).
    framework_block: Optional[Any] = None

    def __init__(
        self, *, database: Union[str, pw.Database, Sequence[Union[str, pw.Database]]], redis: RedisSpec,
        **settings: Any,
    ) -> None:
        unknown = set(settings) - {f.name for f in dataclasses.fields(Settings)}
        if unknown:
            raise InvalidOption(f"unknown settings: {', '.join(sorted(unknown))}")
        self.settings = Settings(**settings)
        prepare = self.settings.prepared_statements is not False
        databases = [open_database(spec, connect_timeout=self.settings.database_connect_timeout,
                                   timeout=self.settings.database_timeout, prepared=prepare)
                     for spec in _stores.specs(database)]
        #: The job stores, the primary first (one, unless ``database`` listed several).
        self.stores = _stores.Stores(databases, down_for=self.settings.store_down_for)
        #: The primary store's Database.
        self.db = databases[0]
        self._check_stores()  # fail fast, naming the server
        for db in databases:  # not behind a pooler in transaction mode (storage/database.py)
            queries.enable(db, prepare and not configure_pooler(db, self.settings.prepared_statements))
        self.masters = _redis_clients(redis)
        self.locks = Locks(self.masters, timeout_ms=self.settings.lock_timeout)
        #: The client for plain Redis state (slots, wake-up flags, limits): the first master; of
        #: several Redlock masters, over its bounded client (locks/masters.py), so that the first master
        #: down costs the flags, which the suite can do without, ``lock_timeout`` at most.
        self.redis = self.masters[0] if self.locks.single else self.locks.nodes[0].client
        self.keys = RedisKeys(self.settings.key_prefix)
        #: The app this suite's job rows belong to, in a database several apps share (durable/scope.py).
        self.app = app_name(self.settings.key_prefix)
        self.broker: Optional[dramatiq.Broker] = None
        #: Publishes batches of tracked sends on a Redis broker (broker/publish.py), once the broker is wrapped.
        self.publisher: Optional[Any] = None
        self.models: list[type[JobModel]] = []
        self.actors: dict[str, ActorConfig] = {}
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self._lock = threading.Lock()
        self.register_model(JobModel)
        # Module-level functions (get_job, submit...) use the newest suite.
        set_current(self)

    def __getattr__(self, name: str) -> Any:
        # Settings read as attributes of the suite: suite.lost_after.
        settings = self.__dict__.get("settings")
        if settings is not None and name in Settings.__dataclass_fields__:
            return getattr(settings, name)
        raise AttributeError(name)

    def _check_stores(self) -> None:
        """One store must answer; of several, at least one (the others are named in a warning)."""
        if not self.stores.several:
            check_database(self.db)
            return
        errors = []
        for index, db in enumerate(self.stores.databases):
            try:
                check_database(db)
            except DatabaseUnavailable as e:
                errors.append(str(e))
                logger.warning("Job %s did not answer at set-up (%s); its tables are created when it first "
                               "answers.", self.stores.name(index), e)
                self.stores.mark_down(index, e, quiet=True)
        if len(errors) == len(self.stores):
            raise DatabaseUnavailable(f"no job store answers: {'; '.join(errors)}")

    def register_model(self, model: type[JobModel]) -> None:
        with self._lock:
            if model not in self.models:
                model.bind(self.db, bind_refs=False, bind_backrefs=False)
                for index in range(len(self.stores)):
                    if self.stores.is_down(index):
                        continue  # created when the store first answers (Stores.ensure)
                    if getattr(self.stores.databases[index], "tables_by_migrations", False):
                        self.stores.created(model, index)  # the host framework's migrations make them (contrib/)
                        continue
                    try:
                        self.stores.ensure(model, index)
                    except DB_ERRORS as e:
                        where = describe(self.stores.databases[index])
                        if not self.stores.several:
                            raise DatabaseUnavailable(f"creating {model._meta.table_name} in {where}: {e}") from e
                        logger.warning("Could not create %s in job %s (%s); it is created when the store "
                                       "answers.", model._meta.table_name, self.stores.name(index), e)
                        self.stores.mark_down(index, e, quiet=True)
                self.models.append(model)

    def configure_actor(self, actor: "dramatiq.Actor") -> Optional[ActorConfig]:
        """Validate and resolve an actor's suite options; None if it is not tracked."""
        options = actor.options
        opt.validate(options, actor.fn)
        if not opt.is_tracked(options):
            self.actors.pop(actor.actor_name, None)
            return None
        model = options.get("job_model") or JobModel
        if not (isinstance(model, type) and issubclass(model, JobModel)):
            raise InvalidOption(f"job_model must be a subclass of dramatiq_unique.JobModel, not {model!r}")
        self.register_model(model)
        params = opt._parameters(actor.fn) or {}
        extra = tuple(name for name in model._meta.fields if name not in base_field_names() and name in params)
        config = ActorConfig(actor.actor_name, actor.fn, options, model, extra, self.app)
        self.actors[actor.actor_name] = config
        return config

    def actor_config(self, actor_name: str) -> Optional[ActorConfig]:
        return self.actors.get(actor_name)

    def close(self) -> None:
        """Close this thread's database connections, one per store (peewee's are per thread)."""
        for db in self.stores.databases:
            if not db.is_closed():
                db.close()


_current: Optional[Suite] = None


def set_current(suite: Suite) -> None:
    global _current
    _current = suite


def current() -> Suite:
    """The suite of the last :func:`setup` call."""
    if _current is None:
        raise NotConfigured()
    return _current

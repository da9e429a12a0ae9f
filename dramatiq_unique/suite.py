"""The suite's configuration: :class:`Suite` and per-actor resolved options."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import socket
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import peewee as pw
import redis as redis_lib

from dramatiq_unique import options as opt
from dramatiq_unique.errors import DatabaseUnavailable, InvalidOption, NotConfigured
from dramatiq_unique.locks.redlock import DEFAULT_LOCK_TIMEOUT, Locks
from dramatiq_unique.redis.keys import DEFAULT_KEY_PREFIX, RedisKeys
from dramatiq_unique.redis.servers import client_from_url
from dramatiq_unique.storage import queries
from dramatiq_unique.storage import stores as _stores
from dramatiq_unique.storage.database import DB_ERRORS, configure_pooler, describe, open_database
from dramatiq_unique.storage.database import check as check_database
from dramatiq_unique.storage.models import JobModel
from dramatiq_unique.unique.keys import digest

if TYPE_CHECKING:
    import dramatiq

logger = logging.getLogger(__name__)

#: Longest app name the ``app`` column holds.
MAX_APP_LENGTH = 255


def app_name(key_prefix: str) -> str:
    """The app a suite with ``key_prefix`` writes into its rows (a too-long prefix is shortened, stably)."""
    if len(key_prefix) <= MAX_APP_LENGTH:
        return key_prefix
    return f"{key_prefix[:MAX_APP_LENGTH - 41]}~{digest(key_prefix)}"


RedisSpec = Union[str, redis_lib.Redis, Sequence[Union[str, redis_lib.Redis]]]


@dataclasses.dataclass
class Settings:
    """Suite-wide settings, every time in milliseconds (each is described in docs/reference/settings.md)."""

    lost_after: int = 60_000
    on_lost: str = "redrive"
    retention: int = 7 * 24 * 3600 * 1000  # 7 days
    idempotency_window: int = 24 * 3600 * 1000  # 24 hours
    key_prefix: str = DEFAULT_KEY_PREFIX
    redriver: bool = True
    redrive_interval: int = 5_000
    redrive_page_size: int = 500
    #: None: prepared unless behind a pooler in transaction mode (storage/database.py).
    prepared_statements: Optional[bool] = None
    database_connect_timeout: int = 5_000
    database_timeout: int = 30_000
    check_redis: bool = True
    check_timeout: int = 2_000
    #: Keep it well below ``unique_ttl``: a lease is only valid for its TTL less the time taken to take it.
    lock_timeout: int = DEFAULT_LOCK_TIMEOUT
    store_down_for: int = _stores.DEFAULT_DOWN_FOR
    on_broker_down: str = "defer"
    broker_down_backoff: int = 1_000
    send_many_batch: int = 1_000

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):  # the times and sizes: those with an int default
            value = getattr(self, field.name)
            if type(field.default) is int and (isinstance(value, bool) or not isinstance(value, (int, float))
                                                or value <= 0):
                raise InvalidOption(f"setting {field.name} must be a positive number, not {value!r}")
        if not isinstance(self.key_prefix, str) or not self.key_prefix:  # "": rows any app adopts (scope.py)
            raise InvalidOption(f"setting key_prefix must be a non-empty str, not {self.key_prefix!r}: it names this "
                                "app's job rows, and '' names rows written before rows had an app, which apps adopt")
        for name, allowed in (("on_lost", ("redrive", "fail")), ("on_broker_down", ("defer", "raise"))):
            if (value := getattr(self, name)) not in allowed:
                raise InvalidOption(f"setting {name} must be {' or '.join(map(repr, allowed))}, not {value!r}")


#: The options an :class:`ActorConfig` resolves, a message's own over the actor's.
RESOLVED = opt.UNIQUE_OPTIONS | opt.CONCURRENCY_OPTIONS | {"idempotency_window"}


@dataclasses.dataclass(frozen=True)
class ActorConfig:
    """An actor's suite options, resolved when it is declared; :meth:`for_message` puts a message's over them."""

    actor_name: str
    fn: Callable[..., Any]
    #: The options as declared.
    options: dict
    model: type[JobModel]
    #: The actor's parameters that ``job_model`` has columns for.
    extra_fields: tuple[str, ...]
    #: The app its rows belong to (the suite's ``key_prefix``; see scope.py).
    app: str = ""
    unique_args: opt.ArgsSpec = None
    unique_lock: str = opt.DEFAULT_UNIQUE_LOCK
    unique_on_conflict: str = "skip"
    #: Lease (ms) of a running job's row and execution lock.
    unique_ttl: float = 60_000
    unique_window: Optional[int] = None
    unique_order_by: str = opt.DEFAULT_UNIQUE_ORDER_BY
    concurrency_limit: Optional[int] = None
    concurrency_key: opt.ArgsSpec = None
    #: Lease (ms) of a concurrency slot.
    concurrency_ttl: float = 60_000
    #: The suite's ``idempotency_window`` unless the actor sets its own.
    idempotency_window: float = Settings.idempotency_window

    def __post_init__(self) -> None:
        self._put(self.options)

    def _put(self, options: dict) -> None:
        for name in RESOLVED:
            value = options.get(name)
            if value is not None:
                object.__setattr__(self, name, float(value) if name.endswith("_ttl") else value)

    def for_message(self, message_options: dict) -> "ActorConfig":
        """The options one message runs with: its own (``is None``: the actor's) over the actor's."""
        if message_options.keys().isdisjoint(RESOLVED) or all(message_options.get(n) is None for n in RESOLVED):
            return self
        resolved = copy.copy(self)
        resolved._put(message_options)
        return resolved

    @property
    def unique(self) -> bool:
        return self.unique_args is not None

    @property
    def execution_lock(self) -> bool:
        """Whether a job holds an execution lock while it runs."""
        return self.unique_args is not None and self.unique_lock in opt.EXECUTION_LOCKS

    @property
    def released_at_start(self) -> bool:
        """Whether a job's start releases its queue-level hold."""
        return self.unique_args is not None and self.unique_lock in opt.RELEASED_AT_START

    @property
    def has_slots(self) -> bool:
        """Whether jobs take a concurrency slot: a limit or a key (a key alone: no limit unless one is set)."""
        return self.concurrency_limit is not None or self.concurrency_key is not None


def _redis_clients(spec: RedisSpec) -> list[redis_lib.Redis]:
    items = [spec] if isinstance(spec, (str, redis_lib.Redis)) else list(spec)
    if not items:
        raise InvalidOption("redis must name at least one server")
    for item in items:
        if not isinstance(item, (str, redis_lib.Redis)):
            raise InvalidOption(f"redis must be a URL, a redis.Redis or a list of them, not {item!r}")
    return [client_from_url(item) if isinstance(item, str) else item for item in items]


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
        self.db = databases[0]
        self._check_stores()  # fail fast, naming the server
        for db in databases:  # not behind a pooler in transaction mode (storage/database.py)
            queries.enable(db, prepare and not configure_pooler(db, self.settings.prepared_statements))
        self.masters = _redis_clients(redis)
        self.locks = Locks(self.masters, timeout_ms=self.settings.lock_timeout)
        #: The client for plain Redis state (slots, wake-up flags, limits): the first master; of several,
        #: its bounded client (locks/redlock.py): that master down costs ``lock_timeout`` at most.
        self.redis = self.locks.clients[0]
        self.keys = RedisKeys(self.settings.key_prefix)
        #: The app this suite's job rows belong to, in a database several apps share (durable/scope.py).
        self.app = app_name(self.settings.key_prefix)
        self.broker: Optional[dramatiq.Broker] = None
        #: Publishes batches of tracked sends on a Redis broker (broker/publish.py), once the broker is wrapped.
        self.publisher: Optional[Any] = None
        self.models: list[type[JobModel]] = []
        self.actors: dict[str, ActorConfig] = {}
        self._host = socket.gethostname()
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

    @property
    def worker_id(self) -> str:
        """This process, as job rows and wake-ups name it: read each time, so that a forked child is itself."""
        return f"{self._host}:{os.getpid()}"

    def _check_stores(self) -> None:
        """One store must answer; of several, at least one (the others are named in a warning)."""
        errors = []
        for index, db in enumerate(self.stores.databases):
            try:
                check_database(db)
            except DatabaseUnavailable as e:
                if not self.stores.several:
                    raise
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
        """Resolve an actor's suite options, which ``options.check_actor`` validated; None if it is not tracked."""
        options = actor.options
        if not opt.is_tracked(options):
            self.actors.pop(actor.actor_name, None)
            return None
        model = options.get("job_model") or JobModel
        if not (isinstance(model, type) and issubclass(model, JobModel)):
            raise InvalidOption(f"job_model must be a subclass of dramatiq_unique.JobModel, not {model!r}")
        self.register_model(model)
        params = getattr(opt.signature_of(actor.fn), "parameters", {})
        extra = tuple(name for name in model._meta.fields if name not in JobModel._meta.fields and name in params)
        config = ActorConfig(actor.actor_name, actor.fn, options, model, extra, self.app,
                             idempotency_window=self.settings.idempotency_window)
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

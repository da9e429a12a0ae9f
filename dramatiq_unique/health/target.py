"""What the ``check``, ``status`` and ``migrate`` commands look at: an app's suite, or the shared job table
and the Redis that ``DRAMATIQ_UNIQUE_DATABASE_URL`` and ``DRAMATIQ_UNIQUE_REDIS_URL`` name."""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Optional

import peewee as pw
import redis as redis_lib

from dramatiq_unique.redis.keys import DEFAULT_KEY_PREFIX, RedisKeys
from dramatiq_unique.redis.servers import client_from_url
from dramatiq_unique.slots import overrides
from dramatiq_unique.storage.database import describe, open_database
from dramatiq_unique.storage.models import JobModel, bound_copy, bound_limits
from dramatiq_unique.suite import Settings, app_name

#: The environment variables of the mode without an app.
DATABASE_ENV = "DRAMATIQ_UNIQUE_DATABASE_URL"
REDIS_ENV = "DRAMATIQ_UNIQUE_REDIS_URL"
#: ms each service may take to answer a command (connect and each call).
DEFAULT_TIMEOUT = 3_000


@dataclasses.dataclass
class Target:
    """The services and tables a command looks at."""

    databases: list[pw.Database]
    #: The job models (``model_in`` binds one to a store).
    models: list[type[JobModel]]
    masters: list[redis_lib.Redis]
    keys: RedisKeys
    app: str
    lost_after: float
    redrive_interval: float
    #: The app's suite, when an app was imported (the parked-rows finding needs its gates).
    suite: Optional[Any] = None
    model_in: Callable[[type[JobModel], int], type[JobModel]] = lambda model, index: model
    #: The suite's other tables, in the primary store (the run-time limits'), bound to it.
    others: list[type[pw.Model]] = dataclasses.field(default_factory=list)

    def store_name(self, index: int) -> str:
        return f"store {index} ({describe(self.databases[index])})"

    def close(self) -> None:
        for db in self.databases:
            if not db.is_closed():
                db.close()


def of_suite(suite: Any) -> Target:
    return Target(
        databases=list(suite.stores.databases), models=list(suite.models), masters=list(suite.masters),
        keys=suite.keys, app=suite.app, lost_after=suite.settings.lost_after,
        redrive_interval=suite.settings.redrive_interval, suite=suite, model_in=suite.stores.model_in,
        others=[overrides.model_of(suite)],
    )


def bound(model: type[JobModel], db: pw.Database, index: int) -> type[JobModel]:
    """``model`` bound to ``db`` without rebinding the class itself (other code in the process uses it)."""
    made = bound_copy(model, db, f"{model.__name__}_cli{index}")
    # peewee names indexes after it: the names set-up gives them (storage/stores.py's model_in in another store).
    made._meta.name = model._meta.name if index == 0 else f"{model.__name__}_store{index}".lower()
    return made


def from_environment(
    *, key_prefix: Optional[str] = None, environ: Optional[dict[str, str]] = None, timeout: float = DEFAULT_TIMEOUT,
) -> Optional[Target]:
    """The target named by the environment; None if ``DRAMATIQ_UNIQUE_DATABASE_URL`` is not set."""
    env = os.environ if environ is None else environ
    urls = env.get(DATABASE_ENV, "").split()
    if not urls:
        return None
    databases = [open_database(url, connect_timeout=timeout, timeout=max(timeout, 10_000)) for url in urls]
    model_in = functools.cache(lambda model, index: bound(model, databases[index], index))  # a copy per store, kept
    masters = [client_from_url(url, socket_timeout=timeout / 1000, socket_connect_timeout=timeout / 1000)
               for url in env.get(REDIS_ENV, "").split()]
    prefix = key_prefix or DEFAULT_KEY_PREFIX
    return Target(
        databases=databases, models=[JobModel], masters=masters, keys=RedisKeys(prefix), app=app_name(prefix),
        lost_after=Settings.lost_after, redrive_interval=Settings.redrive_interval, model_in=model_in,
        others=[bound_limits(databases[0])],
    )


def tables(target: Target) -> list[tuple[int, type[JobModel]]]:  # (store index, job model bound to it)
    return [(index, target.model_in(model, index)) for index in range(len(target.databases)) for model in target.models]


def schema_tables(target: Target) -> list[tuple[int, type[pw.Model]]]:
    """What ``status`` and ``migrate`` look at: :func:`tables`, then the suite's other tables (in the primary)."""
    return [*tables(target), *((0, model) for model in target.others)]


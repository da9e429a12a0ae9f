"""What the benchmark scripts share: the services, and a fresh database per run."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from typing import TYPE_CHECKING, Callable, Iterator, Optional

import peewee as pw

if TYPE_CHECKING:
    from dramatiq.brokers.redis import RedisBroker

    import dramatiq_unique

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
PG = dict(database="test", host="127.0.0.1", user="postgres")


@contextlib.contextmanager
def pg_database(pg: Optional[dict] = None) -> Iterator[str]:
    """The URL of a fresh PostgreSQL schema, dropped afterwards, on ``pg`` (connection parameters; PG)."""
    pg = pg or PG
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = pw.PostgresqlDatabase(**pg)
    admin.execute_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield (f"postgresql://{pg['user']}@{pg['host']}:{pg.get('port', 5432)}/{pg['database']}"
               f"?options=-csearch_path%3D{schema}")
    finally:
        admin.execute_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()


def rig(database: str) -> tuple[str, "RedisBroker", "dramatiq_unique.Suite"]:
    """A fresh namespace, a Redis broker under it (made the global broker) and the suite set up on
    ``database`` with that key prefix, the re-drive off: ``(namespace, broker, suite)``."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    import dramatiq_unique

    ns = f"bench-{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=REDIS_URL, namespace=ns)
    dramatiq.set_broker(broker)
    if BORROW:  # the tables first, as manage.py migrate would make them
        from dramatiq.brokers.stub import StubBroker

        dramatiq_unique.setup(StubBroker(), database=database, redis=REDIS_URL, key_prefix=ns, redriver=False).close()
    return ns, broker, dramatiq_unique.setup(broker, database=borrowed(database), redis=REDIS_URL, key_prefix=ns,
                                             redriver=False)


#: ``BENCH_BORROW=django``: the suite's statements on a Django database's connection (contrib/django), the
#: same PostgreSQL schema (``django-psycopg2``: Django on psycopg2, psycopg 3 hidden from it); unset, on the
#: suite's own connections.  Old and new side by side.
BORROW = os.environ.get("BENCH_BORROW", "")


def borrowed(database: str) -> object:
    """``database`` as the suite opens it: the URL itself, or under BENCH_BORROW a Django database on it."""
    if not BORROW.startswith("django") or not database.startswith("postgresql"):
        return database
    if BORROW == "django-psycopg2":
        import sys

        sys.modules["psycopg"] = None  # type: ignore[assignment]  # Django then takes psycopg2
    import django
    from django.conf import settings
    from django.db import connections

    schema = database.split("search_path%3D", 1)[1]
    config = {"ENGINE": "django.db.backends.postgresql", "NAME": PG["database"], "HOST": PG["host"],
              "USER": PG["user"], "CONN_MAX_AGE": None, "OPTIONS": {"options": f"-c search_path={schema}"}}
    if not settings.configured:
        settings.configure(DATABASES={"default": config}, USE_TZ=True)
        django.setup()
    else:  # a new schema for this run
        connections["default"].close()
        connections["default"].settings_dict.update(config)
    from dramatiq_unique.contrib.django.database import DjangoDatabase

    return DjangoDatabase("default")


def on_each_database(bench: Callable[[str, str], None], only: Optional[str] = None) -> None:
    """``bench(label, database_url)`` on a new SQLite file and a new PostgreSQL schema."""
    if only != "postgres":
        bench("SQLite", f"sqlite:///{tempfile.mkdtemp()}/bench.db")
    if only != "sqlite":
        with pg_database() as url:
            bench("PostgreSQL", url)

"""What the benchmark scripts share: the services, and a fresh database per run."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from typing import Callable, Iterator, Optional

import peewee as pw

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
PG = dict(database="test", host="127.0.0.1", user="postgres")


@contextlib.contextmanager
def pg_database() -> Iterator[str]:
    """The URL of a fresh PostgreSQL schema, dropped afterwards."""
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = pw.PostgresqlDatabase(**PG)
    admin.execute_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"postgresql://{PG['user']}@{PG['host']}:5432/{PG['database']}?options=-csearch_path%3D{schema}"
    finally:
        admin.execute_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()


def on_each_database(bench: Callable[[str, str], None], only: Optional[str] = None) -> None:
    """``bench(label, database_url)`` on a new SQLite file and a new PostgreSQL schema."""
    if only != "postgres":
        bench("SQLite", f"sqlite:///{tempfile.mkdtemp()}/bench.db")
    if only != "sqlite":
        with pg_database() as url:
            bench("PostgreSQL", url)

"""The job tables on a Django database's connection, in its transactions: a peewee Database whose
connection, ``atomic()`` and commit hooks are Django's, so that a send inside ``transaction.atomic()``
writes its row in that transaction, and Django drops what a rolled-back savepoint registered."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import peewee as pw
from django.db import connections
from django.db import transaction as django_transaction

from dramatiq_unique.contrib import FrameworkDatabase
from dramatiq_unique.errors import InvalidOption
from dramatiq_unique.storage import queries
from dramatiq_unique.storage.savepoints import Flush


class DjangoDatabase(FrameworkDatabase, pw.PostgresqlDatabase):
    """The job tables in Django database ``alias`` (PostgreSQL), over Django's own connection."""

    #: ``manage.py migrate`` creates and upgrades the tables (this app's migrations), not ``setup()``.
    tables_by_migrations = True

    def __init__(self, alias: str = "default") -> None:
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        if alias not in connections.settings:
            raise InvalidOption(f"no Django database {alias!r} for the job tables (DRAMATIQ_UNIQUE['DATABASE'])")
        settings = connections.settings[alias]
        if connections[alias].vendor != "postgresql":
            raise InvalidOption(f"the job tables need a PostgreSQL database; Django database {alias!r} is "
                                f"{settings['ENGINE']}")
        self.alias = alias
        where = {key.lower(): settings[key] for key in ("USER", "HOST", "PORT") if settings.get(key)}
        super().__init__(settings["NAME"], prefer_psycopg3=is_psycopg3, **where)

    def attach_suite(self, suite: Any) -> None:
        super().attach_suite(suite)
        # The hot statements prepared by name (storage/queries.py), on either driver: Django's psycopg 3
        # cursors bind on the client, as psycopg2 does, and prepare nothing by themselves. Not by default
        # where Django's own setting for a pooler in transaction mode says one is there (the suite cannot
        # probe it: Django connects later), nor once a statement goes missing (queries.execute).
        setting = suite.settings.prepared_statements
        pooled = bool(connections.settings[self.alias].get("DISABLE_SERVER_SIDE_CURSORS"))
        setattr(self, queries._ON, setting or (setting is None and not pooled))

    @property
    def _django(self) -> Any:
        return connections[self.alias]

    def connect(self, reuse_if_open: bool = False) -> bool:
        return True  # Django connects on first use (never at set-up)

    def is_closed(self) -> bool:
        return self._django.connection is None

    def close(self) -> bool:
        django = self._django
        if django.in_atomic_block:
            raise pw.OperationalError("Attempting to close database while transaction is open.")
        was_open = django.connection is not None
        django.close()
        return was_open

    def connection(self) -> Any:
        django = self._django
        django.ensure_connection()
        if self.server_version is None:
            self._set_server_version(django.connection)  # type: ignore[attr-defined]  # peewee's, untyped
        return django.connection

    def cursor(self, named_cursor: Any = None) -> Any:
        return self.connection().cursor()

    def in_transaction(self) -> bool:
        return bool(self._django.in_atomic_block)

    def atomic(self, *args: Any, **kwargs: Any) -> Any:
        return django_transaction.atomic(using=self.alias)

    transaction = savepoint = atomic  # Django's atomic() nests as both

    def after_commit(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        django_transaction.on_commit(fn, using=self.alias)
        return fn

    def hold(self, flush: Flush, item: Any) -> bool:
        """Keep ``item`` for ``flush`` after the commit (storage/savepoints.py's ``hold``): one callback
        per savepoint level, so a rolled-back savepoint drops its items with what Django drops."""
        django = self._django
        last = django.run_on_commit[-1] if django.run_on_commit else None
        if last and isinstance(last[1], partial) and last[1].func is flush and last[0] == set(django.savepoint_ids):
            last[1].args[0].append(item)  # the items held at this savepoint level, handed to flush once
        else:
            django.on_commit(partial(flush, [item]), robust=True)  # an error is logged: the caller committed
        return True

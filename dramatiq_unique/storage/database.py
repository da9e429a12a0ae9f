"""Opening the job database: URLs, the driver, timeouts, reconnects and clear set-up errors.

The driver.  A PostgreSQL URL is opened with psycopg2, whose hot
statements :mod:`dramatiq_unique.storage.queries` prepares once per
connection.  psycopg 3 was measured against it (issue 16 part 3,
docs/discussions/benchmarks.md): the same on single statements, about 30%
slower on ``send_many``'s batches, so the URL keeps psycopg2 (psycopg 3
if psycopg2 is not installed).  A peewee ``PostgresqlDatabase`` given to
``setup()`` keeps its own driver; with psycopg 3 the connection prepares
what it runs often by itself (``prepare_threshold``), and
``prepared_statements=False`` in the suite's settings sets
``prepare_threshold=None`` for a pooler in *transaction* mode.

Reconnects.  Peewee keeps one connection per thread and never replaces
it: after a PostgreSQL restart, a fail-over or an idle-connection killer,
every thread that had a connection would fail for ever.  A PostgreSQL
database is therefore a :class:`ReconnectingPostgresqlDatabase`, peewee's
own ``playhouse.shortcuts.ReconnectMixin`` with the errors that psycopg2
and psycopg 3 raise for a dead connection: a statement that finds its
connection dead *outside a transaction* gets a new connection and runs
once more; while the server is down, the new connection fails at once
and the caller gets :class:`~dramatiq_unique.errors.DatabaseUnavailable`.
Inside a transaction nothing is retried (the work before it is lost with
the connection): the transaction fails, and the thread's next call, outside
it, reconnects.  A peewee ``PostgresqlDatabase`` given to ``setup()`` is
adapted in place (its ``execute_sql`` and ``begin`` get ReconnectMixin's
logic, see :func:`reconnecting`), so the caller's models and transactions
keep sharing it.  SQLite
files have no connection to lose and are opened as before.

Savepoints.  Every Database opened here, from a URL or given, tells the
journal of :mod:`dramatiq_unique.storage.savepoints` of its savepoints and
rollbacks (wrapped in place, as for reconnects), so what the outbox holds
for a commit follows the caller's nested ``atomic()`` blocks.

Timeouts.  A PostgreSQL URL gets ``connect_timeout`` (a server that takes
the connection but never answers its start-up), ``statement_timeout``
(a statement the server does not finish), and TCP keepalives with
``tcp_user_timeout`` (a server or network that died under an open
connection).  A parameter the URL sets itself wins; through a pooler that refuses ``options``, each
statement gets ``SET LOCAL statement_timeout`` instead (:mod:`dramatiq_unique.storage.poolers`).
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional, Union
from urllib.parse import urlparse

import peewee as pw
from playhouse import db_url
from playhouse.shortcuts import ReconnectMixin

from dramatiq_unique.errors import DatabaseUnavailable, DependencyUnavailable, InvalidOption
from dramatiq_unique.redaction import HIDDEN, redact
from dramatiq_unique.storage import savepoints
from dramatiq_unique.storage.poolers import BoundedPostgresqlDatabase, is_psycopg3

#: Default SQLite pragmas: WAL lets readers run beside the one writer, and
#: the busy timeout makes concurrent writers wait instead of failing.
DEFAULT_SQLITE_PRAGMAS = {"journal_mode": "wal", "busy_timeout": 30_000, "synchronous": "normal"}

#: Errors that mean "this connection is dead", as peewee wraps them: (class, fragment of the message).
#: A statement that raised one outside a transaction never reached a live session, so it is run
#: again on a new connection.  A statement timeout ("canceling statement") is not one of them.
RECONNECT_ERRORS = (
    (pw.OperationalError, "server closed the connection"),  # psycopg2: restart, crash, killed backend
    (pw.OperationalError, "terminating connection"),  # ... due to administrator command / idle timeout
    (pw.OperationalError, "could not receive data from server"),
    (pw.OperationalError, "could not send data to server"),
    (pw.OperationalError, "ssl connection has been closed unexpectedly"),
    (pw.OperationalError, "ssl syscall error"),
    (pw.OperationalError, "no connection to the server"),
    (pw.OperationalError, "the connection is closed"),  # psycopg 3
    (pw.OperationalError, "consuming input failed"),  # psycopg 3
    (pw.OperationalError, "the connection is lost"),  # psycopg 3
    (pw.InterfaceError, "connection already closed"),  # psycopg2: a connection found dead before
    (pw.InterfaceError, "the connection is closed"),  # psycopg 3
    # A fail-over: this session still talks to the old primary, now a standby.
    (pw.InternalError, "read-only transaction"),
)

#: What peewee raises for a database that fails (a connect, a lost connection, a deadlock, a timeout):
#: the one tuple the suite catches them by (storage/stores.py tells unreachable from the rest).
DB_ERRORS = (pw.OperationalError, pw.InterfaceError)

#: Schemes of PostgreSQL URLs.
POSTGRES_SCHEMES = ("postgres", "postgresql", "postgresext", "postgresqlext", "psql")


#: Set on a given Database that :func:`reconnecting` adapted.
_ADAPTED = "_dramatiq_unique_reconnects"


class ReconnectingPostgresqlDatabase(ReconnectMixin, BoundedPostgresqlDatabase):
    """A PostgreSQL database whose threads replace a dead connection on their next statement."""

    reconnect_errors = RECONNECT_ERRORS


def is_postgres(db: pw.Database) -> bool:
    """Whether ``db`` is a PostgreSQL database (any driver)."""
    return isinstance(db, pw.PostgresqlDatabase)


def _prepare_setting(db: pw.Database, prepared: bool) -> None:
    # psycopg 3 prepares by itself (see the module docstring); psycopg2 takes no such parameter.
    if not prepared and is_psycopg3(db):
        db.connect_params.setdefault("prepare_threshold", None)


def reconnecting(db: pw.Database) -> pw.Database:
    """Make a given PostgreSQL database reconnect, in place; any other database is returned as is.

    Its class cannot become a ReconnectMixin subclass (peewee's instance layout differs), so
    the instance gets ReconnectMixin's own ``execute_sql`` and ``begin`` logic around its own.
    """
    if not isinstance(db, pw.PostgresqlDatabase) or isinstance(db, ReconnectMixin) or hasattr(db, _ADAPTED):
        return db
    errors: dict[type, list[str]] = {}
    for exc_class, fragment in RECONNECT_ERRORS:
        errors.setdefault(exc_class, []).append(fragment.lower())
    db._reconnect_errors = errors  # type: ignore[attr-defined]  # what ReconnectMixin.__init__ builds
    execute_sql, begin = db.execute_sql, db.begin

    def reconnecting_execute_sql(sql: str, params: Any = None) -> Any:
        return ReconnectMixin._reconnect(db, execute_sql, sql, params)

    def reconnecting_begin(*args: Any, **kwargs: Any) -> Any:
        return ReconnectMixin._reconnect(db, begin, *args, **kwargs)

    db.execute_sql = reconnecting_execute_sql  # type: ignore[method-assign]
    db.begin = reconnecting_begin  # type: ignore[method-assign]
    setattr(db, _ADAPTED, True)
    return db


def open_database(
    database: Union[str, pw.Database], *, connect_timeout: Optional[float] = None, timeout: Optional[float] = None,
    prepared: bool = True,
) -> pw.Database:
    """A peewee Database from a URL (``sqlite:///path``, ``postgresql://...``), or the given one adapted.

    ``connect_timeout`` and ``timeout`` (ms) bound a PostgreSQL URL's
    connecting and each statement (see the module docstring); a given
    Database keeps its own settings, except a ``connect_timeout`` it lacks.
    ``prepared=False``: psycopg 3 prepares no statement (``prepare_threshold=None``), on a
    given Database too unless it sets ``prepare_threshold`` itself (on its next connections).
    """
    return savepoints.track(_open(database, connect_timeout, timeout, prepared))


def _open(
    database: Union[str, pw.Database], connect_timeout: Optional[float], timeout: Optional[float], prepared: bool
) -> pw.Database:
    if isinstance(database, pw.Database):
        if isinstance(database, pw.PostgresqlDatabase):
            _check_driver(database, repr(database))
            if connect_timeout:
                database.connect_params.setdefault("connect_timeout", _seconds(connect_timeout))
            _prepare_setting(database, prepared)
        return reconnecting(database)
    if not isinstance(database, str):
        # Its type only: a dict or a tuple of settings would show its password.
        raise InvalidOption(f"database must be a URL or a peewee Database, not a {type(database).__name__}")
    scheme = urlparse(database).scheme
    if not scheme or "://" not in database:
        if "=" in database:  # libpq's key/value form: "host=db password=... dbname=jobs"
            raise InvalidOption(
                f"database {redact(database)!r} is not a URL: write the key/value string as one, "
                "postgresql://user@host:5432/name?sslmode=require with the password after the user and a "
                "colon (percent-encoded), or give a peewee PostgresqlDatabase"
            )
        raise InvalidOption(
            f"database {database!r} is not a URL: write sqlite:///{database} for a SQLite file "
            "(four slashes for an absolute path), or postgresql://user@host:5432/name"
        )
    if scheme.startswith("sqlite"):
        return _sqlite(database)
    if scheme in POSTGRES_SCHEMES:
        db = _postgres(database, connect_timeout, timeout)
        _prepare_setting(db, prepared)
        return db
    try:
        db = db_url.connect(database)
    except (RuntimeError, ValueError) as e:
        raise InvalidOption(f"database {address(database)}: {e}") from e
    if not isinstance(db, (pw.SqliteDatabase, pw.PostgresqlDatabase)):  # peewee names MySQL and others too
        raise InvalidOption(f"database {address(database)}: the job tables run on SQLite (sqlite:///path) or "
                            f"PostgreSQL (postgresql://user@host:5432/name), not on {type(db).__name__}")
    return db


def _sqlite(url: str) -> pw.Database:
    parsed = db_url.parse(url)
    path = parsed["database"]
    if path != ":memory:" and not path.startswith("file:"):
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise InvalidOption(f"database {address(url)!r}: the folder {folder} does not exist; create it first")
    # IMMEDIATE transactions take the write lock at BEGIN, so two
    # writers queue on the busy timeout instead of one failing.
    return pw.SqliteDatabase(path, pragmas=DEFAULT_SQLITE_PRAGMAS, lock_type="IMMEDIATE", timeout=30)


def _postgres(url: str, connect_timeout: Optional[float], timeout: Optional[float]) -> pw.Database:
    params: dict[str, Any] = db_url.parse(url)
    name = params.pop("database", None)
    if not name:
        raise InvalidOption(f"database {address(url)} names no database: postgresql://user@host:5432/name")
    if connect_timeout:
        params.setdefault("connect_timeout", _seconds(connect_timeout))
    own_option = None
    if timeout:
        options = str(params.get("options") or "")
        if "statement_timeout" not in options:
            own_option = f"-c statement_timeout={int(timeout)}"
            params["options"] = f"{options} {own_option}".strip()
        if _libpq_version() >= 120000:  # older libpq refuses the parameter
            params.setdefault("tcp_user_timeout", int(timeout))
        params.setdefault("keepalives", 1)
        params.setdefault("keepalives_idle", max(1, math.ceil(timeout / 3000)))
        params.setdefault("keepalives_interval", max(1, math.ceil(timeout / 6000)))
        params.setdefault("keepalives_count", 3)
    db = ReconnectingPostgresqlDatabase(name, **params)
    db.suite_option = own_option
    _check_driver(db, address(url))
    return db


def _libpq_version() -> int:
    try:
        import psycopg2

        return int(psycopg2.__libpq_version__)
    except Exception:  # psycopg 3, or no driver (reported by _check_driver)
        try:
            import psycopg

            return int(psycopg.pq.version())
        except Exception:
            return 0


def _check_driver(db: pw.PostgresqlDatabase, where: str) -> None:
    try:
        db._adapter.check_driver()  # type: ignore[attr-defined]  # peewee's own check, not in its type hints
    except pw.ImproperlyConfigured as e:
        raise DependencyUnavailable(
            f"no PostgreSQL driver for {where} ({e}): install dramatiq_unique[postgres] (psycopg2)"
        ) from e


def _seconds(ms: float) -> int:
    # libpq takes whole seconds (and waits at least 2).
    return max(1, math.ceil(ms / 1000))


def address(url: str) -> str:
    """A database URL without its password or query (for messages).  Read after :func:`redact`, so
    that a password holding an unencoded ``/`` or ``@`` (which ``urlparse`` splits wrongly) and a
    port that is no number show nothing of it either."""
    url = redact(url).split("?", 1)[0].split("#", 1)[0]
    parsed = urlparse(url)
    if not parsed.netloc:
        return url
    try:
        port = f":{parsed.port}" if parsed.port else ""
    except ValueError:  # a port that is no number: shown as written
        port = ":" + parsed.netloc.rsplit(":", 1)[-1]
    user = f"{parsed.username}@" if parsed.username else ""
    return f"{parsed.scheme}://{user}{parsed.hostname or ''}{port}{parsed.path}"


def describe(db: pw.Database) -> str:
    """Where a peewee Database points (for messages; never its password, even when its database
    name is a libpq string or a URL that holds one, as psycopg accepts)."""
    name = redact(str(db.database))
    if isinstance(db, pw.PostgresqlDatabase):
        params = db.connect_params
        user = f"{params['user']}@" if params.get("user") else ""
        host = params.get("host") or "localhost"
        port = f":{params['port']}" if params.get("port") else ""
        return f"PostgreSQL at postgresql://{user}{host}{port}/{name}"
    if isinstance(db, pw.SqliteDatabase):
        return f"SQLite at {name}"
    return f"{type(db).__name__} {name}"


def check(db: pw.Database) -> None:
    """Connect once (the caller then creates the tables): DatabaseUnavailable, naming the server, if that fails."""
    try:
        db.connect(reuse_if_open=True)
    except DB_ERRORS as e:
        raise DatabaseUnavailable(f"{describe(db)}: {_scrub(str(e).strip(), db)}") from e


def _scrub(text: str, db: pw.Database) -> str:
    """A driver's error without the database's password: libpq may quote a token of the connection
    string it could not parse (``invalid percent-encoded token: "..."``), which no pattern finds."""
    password = (getattr(db, "connect_params", None) or {}).get("password")
    if isinstance(password, str) and password:
        text = text.replace(password, HIDDEN)
    return redact(text)

"""Opening the job database: URLs, the driver (psycopg2, else psycopg 3), timeouts, reconnects, poolers
and clear set-up errors (docs/discussions/how-it-is-built.md, "Storage")."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import selectors
import sys
import threading
import time
import weakref
from typing import Any, Generator, Optional, Union
from urllib.parse import urlparse

import peewee as pw
from playhouse import db_url
from playhouse.shortcuts import ReconnectMixin

from dramatiq_unique.errors import DatabaseUnavailable, DependencyUnavailable, InvalidOption
from dramatiq_unique.redaction import HIDDEN, redact
from dramatiq_unique.storage import savepoints

logger = logging.getLogger(__name__)

#: WAL lets readers run beside the one writer; the busy timeout makes concurrent writers wait.
DEFAULT_SQLITE_PRAGMAS = {"journal_mode": "wal", "busy_timeout": 30_000, "synchronous": "normal"}

#: Errors that mean "this connection is dead" (class, fragment of psycopg2's or psycopg 3's message): a statement
#: that raised one outside a transaction is run again on a new connection.  A statement timeout is not one.
RECONNECT_ERRORS = (
    *((pw.OperationalError, fragment) for fragment in (
        "server closed the connection", "terminating connection", "could not receive data from server",
        "could not send data to server", "ssl connection has been closed unexpectedly", "ssl syscall error",
        "no connection to the server", "the connection is closed", "consuming input failed", "the connection is lost",
    )),
    (pw.InterfaceError, "connection already closed"),  # psycopg2: a connection found dead before
    (pw.InterfaceError, "the connection is closed"),
    (pw.InternalError, "read-only transaction"),  # a fail-over: this session still talks to the old primary
)

#: What peewee raises for a database that fails (a connect, a lost connection, a deadlock, a timeout):
#: the one tuple the suite catches them by (storage/stores.py tells unreachable from the rest).
DB_ERRORS = (pw.OperationalError, pw.InterfaceError)

#: Schemes of PostgreSQL URLs.
POSTGRES_SCHEMES = ("postgres", "postgresql", "postgresext", "postgresqlext", "psql")


def is_psycopg3(db: pw.Database) -> bool:
    return isinstance(getattr(db, "_adapter", None), pw.Psycopg3Adapter)


class BoundedPostgresqlDatabase(pw.PostgresqlDatabase):
    """A PostgreSQL database whose statements the suite bounds (``statement_timeout``) even through
    a pooler that refuses the start-up option it is set by: then by ``SET LOCAL``."""

    #: The ``options`` start-up parameter that the suite added (``-c statement_timeout=...``), and the ms
    #: each statement is bounded by with ``SET LOCAL`` once a pooler refused it.
    suite_option: Optional[str] = None
    local_timeout: Optional[int] = None

    def _connect(self) -> Any:
        try:
            return super()._connect()  # type: ignore[misc]  # peewee's, not in its type hints
        except Exception as e:
            if self.suite_option is None or not refused_options(e):
                raise
            options = str(self.connect_params.get("options") or "").replace(self.suite_option, "").strip()
            if options:
                raise InvalidOption(
                    f"{describe(self)} refused the start-up parameter options ({_scrub(str(e).strip(), self)}), "
                    f"which sets {options!r} from the URL: a pooler such as PgBouncer passes none on; set it on "
                    "the database role instead (ALTER ROLE ... SET ...)") from e
            self.connect_params.pop("options", None)
            self.local_timeout = int(self.suite_option.rsplit("=", 1)[1])
            logger.info("%s refused the start-up parameter options (a pooler such as PgBouncer): each statement "
                        "is bounded by SET LOCAL statement_timeout = %d instead.", describe(self), self.local_timeout)
            return super()._connect()  # type: ignore[misc]

    def execute_sql(self, sql: str, params: Any = None) -> Any:
        if self.local_timeout is not None and not self.in_transaction() and not is_psycopg3(self):
            # One string, run as one implicit transaction: the SET LOCAL holds on whichever server connection.
            sql = f"SET LOCAL statement_timeout = {self.local_timeout}; {sql}"
        return super().execute_sql(sql, params)

    def begin(self, isolation_level: Any = None) -> None:
        if self.local_timeout is None:
            return super().begin(isolation_level)
        if isolation_level is None:
            isolation_level = self._isolation_level  # type: ignore[attr-defined]  # peewee's, as its begin() reads it
        stmt = "BEGIN"
        if isolation_level:
            level = self._adapter.isolation_level_str(isolation_level)  # type: ignore[attr-defined]
            stmt = f"BEGIN TRANSACTION ISOLATION LEVEL {level}"
        with pw.__exception_wrapper__:  # type: ignore[attr-defined]  # what peewee's own begin() runs under
            self.cursor().execute(f"{stmt}; SET LOCAL statement_timeout = {self.local_timeout}")
        return None


def refused_options(error: BaseException) -> bool:
    """Whether ``error`` is a server's (a pooler's) refusal of the ``options`` start-up parameter."""
    text = str(error)
    return "unsupported startup parameter" in text and "options" in text


def set_prepare_threshold(db: pw.Database, *, given: bool = False) -> None:
    """psycopg 3 prepares nothing on ``db``'s next connections, nor on this thread's open one (psycopg2
    prepares nothing by itself); ``given``: unless its parameters say otherwise."""
    if is_psycopg3(db) and not (given and "prepare_threshold" in db.connect_params):
        db.connect_params["prepare_threshold"] = None
        if not db.is_closed():
            db.connection().prepare_threshold = None


def _server_pid(conn: Any) -> int:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return int(cur.fetchone()[0])


def transaction_pooled(db: pw.PostgresqlDatabase, tries: int = 3, wait_ms: float = 1_000) -> bool:
    """Whether ``db`` reaches PostgreSQL through a pooler that lends a server connection per transaction:
    its statements run on several server processes in turn (``server_round_robin``), or a second client
    connection's statement runs on the server process the first's just ran on (``tries`` turns, waiting
    ``wait_ms`` at most: a full pool in session mode keeps the second waiting)."""
    conn = db.connection()
    pids = {_server_pid(conn) for _ in range(tries)}
    if conn.info.backend_pid in pids:  # the id the server (or a pooler) gave it at start-up
        return False
    if len(pids) > 1:
        return True
    elsewhere = (_pids_psycopg3 if is_psycopg3(db) else _pids_psycopg2)(db, time.monotonic() + wait_ms / 1000)
    try:
        for _ in range(tries):
            first = _server_pid(conn)
            pid = next(elsewhere)
            if pid is None:
                return False
            if pid == first:
                return True
    finally:
        elsewhere.close()
    return False


#: What ``_pids_*`` yield: a second client connection's server process id per statement (None: too late).
Pids = Generator[Optional[int], None, None]


def _pids_psycopg2(db: pw.PostgresqlDatabase, deadline: float) -> Pids:
    import psycopg2
    from psycopg2 import extensions as ext

    other = psycopg2.connect(dbname=db.database, **db.connect_params, async_=True)

    def answered() -> bool:
        while (state := other.poll()) != ext.POLL_OK:
            if not _ready(other.fileno(), state == ext.POLL_WRITE, deadline):
                return False
        return True

    try:
        if not answered():
            yield None
            return
        while True:
            cur = other.cursor()
            cur.execute("SELECT pg_backend_pid()")
            yield int(cur.fetchone()[0]) if answered() else None
    finally:
        other.close()


def _pids_psycopg3(db: pw.PostgresqlDatabase, deadline: float) -> Pids:
    from psycopg import conninfo, pq  # libpq's own non-blocking calls: a wait is bounded by deadline

    keywords = {d.keyword.decode() for d in pq.Conninfo.get_defaults()}
    params = {k: v for k, v in db.connect_params.items() if k in keywords}  # not prepare_threshold...
    other = pq.PGconn.connect_start(conninfo.make_conninfo(dbname=db.database, **params).encode())
    try:
        while (state := other.connect_poll()) != pq.PollingStatus.OK:
            if state == pq.PollingStatus.FAILED or not _ready(other.socket, state == pq.PollingStatus.WRITING,
                                                              deadline):
                yield None
                return
        other.nonblocking = 1
        while True:
            other.send_query(b"SELECT pg_backend_pid()")
            while (unsent := other.flush()) or other.is_busy():
                if not _ready(other.socket, bool(unsent), deadline):
                    yield None
                    return
                other.consume_input()
            result = other.get_result()
            while other.get_result() is not None:
                pass
            value = result.get_value(0, 0) if result is not None else None
            yield int(value) if value is not None else None
    finally:
        other.finish()


def _ready(fd: int, write: bool, deadline: float) -> bool:
    """Whether ``fd`` is ready to write (``write``) or read before ``deadline``."""
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_WRITE if write else selectors.EVENT_READ)
        return bool(selector.select(left))


def configure_pooler(db: pw.Database, setting: Optional[bool]) -> bool:
    """Adapt ``db``'s prepared statements to a pooler in transaction mode as ``prepared_statements`` says
    (None: off there; True: refused there; False: not looked at); whether ``db`` is behind one."""
    if setting is False or not isinstance(db, pw.PostgresqlDatabase) or db.is_closed():
        return False  # a store down at set-up: its statements are prepared (a pooler's errors are survived)
    try:
        pooled = transaction_pooled(db)
    except Exception as e:  # noqa: BLE001 - a probe's failure (the driver's errors): statements stay prepared
        logger.warning("Could not tell whether %s is behind a pooler in transaction mode: %s", describe(db), e)
        return False
    if not pooled:
        return False
    if setting:
        raise InvalidOption(
            f"{describe(db)} is behind a pooler in transaction mode (PgBouncer's pool_mode = transaction), "
            "which runs each transaction on another server connection: a prepared statement would be missing "
            "there; set prepared_statements=False (or None, the default), or use session mode")
    logger.info("%s is behind a pooler in transaction mode: the suite's statements are not prepared.", describe(db))
    set_prepare_threshold(db)
    setattr(db, _POOLED, True)
    return True


#: Set on a database that set-up found behind a pooler in transaction mode.
_POOLED = "_dramatiq_unique_transaction_pooled"
#: Dramatiq's default worker threads: a gevent worker with no more greenlets holds no more connections.
_DEFAULT_THREADS = 8


def greenlet_connections(db: pw.Database, greenlets: int) -> Optional[str]:
    """Why a gevent worker of ``greenlets`` greenlets may run out of ``db``'s connections (peewee keeps a
    connection per thread, which gevent makes one per greenlet); None where it cannot: threads, not PostgreSQL,
    a pooler in transaction mode found at set-up, or no more greenlets than Dramatiq's default threads."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("threading") or not is_postgres(db) \
            or getattr(db, _POOLED, False) or greenlets <= _DEFAULT_THREADS:
        return None
    return (f"This worker's {greenlets} gevent greenlets each open a connection of their own to {describe(db)} "
            "(peewee keeps one per thread, and gevent makes that one per greenlet): every worker process's "
            "greenlets count against PostgreSQL's max_connections. Put PgBouncer in transaction mode in front (the "
            "docs' Deploying, \"Workers on gevent\"); set-up found none.")


class ReconnectingPostgresqlDatabase(ReconnectMixin, BoundedPostgresqlDatabase):
    """A PostgreSQL database whose threads replace a dead connection on their next statement."""

    reconnect_errors = RECONNECT_ERRORS


def is_postgres(db: pw.Database) -> bool:
    return isinstance(db, pw.PostgresqlDatabase)


def reconnecting(db: pw.Database) -> pw.Database:
    """Make a given PostgreSQL database reconnect, in place (its class cannot become a subclass)."""
    if not isinstance(db, pw.PostgresqlDatabase) or hasattr(db, "_reconnect_errors"):  # ReconnectMixin's
        return db
    errors: dict[type, list[str]] = {}
    for exc_class, fragment in RECONNECT_ERRORS:
        errors.setdefault(exc_class, []).append(fragment.lower())
    db._reconnect_errors = errors  # type: ignore[attr-defined]  # what ReconnectMixin.__init__ builds
    db.execute_sql = functools.partial(ReconnectMixin._reconnect, db, db.execute_sql)  # type: ignore[method-assign]
    db.begin = functools.partial(ReconnectMixin._reconnect, db, db.begin)  # type: ignore[method-assign]
    return db


#: Every database opened here, so that a forked child can forget the connections it inherited.
_OPENED: "weakref.WeakSet[pw.Database]" = weakref.WeakSet()


def _forget_inherited_connections() -> None:
    """In a forked child (a web server that imports the app, then forks its workers: gunicorn's ``--preload``,
    uWSGI without ``lazy-apps``): drop the connection of the thread that forked, without closing it, so that
    the child opens its own.  Parent and child on one connection would read each other's results; a close
    here would end the parent's session, while a connection merely dropped is left alone by psycopg2 and
    psycopg 3 (each closes only in the process that opened it).  Other threads' connections are not
    inherited: their threads are gone in the child."""
    from playhouse.pool import PooledDatabase

    for db in list(_OPENED):
        db._state.reset()  # type: ignore[attr-defined]  # peewee has no public "forget without closing"
        if isinstance(db, PooledDatabase):
            # Its idle and lent connections are the parent's too, and a parent thread may have held its lock.
            db._connections, db._in_use = [], {}
            db._pool_lock = threading.RLock()
            db._pool_available = threading.Condition(db._pool_lock)


os.register_at_fork(after_in_child=_forget_inherited_connections)


def open_database(
    database: Union[str, pw.Database], *, connect_timeout: Optional[float] = None, timeout: Optional[float] = None,
    prepared: bool = True,
) -> pw.Database:
    """A peewee Database from a URL (``sqlite:///path``, ``postgresql://...``), or the given one adapted.
    ``connect_timeout`` and ``timeout`` (ms) bound a URL's connecting and each statement (a given Database
    gets only a missing ``connect_timeout``); ``prepared=False``: psycopg 3 prepares nothing."""
    if isinstance(database, pw.Database):
        db = reconnecting(database)
        if isinstance(db, pw.PostgresqlDatabase):
            _check_driver(db, repr(db))
            if connect_timeout:
                db.connect_params.setdefault("connect_timeout", _seconds(connect_timeout))
    else:
        db = _from_url(database, connect_timeout, timeout)
    if not prepared:
        set_prepare_threshold(db, given=True)
    _OPENED.add(db)
    return savepoints.track(db)


def _from_url(url: str, connect_timeout: Optional[float], timeout: Optional[float]) -> pw.Database:
    if not isinstance(url, str):
        # Its type only: a dict or a tuple of settings would show its password.
        raise InvalidOption(f"database must be a URL or a peewee Database, not a {type(url).__name__}")
    scheme = urlparse(url).scheme
    if not scheme or "://" not in url:
        if "=" in url:  # libpq's key/value form: "host=db password=... dbname=jobs"
            raise InvalidOption(
                f"database {redact(url)!r} is not a URL: write the key/value string as one, "
                "postgresql://user@host:5432/name?sslmode=require with the password after the user and a "
                "colon (percent-encoded), or give a peewee PostgresqlDatabase"
            )
        raise InvalidOption(
            f"database {url!r} is not a URL: write sqlite:///{url} for a SQLite file "
            "(four slashes for an absolute path), or postgresql://user@host:5432/name"
        )
    if scheme in POSTGRES_SCHEMES:
        return postgres(url, connect_timeout, timeout)
    if scheme.startswith("sqlite"):
        path = db_url.parse(url)["database"]
        folder = os.path.dirname(os.path.abspath(path))
        if path != ":memory:" and not path.startswith("file:") and not os.path.isdir(folder):
            raise InvalidOption(f"database {address(url)!r}: the folder {folder} does not exist; create it first")
        # IMMEDIATE transactions take the write lock at BEGIN: two writers queue on the busy timeout.
        return pw.SqliteDatabase(path, pragmas=DEFAULT_SQLITE_PRAGMAS, lock_type="IMMEDIATE", timeout=30)
    try:
        db = db_url.connect(url)
    except (RuntimeError, ValueError) as e:
        raise InvalidOption(f"database {address(url)}: {e}") from e
    if not isinstance(db, (pw.SqliteDatabase, pw.PostgresqlDatabase)):  # peewee names MySQL and others too
        raise InvalidOption(f"database {address(url)}: the job tables run on SQLite (sqlite:///path) or "
                            f"PostgreSQL (postgresql://user@host:5432/name), not on {type(db).__name__}")
    return db


def postgres(
    url: str, connect_timeout: Optional[float], timeout: Optional[float],
    cls: type[ReconnectingPostgresqlDatabase] = ReconnectingPostgresqlDatabase, **extra: Any,
) -> ReconnectingPostgresqlDatabase:
    """A PostgreSQL Database of class ``cls`` (``extra``: more of its keywords) from a URL, bounded as
    :func:`open_database` says."""
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
    db = cls(name, **extra, **params)
    db.suite_option = own_option
    _check_driver(db, address(url))
    return db


def _libpq_version() -> int:
    with contextlib.suppress(Exception):  # psycopg 3, or no driver (reported by _check_driver)
        import psycopg2

        return int(psycopg2.__libpq_version__)
    with contextlib.suppress(Exception):
        import psycopg

        return int(psycopg.pq.version())
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
    """A database URL without its password or query (for messages), read after :func:`redact`: a password
    holding an unencoded ``/`` or ``@`` (which ``urlparse`` splits wrongly) shows nothing either."""
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
    """Connect once and, on PostgreSQL, run a transaction (the caller then creates the tables):
    DatabaseUnavailable, naming the server, if that fails."""
    hint = ""
    try:
        db.connect(reuse_if_open=True)
        if is_postgres(db):
            db.execute_sql("SELECT 1")
            # That ran outside a transaction: a connection that closes now, at BEGIN, is a pooler's refusal.
            hint = (" (at BEGIN: a pooler in statement mode, such as PgBouncer's pool_mode = statement, closes "
                    "the connection there; the suite's writes need transactions: use transaction or session mode)")
            with db.atomic():  # its one statement reads the server's clock
                skew = clock_skew(db)
            if skew is not None:
                logger.warning("%s: %s", describe(db), skew)
    except DB_ERRORS as e:
        text = _scrub(str(e).strip(), db)
        # psycopg2 reports the closed connection; psycopg 3 reports PgBouncer's own words.
        refused = "statement pooling" in text or any(
            isinstance(e, cls) and fragment in text.lower() for cls, fragment in RECONNECT_ERRORS)
        raise DatabaseUnavailable(f"{describe(db)}: {text}{hint if refused else ''}") from e


#: How far this host's clock may be from the database's before it is reported: half of the second by which a
#: running row's lease is given the benefit of the doubt (``jobs.LEASE_SKEW_MS``), so that any two hosts within it
#: of the database are within that second of each other.
CLOCK_SKEW_MS = 500


def clock_skew(db: pw.Database) -> Optional[str]:
    """A warning if this host's clock is more than :data:`CLOCK_SKEW_MS` from the database's beyond what the
    round trip leaves uncertain; None if not, or on SQLite (whose clock is this host's)."""
    if not is_postgres(db):
        return None
    before = time.time()
    (then,) = db.execute_sql("SELECT EXTRACT(EPOCH FROM statement_timestamp())").fetchone()
    after = time.time()
    # statement_timestamp() was read between the two: at worst at either end of the round trip.
    skew_ms = float(then) * 1000 - (before + after) * 500
    if abs(skew_ms) - (after - before) * 500 <= CLOCK_SKEW_MS:
        return None
    return (f"this host's clock is {abs(skew_ms) / 1000:.1f} s {'behind' if skew_ms > 0 else 'ahead of'} the "
            f"database's: job leases are written with one host's clock and judged by another's and "
            f"the database's, with {2 * CLOCK_SKEW_MS / 1000:g} s of margin: beyond it, a duplicate delivery may "
            f"start beside a running attempt. Keep every host on NTP (chrony or systemd-timesyncd).")


def _scrub(text: str, db: pw.Database) -> str:
    """A driver's error without the database's password: libpq may quote a token of the connection
    string it could not parse (``invalid percent-encoded token: "..."``), which no pattern finds."""
    password = (getattr(db, "connect_params", None) or {}).get("password")
    if isinstance(password, str) and password:
        text = text.replace(password, HIDDEN)
    return redact(text)

"""Connection poolers in front of PostgreSQL (PgBouncer): what the suite adapts to them.

Statement timeout.  A URL's connections get ``statement_timeout`` with
libpq's ``options`` start-up parameter, which PgBouncer refuses unless it
is told to ignore it (``unsupported startup parameter: options``).
:class:`BoundedPostgresqlDatabase` then connects without it and sends
``SET LOCAL statement_timeout`` in the same string as each statement
outside a transaction (the server runs a string of several statements as
one transaction, so it holds for the statement on whichever server
connection the pooler lends), and after ``BEGIN`` in a transaction: one
round trip either way.  A session-level ``SET`` would not do in
transaction mode: it sticks to one server connection, which other clients
get next.  A role-level ``ALTER ROLE ... SET statement_timeout`` bounds
every server connection too, at no cost per statement
(docs/operations/deploying.md).

Prepared statements.  In transaction mode each transaction may run on
another server connection, where a statement prepared on the first is
missing or another has its name: :func:`configure` finds such a pooler at
set-up (:func:`transaction_pooled`) and prepares nothing there, or refuses
``prepared_statements=True``.
"""

from __future__ import annotations

import logging
import selectors
import time
from typing import Any, Optional

import peewee as pw

from dramatiq_unique.errors import InvalidOption
from dramatiq_unique.redaction import HIDDEN, redact

logger = logging.getLogger(__name__)


def is_psycopg3(db: pw.Database) -> bool:
    """Whether ``db`` connects with psycopg 3."""
    return isinstance(getattr(db, "_adapter", None), pw.Psycopg3Adapter)


class BoundedPostgresqlDatabase(pw.PostgresqlDatabase):
    """A PostgreSQL database whose statements the suite bounds (``statement_timeout``) even through
    a pooler that refuses the start-up option it is set by (see the module's docs, "Poolers")."""

    #: The ``options`` start-up parameter that the suite added: ``-c statement_timeout=...``.
    suite_option: Optional[str] = None
    #: ms each statement is bounded by with ``SET LOCAL``, once the server refused the start-up option.
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
                    f"{_where(self)} refused the start-up parameter options ({_scrub(e, self)}), "
                    f"which sets {options!r} from the URL: a pooler such as PgBouncer passes none on; set it on "
                    "the database role instead (ALTER ROLE ... SET ...)") from e
            self.connect_params.pop("options", None)
            self.local_timeout = int(self.suite_option.rsplit("=", 1)[1])
            logger.info("%s refused the start-up parameter options (a pooler such as PgBouncer): each statement "
                        "is bounded by SET LOCAL statement_timeout = %d instead.", _where(self), self.local_timeout)
            return super()._connect()  # type: ignore[misc]

    def execute_sql(self, sql: str, params: Any = None) -> Any:
        if self.local_timeout is not None and not self.in_transaction() and not is_psycopg3(self):
            # One string, one round trip: the server runs it as one implicit transaction, so the SET LOCAL
            # holds for the statement after it, on whichever server connection the pooler lends.
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


def set_prepare_threshold(db: pw.Database) -> None:
    """psycopg 3 prepares nothing on ``db``'s next connections, nor on this thread's open one."""
    if is_psycopg3(db):
        db.connect_params["prepare_threshold"] = None
        if not db.is_closed():
            db.connection().prepare_threshold = None


def _client_pid(conn: Any) -> Optional[int]:
    """The backend process id the server (or a pooler) gave this connection at start-up."""
    info = getattr(conn, "info", None)
    pid = getattr(info, "backend_pid", None) if info is not None else None
    if pid is None and hasattr(conn, "get_backend_pid"):
        pid = conn.get_backend_pid()
    return int(pid) if pid is not None else None


def _server_pid(conn: Any) -> int:
    cur = conn.cursor()
    try:
        cur.execute("SELECT pg_backend_pid()")
        return int(cur.fetchone()[0])
    finally:
        cur.close()


def transaction_pooled(db: pw.Database, tries: int = 3, wait_ms: float = 1_000) -> bool:
    """Whether ``db`` reaches PostgreSQL through a pooler that lends a server connection per
    transaction (PgBouncer's ``pool_mode = transaction`` or ``statement``), over psycopg2.

    A pooler answers the start-up with a backend id of its own, not the server process's; that
    tells a pooler.  Its mode: a second client connection, opened beside this thread's, runs a
    statement right after this one's; it runs on the same server process only if the first's was
    handed back after its statement (in session mode it stays the first's until it closes).  A
    busy pool may hand the second another idle server connection, so the turn is tried ``tries``
    times; one match is proof.  The second connection waits ``wait_ms`` at most for its answers: a
    pool in session mode with every server connection taken keeps it waiting (that is no
    transaction pooling), and set-up must not wait for the pooler's ``query_wait_timeout``.
    """
    if not isinstance(db, pw.PostgresqlDatabase) or is_psycopg3(db):
        return False
    conn = db.connection()
    if _client_pid(conn) in (None, _server_pid(conn)):
        return False
    import psycopg2

    deadline = time.monotonic() + wait_ms / 1000
    other = psycopg2.connect(dbname=db.database, **db.connect_params, async_=True)
    try:
        if not _answered(other, deadline):
            return False
        for _ in range(tries):
            first = _server_pid(conn)
            cur = other.cursor()
            cur.execute("SELECT pg_backend_pid()")
            if not _answered(other, deadline):
                return False
            if int(cur.fetchone()[0]) == first:
                return True
    finally:
        other.close()
    return False


def _answered(conn: Any, deadline: float) -> bool:
    """Drive an asynchronous psycopg2 connection until its work is done; False at ``deadline``."""
    from psycopg2 import extensions as ext

    while True:
        state = conn.poll()
        if state == ext.POLL_OK:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        with selectors.DefaultSelector() as selector:
            selector.register(conn.fileno(), selectors.EVENT_WRITE if state == ext.POLL_WRITE else selectors.EVENT_READ)
            selector.select(left)


def _where(db: pw.Database) -> str:
    """The server a Database connects to, for messages (no password)."""
    params = db.connect_params
    port = f":{params['port']}" if params.get("port") else ""
    return f"PostgreSQL at {params.get('host') or 'localhost'}{port}/{redact(str(db.database))}"


def _scrub(error: BaseException, db: pw.Database) -> str:
    text = redact(str(error).strip())
    password = db.connect_params.get("password")
    return text.replace(password, HIDDEN) if isinstance(password, str) and password else text


def configure(db: pw.Database, setting: Optional[bool]) -> bool:
    """Adapt ``db``'s prepared statements to a pooler in transaction mode, as the ``prepared_statements``
    setting says (None: off there; True: refused there; False: not looked at).  Returns whether
    ``db`` was found behind one."""
    if setting is False or not isinstance(db, pw.PostgresqlDatabase) or db.is_closed():
        return False  # a store down at set-up: its statements are prepared (a pooler's errors are survived)
    try:
        pooled = transaction_pooled(db)
    except Exception as e:  # noqa: BLE001 - a probe's failure (the driver's errors): statements stay prepared
        logger.warning("Could not tell whether %s is behind a pooler in transaction mode: %s", _where(db), e)
        return False
    if not pooled:
        return False
    if setting:
        raise InvalidOption(
            f"{_where(db)} is behind a pooler in transaction mode (PgBouncer's pool_mode = transaction), "
            "which runs each transaction on another server connection: a prepared statement would be missing "
            "there; set prepared_statements=False (or None, the default), or use session mode")
    logger.info("%s is behind a pooler in transaction mode: the suite's statements are not prepared.", _where(db))
    set_prepare_threshold(db)
    return True

"""Several durable stores, ``setup(database=[primary, secondary, ...])``: their Databases, which of them
is down, and a job model bound to each (docs/discussions/how-it-is-built.md, "Storage")."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

import peewee as pw

from dramatiq_unique.errors import DatabaseUnavailable, InvalidOption
from dramatiq_unique.storage import schema
from dramatiq_unique.storage.database import DB_ERRORS, describe
from dramatiq_unique.storage.models import bound_copy

logger = logging.getLogger(__name__)

#: The key of a row's store in the suite's marker (message options); absent means the primary.
STORE = "st"
#: ms a store that failed is skipped by sends that may go elsewhere, before it is tried again.
DEFAULT_DOWN_FOR = 1_000
#: SQLSTATEs of a server that answers, for one statement or transaction: class 40 (serialization
#: failure, deadlock), query_canceled (a statement timeout) and lock_not_available (a lock timeout).
STATEMENT_ERROR_CLASSES = ("40",)
STATEMENT_ERROR_STATES = ("57014", "55P03")
#: SQLite's result codes of a file another connection holds: SQLITE_BUSY, SQLITE_LOCKED.
SQLITE_CONTENDED = (5, 6)

M = TypeVar("M", bound=pw.Model)
T = TypeVar("T")
Spec = Union[str, pw.Database]


#: Set on a model bound to a store other than the primary: the model it was made from.
BASE = "_dramatiq_unique_base"


def base_of(model: type[M]) -> type[M]:
    """The model a store's model was made from (:meth:`Stores.model_in`); the model itself for the primary."""
    return getattr(model, BASE, model)


def unreachable(error: BaseException) -> bool:
    """Whether a database ``error`` says its store cannot be reached, as opposed to one statement failing
    on a store that answers (a deadlock, a timeout: by SQLSTATE; a busy SQLite file: by result code)."""
    if not isinstance(error, DB_ERRORS):
        return False
    # The driver's exception under peewee's wrapper (``orig``; the one it was raised from otherwise).
    driver = getattr(error, "orig", None) or error.__cause__ or error.__context__
    for candidate in (error, driver):
        code = getattr(candidate, "pgcode", None) or getattr(candidate, "sqlstate", None)
        if isinstance(code, str) and code:  # a server answered
            return not (code.startswith(STATEMENT_ERROR_CLASSES) or code in STATEMENT_ERROR_STATES)
    sqlite_code = getattr(driver, "sqlite_errorcode", None)
    if isinstance(sqlite_code, int):
        return sqlite_code & 0xFF not in SQLITE_CONTENDED  # the primary code under an extended one
    return True


def specs(database: Union[Spec, Sequence[Spec]]) -> list[Spec]:
    """The ``database`` setting as a list of stores: one URL or Database, or a non-empty list of them."""
    if isinstance(database, (str, pw.Database)):
        return [database]
    if not isinstance(database, (list, tuple)) or not database:
        raise InvalidOption(f"database must be a URL, a peewee Database or a non-empty list of them, not {database!r}")
    return list(database)


class Stores:
    """The job databases, primary first (see the module docstring)."""

    def __init__(self, databases: Sequence[pw.Database], *, down_for: float = DEFAULT_DOWN_FOR) -> None:
        # What tells two stores apart: the database and its connection parameters (``search_path`` too).
        seen = [(type(db).__name__, str(db.database), sorted((k, str(v)) for k, v in db.connect_params.items()))
                for db in databases]
        for i, db in enumerate(databases):
            if seen[i] in seen[:i]:
                raise InvalidOption(f"database lists {describe(db)} twice: each store must be another database")
        self.databases = list(databases)
        self.down_for = down_for
        self._down_until: dict[int, float] = {}
        self._models: dict[tuple[type, int], type] = {}
        self._ready: set[tuple[type, int]] = set()
        #: Per store: set-up steps left for when it first answers (it was down at set-up).
        self._later: dict[int, list[Callable[[], None]]] = {}
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self.databases)

    @property
    def several(self) -> bool:
        return len(self.databases) > 1

    def name(self, index: int) -> str:
        return f"store {index} ({describe(self.databases[index])})"

    def index_of(self, model: type[pw.Model]) -> int:
        """The store a model (as :meth:`model_in` made it) is bound to; 0 for one bound elsewhere."""
        database = model._meta.database
        return next((i for i, db in enumerate(self.databases) if db is database), 0)

    def model_in(self, model: type[M], index: int) -> type[M]:
        if index == 0:
            return model
        if not 0 < index < len(self.databases):
            raise InvalidOption(f"a job names store {index}, but this process lists {len(self.databases)} "
                                f"store(s): every process must list the same stores in the same order")
        with self._lock:
            found = self._models.get((model, index))
            if found is None:
                found = bound_copy(model, self.databases[index], f"{model.__name__}_store{index}")
                setattr(found, BASE, model)
                self._models[(model, index)] = found
        return found

    def ensure(self, model: type[pw.Model], index: int) -> None:
        """Create ``model``'s table in store ``index`` if this process has not yet; raises the store's error."""
        if (model, index) in self._ready:
            return
        with self._lock:
            if (model, index) in self._ready:
                return
            for step in self._later.get(index, ()):
                step()
            self._later.pop(index, None)
            schema.create_or_migrate(self.model_in(model, index))
            self._ready.add((model, index))

    def created(self, model: type[pw.Model], index: int) -> None:
        self._ready.add((model, index))

    def later(self, index: int, step: Callable[[], None]) -> None:
        """A set-up step for store ``index``, which did not answer: run before its first use."""
        with self._lock:
            self._later.setdefault(index, []).append(step)
            self._ready = {ready for ready in self._ready if ready[1] != index}  # so that ensure() runs it

    def is_down(self, index: int) -> bool:
        until = self._down_until.get(index)
        return until is not None and time.monotonic() < until

    def mark_down(self, index: int, error: Any, *, quiet: bool = False) -> None:
        if not quiet and not self.is_down(index):
            logger.warning("Job %s does not answer (%s); for %d ms, sends that may go to another store do.",
                           self.name(index), str(error).strip().splitlines()[0] if str(error).strip() else
                           type(error).__name__, self.down_for)
        self._down_until[index] = time.monotonic() + self.down_for / 1000

    def mark_up(self, index: int) -> None:
        if self._down_until.pop(index, None) is not None:
            logger.info("Job %s answers again.", self.name(index))

    def insert(self, model: type[M], insert: Callable[[type[M]], T], marker: dict) -> tuple[type[M], T]:
        """Insert a row with ``insert(model)`` in the first store that answers (those not remembered down
        first), its index written in ``marker`` (the row's options) first: ``(model in that store, what
        insert returned)``."""
        error: Optional[BaseException] = None
        for index in sorted(range(len(self.databases)), key=self.is_down):
            target = self.model_in(model, index)
            if index:
                marker[STORE] = index
            else:
                marker.pop(STORE, None)
            try:
                return target, self._write(model, index, lambda target=target: insert(target))  # type: ignore[misc]
            except DB_ERRORS as e:
                # In the caller's transaction, it is lost with it; from a store that answers, the error
                # (a deadlock, a timeout) is the send's: nothing to fail over.
                if target._meta.database.in_transaction() or not unreachable(e):
                    raise
                error = e
        assert error is not None
        raise error

    def on_primary(self, model: type[pw.Model], what: Callable[[], str], write: Callable[[], T]) -> T:
        """Run ``write`` on the primary for ``what()``, a send that needs it: with several stores,
        DatabaseUnavailable at once while it is remembered down."""
        if not self.several:
            return write()
        self.check_primary(what())
        return self._write(model, 0, write)

    def _write(self, model: type[pw.Model], index: int, write: Callable[[], T]) -> T:
        """``write`` on store ``index``, its table made first; the store remembered down if it does not
        answer (outside a transaction), up if it does."""
        try:
            self.ensure(model, index)
            result = write()
        except DB_ERRORS as e:
            if not self.model_in(model, index)._meta.database.in_transaction() and unreachable(e):
                self.mark_down(index, e)
            raise
        self.mark_up(index)
        return result

    def check_primary(self, what: str) -> None:
        """Raise DatabaseUnavailable at once if the primary is remembered down: ``what`` needs it."""
        if self.several and self.is_down(0):
            raise DatabaseUnavailable(f"{what} needs the primary {self.name(0)}, which is down: "
                                      "uniqueness is kept by its index alone")

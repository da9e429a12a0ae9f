"""What a command runs with: the suite (the app's, or one from the environment), and its output."""

from __future__ import annotations

import dataclasses
import importlib.util
import json as jsonlib
import os
import sys
from typing import Any, Callable, Optional, TextIO

import dramatiq
import peewee as pw
from dramatiq.cli import import_broker

from dramatiq_unique import suite as _config
from dramatiq_unique.errors import DatabaseUnavailable, DramatiqUniqueError
from dramatiq_unique.health.target import DATABASE_ENV, REDIS_ENV
from dramatiq_unique.redaction import redact
from dramatiq_unique.redis.servers import client_from_url
from dramatiq_unique.storage import schema
from dramatiq_unique.storage.database import open_database
from dramatiq_unique.storage.models import JobModel
from dramatiq_unique.suite import Suite

#: The app's ``key_prefix`` (default: the suite's default), so the rows and Redis keys read are the app's.
PREFIX_ENV = "DRAMATIQ_UNIQUE_KEY_PREFIX"
#: ms the first look at a database named in the environment may take.
CONNECT_TIMEOUT = 5_000
#: The control characters a text of several lines keeps (``visible(text, keep=LINES)``).
LINES = "\n\t"


def visible(text: str, *, keep: str = "", json: bool = False) -> str:
    """``text`` with every character a terminal would act on rather than show (``str.isprintable``:
    ESC, C1, CR, backspace, bidi overrides) written out as an escape, but those in ``keep``;
    ``json=True``: as JSON escapes (``json.dumps`` leaves DEL, C1 and bidi characters raw)."""
    def shown(c: str) -> str:
        if c.isprintable() or c in keep:
            return c
        # With json: the \u escape JSON writes (a pair of surrogates past U+FFFF).
        return jsonlib.dumps(c)[1:-1] if json else c.encode("unicode_escape").decode("ascii")

    if text.isprintable() or all(c.isprintable() or c in keep for c in text):
        return text
    return "".join(map(shown, text))


class Refused(DramatiqUniqueError):
    """A command that may not run as asked (exit 1), such as a change without the app."""


class Usage(DramatiqUniqueError):
    """A command line that makes no sense (exit 2)."""


def looks_like_app(word: str, path: str = ".") -> bool:
    """Whether ``word`` names an importable module (``pkg.mod`` or ``pkg.mod:attr``)."""
    if ":" in word:
        return True
    if not word or not all(part.isidentifier() for part in word.split(".")):
        return False
    _on_path(path)
    try:
        return importlib.util.find_spec(word) is not None
    except (ImportError, ValueError):
        return False


def _on_path(path: str) -> None:
    if os.path.abspath(path) not in sys.path:
        sys.path.insert(0, os.path.abspath(path))


@dataclasses.dataclass
class Context:
    app: Optional[str] = None
    path: str = "."
    json: bool = False
    out: TextIO = dataclasses.field(default_factory=lambda: sys.stdout)
    err: TextIO = dataclasses.field(default_factory=lambda: sys.stderr)
    #: Where a question's answer is read (:meth:`confirm`).
    inp: TextIO = dataclasses.field(default_factory=lambda: sys.stdin)
    suite: Optional[Suite] = None
    broker: Optional[dramatiq.Broker] = None
    #: True when the suite came from the environment: nothing may be changed.
    read_only: bool = False
    env: dict[str, str] = dataclasses.field(default_factory=lambda: dict(os.environ))

    def load(self) -> Suite:
        """The app's suite, else one opened from the environment, read-only; Usage if neither."""
        if self.suite is not None:
            return self.suite
        if self.app:
            self.suite, self.broker = load_app(self.app, self.path)
        else:
            self.suite = from_env(self.env)
            self.read_only = True
        return self.suite

    def emit(self, data: Any, text: Callable[[], str]) -> None:
        """``data`` as JSON with ``--json``, else ``text()``; no control character reaches the terminal raw."""
        if self.json:
            self.out.write(visible(jsonlib.dumps(data, indent=2, ensure_ascii=False, default=str), keep="\n",
                                   json=True) + "\n")
        else:
            self.out.write(visible(text().rstrip("\n"), keep=LINES) + "\n")

    def say(self, message: str) -> None:
        self.err.write(visible(redact(message.rstrip("\n")), keep=LINES) + "\n")

    def confirm(self, question: str) -> bool:
        """Ask ``question`` on stderr; True only for y or yes (the end of the input is no)."""
        self.err.write(f"{question} [y/N] ")
        self.err.flush()
        return self.inp.readline().strip().lower() in ("y", "yes")


def load_app(app: str, path: str = ".") -> tuple[Suite, dramatiq.Broker]:
    """Import ``app`` with Dramatiq's own ``import_broker`` and return the suite its ``setup()`` made."""
    _on_path(path)
    try:
        _, broker = import_broker(app)
    except DramatiqUniqueError:
        raise  # setup() found a store or Redis down, a bad option...: said as such
    except Exception as e:  # the app's own import failed: say so, without a traceback of ours
        raise Usage(f"cannot import the app {app!r}: {type(e).__name__}: {e}") from e
    suite = _config._current
    if suite is None:
        raise Usage(f"{app} did not call dramatiq_unique.setup()")
    return suite, suite.broker or broker


def from_env(env: dict[str, str]) -> Suite:
    """A suite over the job tables and Redis the environment names (no actors: keys show as hashes)."""
    database, redis_url = env.get(DATABASE_ENV), env.get(REDIS_ENV)
    if not database or not redis_url:
        raise Usage(f"give the app module (APP or --app), or set {DATABASE_ENV} and {REDIS_ENV} to read the "
                    f"jobs without it")
    if database.startswith("sqlite:///") and not os.path.exists(database[len("sqlite:///"):].split("?")[0]):
        raise Refused(f"{DATABASE_ENV} names no existing SQLite file: {database}")
    db = open_database(database, connect_timeout=CONNECT_TIMEOUT, timeout=CONNECT_TIMEOUT)
    try:
        exists = db.table_exists(JobModel._meta.table_name)
    except pw.PeeweeException as e:
        raise DatabaseUnavailable(f"reading {DATABASE_ENV}: {e}") from e
    finally:
        db.close()
    if not exists:
        raise Refused(f"no job table {JobModel._meta.table_name} in {DATABASE_ENV}: has the app set up the suite?")
    settings = {"key_prefix": env[PREFIX_ENV]} if env.get(PREFIX_ENV) else {}
    # Bounded, so that a Redis that does not answer costs seconds, not the system's connect timeout.
    client = client_from_url(redis_url, socket_connect_timeout=CONNECT_TIMEOUT / 1000,
                                      socket_timeout=CONNECT_TIMEOUT / 1000)
    return ReadOnlySuite(database=database, redis=client, **settings)


class ReadOnlySuite(Suite):
    """A suite that binds the job table without creating or migrating anything: the environment's
    database role may only read."""

    #: Nothing is created or written (slots/overrides.py reads this too).
    writes = False

    def register_model(self, model: Any) -> None:
        with self._lock:
            if model not in self.models:
                model.bind(self.db, bind_refs=False, bind_backrefs=False)
                # Read only too: a table of an older schema would fail on a missing column; say why.
                version = schema.version_of(model)
                if version is not None and version < schema.CURRENT_VERSION:
                    raise schema.out_of_date(model, version)
                self.models.append(model)

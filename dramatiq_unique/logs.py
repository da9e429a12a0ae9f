"""The log lines of Dramatiq and APScheduler that the suite silences (each says something the suite
handles by design), and :class:`RedactPasswords`, which writes a password in its own lines as ``***``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dramatiq_unique.redaction import redact

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

#: Set on a message proxy that was parked, for :class:`ParkedSkipFilter`.
PARKED = "_dramatiq_unique_parked"
#: The logger of Dramatiq's worker threads.
WORKER_LOGGER = "dramatiq.worker.WorkerThread"


def _install(cls: type[logging.Filter], logger_name: str) -> None:
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, cls) for f in logger.filters):
        logger.addFilter(cls())


class ParkedSkipFilter(logging.Filter):
    """Drops Dramatiq's "Message ... was skipped." warning for parked messages (they wait, by design)."""

    @classmethod
    def install(cls) -> None:
        _install(cls, WORKER_LOGGER)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (args and getattr(args[0], PARKED, False) and "skipped" in str(record.msg))


class ResultWarningFilter(logging.Filter):
    """Drops Dramatiq's "value discarded" warning for tracked actors: their row keeps it."""

    suites: list[Suite] = []

    @classmethod
    def install(cls, suite: Suite) -> None:
        _install(cls, WORKER_LOGGER)
        cls.suites = [*cls.suites[-7:], suite]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "returned a value that is not None" not in message or not any(
            f"Actor '{name}' returned" in message for s in self.suites for name in s.actors)


class QuietTicks(logging.Filter):
    """Drops APScheduler's two INFO lines per re-drive tick ("Running job", "executed successfully")."""

    @classmethod
    def install(cls) -> None:
        _install(cls, "apscheduler.executors.default")

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or "dramatiq_unique re-drive" not in record.getMessage()


class RedactPasswords(logging.Filter):
    """Writes any password in a suite log line (its message, arguments or traceback) as ``***``."""

    @classmethod
    def install(cls) -> None:
        # On every logger of the suite's modules imported so far: a logger's filter sees only its own records.
        for name in list(logging.root.manager.loggerDict):
            if name == "dramatiq_unique" or name.startswith("dramatiq_unique."):
                _install(cls, name)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        hidden = redact(message)
        if hidden != message:
            record.msg, record.args = hidden, ()
        if record.exc_info and not record.exc_text:
            trace = logging.Formatter().formatException(record.exc_info)
            if redact(trace) != trace:  # else the handler's own formatter renders it, as without this filter
                record.exc_text = redact(trace)
        return True

"""The suite's exceptions: each a ``MiddlewareError`` (the only kind Dramatiq re-raises from ``before_*``
hooks), whose docstring is its message."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator, Optional

import redis
from dramatiq.middleware import MiddlewareError

from dramatiq_unique.redaction import redact

if TYPE_CHECKING:
    # A job row (a JobModel) is typed as peewee's Model: the job tables import these errors.
    import peewee as pw


class DramatiqUniqueError(MiddlewareError):
    """A dramatiq_unique error."""

    def __init__(self, detail: str = "", *, job: "Optional[pw.Model]" = None, **context: Any) -> None:
        # A message may name a URL, a DSN or a settings dict: never with its password.
        self.detail = detail = redact(detail) if isinstance(detail, str) else detail
        #: The job row the error is about, where there is one.
        self.job = job
        self.context = context
        message = " ".join((self.__doc__ or "").split())  # a docstring's lines make one line
        super().__init__(f"{message}: {detail}" if detail else message)


class InvalidOption(DramatiqUniqueError, ValueError):
    """An actor option or setting has an invalid value"""


class JobRejected(DramatiqUniqueError, ValueError):
    """The job's data does not fit its job table; nothing was sent or run"""


class HookFailed(DramatiqUniqueError):
    """An unexpected error stopped a dramatiq_unique hook; nothing was sent or run unprotected"""


class DuplicateJob(DramatiqUniqueError):
    """A job with the same unique key is already waiting or running"""


class JobNotFound(DramatiqUniqueError, LookupError):
    """No job of this app has that id or message id"""


class AmbiguousJobId(DramatiqUniqueError, LookupError):
    """That numeric id names a job in more than one job store"""


class JobStateError(DramatiqUniqueError):
    """The job is not in a state that allows this operation"""


class LockLost(DramatiqUniqueError):
    """The job's lock is no longer held; the job must stop"""


class DependencyUnavailable(DramatiqUniqueError):
    """A service the suite needs could not be reached; nothing was sent or run unprotected"""


class DatabaseUnavailable(DependencyUnavailable):
    """The job table could not be reached"""


class RedisUnavailable(DependencyUnavailable):
    """Redis could not be reached for a lock"""

    def __new__(cls, detail: Any = "", **context: Any) -> "RedisUnavailable":
        # Every wrapper of a Redis error raises this class: a refusal by the ACL says so (a subclass).
        if cls is RedisUnavailable and permission_refused(detail):
            cls = RedisPermissionDenied
        return super().__new__(cls, detail)


@contextlib.contextmanager
def redis_errors(doing: str) -> Iterator[None]:
    """A Redis error inside raises :class:`RedisUnavailable`: ``<doing>: <error>``."""
    try:
        yield
    except redis.RedisError as e:
        raise RedisUnavailable(f"{doing}: {e}") from e


class RedisPermissionDenied(RedisUnavailable):
    """Redis refused the suite's user a key or a command (NOPERM: its ACL); an ACL user needs the keys
    <key_prefix>:* and redlock:<key_prefix>:* (the locks, in pottery's format), and the broker's <namespace> and
    <namespace>:* (docs/operations/deploying.md)"""


def permission_refused(error: Any) -> bool:
    """Whether ``error`` (a Redis error, or its text) is a refusal by the user's ACL (``NoPermissionError``
    drops the ``NOPERM`` code from its text, a script's reply keeps it)."""
    text = str(error)
    return "NOPERM" in text or type(error).__name__ == "NoPermissionError" or "user has no permissions" in text


class UnsupportedVersion(DependencyUnavailable):
    """A dependency is at a version the suite was not written for; nothing was sent or run unprotected"""


class IdempotencyKeyReused(DramatiqUniqueError):
    """The idempotency key was already used for a job with other arguments"""


class NotSerializable(DramatiqUniqueError, TypeError):
    """A checkpoint's result must be JSON-serialisable"""


class NotInJob(DramatiqUniqueError):
    """This function can only be called inside a tracked actor"""


class NotConfigured(DramatiqUniqueError):
    """dramatiq_unique.setup() has not been called"""


class SchemaOutOfDate(DramatiqUniqueError):
    """A job table was made by an earlier release"""

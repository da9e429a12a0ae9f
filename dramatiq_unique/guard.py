"""One guard for every ``before_*`` hook: Dramatiq stops a send or a job only for a ``MiddlewareError``, so
:func:`hook` and :func:`guarded` turn every other error into one of the suite's (:func:`translate`)."""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, TypeVar

import peewee as pw
import redis
from dramatiq.middleware import MiddlewareError, SkipMessage

from dramatiq_unique.errors import DatabaseUnavailable, HookFailed, JobRejected, RedisUnavailable
from dramatiq_unique.storage.database import DB_ERRORS

F = TypeVar("F", bound=Callable[..., Any])

_REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError)
# Set on a message proxy whose SkipMessage one of the suite's own hooks raised.
_OWN_SKIP = "_dramatiq_unique_own_skip"


def own_skip(message: Any) -> bool:
    """Whether the suite itself skipped ``message`` (parked it, dropped a copy), not another middleware."""
    return bool(getattr(message, _OWN_SKIP, False))


def translate(error: Exception, where: str) -> MiddlewareError:
    """The suite's error to raise instead of ``error`` (not a ``MiddlewareError``: that one is raised as it is)."""
    detail = f"{where}: {type(error).__name__}: {error}"
    for kinds, replacement in ((DB_ERRORS, DatabaseUnavailable), (pw.DataError, JobRejected),
                               (_REDIS_ERRORS, RedisUnavailable)):
        if isinstance(error, kinds):
            return replacement(detail)
    return HookFailed(detail)


@contextlib.contextmanager
def guarded(where: str) -> Iterator[None]:
    """Errors inside become the suite's errors (see :func:`translate`); KeyboardInterrupt and friends pass."""
    try:
        yield
    except MiddlewareError:
        raise
    except Exception as error:
        raise translate(error, where) from error


def describe(message: Any) -> str:
    """``<actor> job <message id>`` for a message, ``actor <name>`` for an actor being declared."""
    actor, message_id = getattr(message, "actor_name", "?"), getattr(message, "message_id", None)
    return f"actor {actor}" if message_id is None else f"{actor} job {message_id}"


def hook(fn: F) -> F:
    """Decorate a middleware's ``before_enqueue``, ``before_process_message`` or ``before_declare_actor`` (a
    table that cannot be created must not leave the actor declared untracked)."""

    @functools.wraps(fn)
    def wrapper(self: Any, broker: Any, message: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, broker, message, *args, **kwargs)
        except SkipMessage:
            # Ours: a park or a dropped copy, which must neither fail the job nor free its
            # key (JobTracking.after_skip_message does that for other middlewares' skips).
            with contextlib.suppress(AttributeError):  # not a message proxy (a declared actor): nothing to mark
                setattr(message, _OWN_SKIP, True)
            raise
        except MiddlewareError:
            raise
        except Exception as error:
            where = f"{type(self).__name__}.{fn.__name__} of {describe(message)}"
            raise translate(error, where) from error

    return wrapper  # type: ignore[return-value]

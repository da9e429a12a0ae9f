"""Sending while the broker is down: the ``on_broker_down`` setting.

With ``"defer"``, a tracked send whose publish fails with a connection error keeps its row ``pending``
(marked :data:`DEFERRED`) for the re-drive and returns as if published.  See docs/howto/outbox.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Iterator, Optional

import dramatiq.errors
import redis

from dramatiq_unique.context import MARKER
from dramatiq_unique.redis import servers
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobStatus

if TYPE_CHECKING:
    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

#: The marker entry of a row kept pending because the broker was down.
DEFERRED = "dfr"


#: The errors that say the broker could not be reached (our own publish script raises redis-py's).  Dramatiq 2.1
#: renamed its ConnectionError (ConnectionClosed, ConnectionFailed...) BrokerConnectionError.
BROKER_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError, redis.TimeoutError,
    getattr(dramatiq.errors, "BrokerConnectionError", None) or dramatiq.errors.ConnectionError,
)
try:  # pika is only there with the RabbitMQ broker; its connection errors may escape Dramatiq's retries
    import pika.exceptions  # type: ignore[import-untyped]

    BROKER_ERRORS += (pika.exceptions.AMQPConnectionError,)
except ImportError:  # pragma: no cover
    pass


def defers(suite: "Suite", error: BaseException) -> bool:
    """Whether a tracked send that failed with ``error`` is kept for the re-drive."""
    return suite.settings.on_broker_down == "defer" and isinstance(error, BROKER_ERRORS)


def describe(broker: Any) -> str:
    """The broker, named for a log line: its class and address."""
    name = type(broker).__name__
    client = getattr(broker, "client", None)
    if client is not None:  # the Redis broker
        sentinel = servers.describe(client)
        if sentinel is not None:
            return f"{name} at {sentinel}"
        kwargs = client.connection_pool.connection_kwargs
        return f"{name} at {kwargs.get('host', kwargs.get('path'))}:{kwargs.get('port', '')}"
    params = getattr(broker, "parameters", None)
    if isinstance(params, list):
        params = params[0] if params else None
    if params is not None and hasattr(params, "host"):
        return f"{name} at {params.host}:{params.port}"
    return name


@dataclasses.dataclass
class Outage:
    """What this process knows of a broker being down."""

    name: str  # the broker, as describe() names it
    down: bool = False
    until: float = 0.0  # time.monotonic() until which tracked sends do not try the broker


_outages: "weakref.WeakKeyDictionary[Any, Outage]" = weakref.WeakKeyDictionary()
#: Taken only when a publish fails, or first succeeds after a failure: one for every broker's outage.
_lock = threading.Lock()


def published(broker: Any) -> None:
    found = _outages.get(broker)
    if found is not None and found.down:
        with _lock:
            found.down, found.until = False, 0.0
        logger.debug("The broker (%s) answers again.", found.name)


def failed(suite: "Suite", broker: Any, error: BaseException) -> None:
    with _lock:
        found = _outages.get(broker)
        if found is None:
            found = _outages[broker] = Outage(describe(broker))
        first, found.down = not found.down, True
        found.until = time.monotonic() + suite.settings.broker_down_backoff / 1000
    if first:
        logger.warning(
            "The broker (%s) is down (%s: %s); tracked sends are kept pending and the re-drive publishes "
            "them when it answers; untracked sends raise. Not logged again until a publish succeeds.",
            found.name, type(error).__name__, error,
        )


def send_failed(suite: "Suite", broker: Any, message_id: str, error: BaseException) -> None:
    """The re-drive or the outbox could not publish a pending job, which stays pending: a broker
    connection error counts toward the outage's one WARNING; anything else is logged each time."""
    if isinstance(error, BROKER_ERRORS):
        failed(suite, broker, error)
        logger.debug("Could not send job %s (%s: %s); it stays pending.", message_id, type(error).__name__, error)
    else:
        logger.warning("Could not send job %s (%s: %s); it stays pending.", message_id, type(error).__name__, error,
                       exc_info=error)


_skipping: contextvars.ContextVar[bool] = contextvars.ContextVar("dramatiq_unique_skip_publish", default=False)


@contextlib.contextmanager
def skipping() -> Iterator[None]:
    """Sends recorded meanwhile are written pending and not published (the broker failed first)."""
    token = _skipping.set(True)
    try:
        yield
    finally:
        _skipping.reset(token)


def skip_publish(suite: "Suite") -> bool:
    """Whether a new tracked send is to be written ``pending`` without trying the broker."""
    if _skipping.get():
        return True
    broker = suite.broker
    if broker is None or suite.settings.on_broker_down != "defer":
        return False
    found = _outages.get(broker)  # resting: a publish failed less than broker_down_backoff ago
    return found is not None and found.until > 0.0 and time.monotonic() < found.until


def flagged(options: dict) -> dict:
    return {**options, MARKER: {**(options.get(MARKER) or {}), DEFERRED: 1}}


def keep(model: type["JobModel"], row_id: int, ref: Optional[str], options: dict) -> None:
    """Make the row a send just wrote ``pending`` for the re-drive, if it is still as written
    (queued, with the broker id of the publish that failed)."""
    jobs.unclaim_sends(model, [row_id], JobStatus.PENDING.value, ref=ref, options=flagged(options))


def was_deferred(row: "JobModel") -> bool:
    return bool(((row.options or {}).get(MARKER) or {}).get(DEFERRED))


def log_backlog(count: int) -> None:  # once per re-drive pass that published deferred jobs
    if count:
        logger.info("Published %d job%s deferred while the broker was down.", count, "" if count == 1 else "s")


def keep_replaced(model: type["JobModel"], row_id: int, revision: int) -> None:
    """A waiting job whose arguments a duplicate replaced, and whose new message the broker
    failed: ``pending`` for the re-drive, unless it moved on since (a start, a newer claim)."""
    waiting = model.status.in_((JobStatus.QUEUED.value, JobStatus.PENDING.value))
    model.update(status=JobStatus.PENDING.value, enqueued_at=None, broker_ref=None).where(
        (model.id == row_id) & (model.revision == revision) & waiting & model.parked_on.is_null()
    ).execute()

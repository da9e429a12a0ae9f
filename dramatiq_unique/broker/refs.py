"""The Redis broker's own names, as Dramatiq 2.x lays them out: its id for a message (a job row's ``broker_ref``:
``redis_message_id``, else the message id) and who records it, and its keys as its ``dispatch.lua`` writes them (read
by the lost-message check, written by a local delivery).  A Redis broker under an untested Dramatiq is refused
(:func:`check`), as a message written where no consumer reads it would be lost without a word."""

from __future__ import annotations

import contextlib
import contextvars
import re
from typing import TYPE_CHECKING, Any, Iterator, Optional

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis

from dramatiq_unique.errors import UnsupportedVersion

if TYPE_CHECKING:
    from dramatiq import Message

#: The message option in which Dramatiq's Redis broker keeps its id for a delivery.
REDIS_MESSAGE_ID = "redis_message_id"

# Set while the suite re-sends a job (re-drive, outbox): it records the broker's id itself.
_resending: contextvars.ContextVar[bool] = contextvars.ContextVar("dramatiq_unique_resending", default=False)


def broker_ref(message: "Message") -> str:
    """What a job row's ``broker_ref`` records for ``message`` (see the module's docstring)."""
    return message.options.get(REDIS_MESSAGE_ID) or message.message_id


@contextlib.contextmanager
def resending() -> Iterator[None]:
    token = _resending.set(True)
    try:
        yield
    finally:
        _resending.reset(token)


def is_resending() -> bool:
    """Whether the send under way is a re-send by the suite (see the module's docstring)."""
    return _resending.get()


#: The Dramatiq versions the suite's use of the Redis broker's internals was written against.
SUPPORTED = "dramatiq>=2,<3"


def check(broker: Any) -> None:
    """Refuse a Redis broker under a Dramatiq these keys were not checked against."""
    version = dramatiq.__version__
    if isinstance(broker, RedisBroker) and not re.match(r"\s*2(?!\d)", version):  # SUPPORTED
        raise UnsupportedVersion(
            f"dramatiq {version}: the suite reads and writes the Redis broker's keys as {SUPPORTED} lays "
            f"them out, and has not been checked against this version; use {SUPPORTED} "
            f"(or RabbitmqBroker, which needs none of this)"
        )


def dispatch_args(broker: Any, command: str, queue_name: str, *args: Any, worker: Optional[str] = None,
                  maintenance: int = 0) -> list:
    """The arguments of the Redis broker's ``dispatch.lua`` as its ``do_<command>`` passes them."""
    return [command, current_millis(), queue_name, worker or broker.broker_id, broker.heartbeat_timeout,
            broker.dead_message_ttl, maintenance, broker._max_unpack_size(), *args]


def dispatch(broker: Any, command: str, queue_name: str, *args: Any, worker: Optional[str] = None,
             maintenance: int = 0) -> Any:
    """Run the Redis broker's own ``dispatch.lua`` as its ``do_<command>`` does."""
    return broker.scripts["dispatch"](keys=[broker.namespace], args=dispatch_args(
        broker, command, queue_name, *args, worker=worker, maintenance=maintenance))


class BrokerKeys:
    """Dramatiq's Redis broker keys under its namespace."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def messages(self, queue_name: str) -> str:
        """A queue's hash of message id to message body."""
        return f"{self.namespace}:{queue_name}.msgs"

    def acks(self, worker_id: str, queue_name: str) -> str:
        """The ids a worker fetched from a queue and has not acked yet."""
        return f"{self.namespace}:__acks__.{worker_id}.{queue_name}"

    def heartbeats(self) -> str:
        """The broker processes, scored by their last call's time."""
        return f"{self.namespace}:__heartbeats__"

"""The broker's own id for a message (a job row's ``broker_ref``), and who records it.

Dramatiq's Redis broker gives each delivery an id of its own, kept in the
message's options as ``redis_message_id`` (a new one when a delayed
message comes due); the lost-message check looks it up
(:mod:`dramatiq_unique.broker.presence`).  Other brokers have none: the
row then records the message id, which says "published".

The re-drive, the outbox after its commit and a woken job's local
delivery send a message whose row they write this id into themselves;
while they do, :func:`resending` tells the enqueue side
(:mod:`dramatiq_unique.unique.enqueue`) not to write it a second time.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import TYPE_CHECKING, Iterator, Optional

if TYPE_CHECKING:
    from dramatiq import Message

#: The message option in which Dramatiq's Redis broker keeps its id for a delivery.
REDIS_MESSAGE_ID = "redis_message_id"

# Set while the suite re-sends a job (re-drive, outbox): it records the broker's id itself.
_resending: contextvars.ContextVar[bool] = contextvars.ContextVar("dramatiq_unique_resending", default=False)


def redis_ref(message: "Message") -> Optional[str]:
    """The Redis broker's id for this delivery of ``message``; None on another broker."""
    return message.options.get(REDIS_MESSAGE_ID)


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

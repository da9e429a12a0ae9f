"""The broker's own id for a message (a job row's ``broker_ref``: the Redis broker's
``redis_message_id``, else the message id), and who records it."""

from __future__ import annotations

import contextlib
import contextvars
from typing import TYPE_CHECKING, Iterator

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

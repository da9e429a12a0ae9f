"""A re-send by the suite, which records the broker's id for the message itself.

The re-drive, the outbox after its commit and a woken job's local
delivery send a message whose row they write the broker's id into
themselves; while they do, :func:`resending` tells the enqueue side
(:mod:`dramatiq_unique.unique.enqueue`) not to write it a second time.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

# Set while the suite re-sends a job (re-drive, outbox): it records the broker's id itself.
_resending: contextvars.ContextVar[bool] = contextvars.ContextVar("dramatiq_unique_resending", default=False)


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

"""Parked jobs kept out of the counts of Dramatiq's own ``Prometheus`` middleware.

A parked job is a delivery that its gate answered with ``SkipMessage``
(:mod:`dramatiq_unique.parking.lot`): it waits, it was not processed.
Dramatiq's middleware counts every skipped message as a processed one
(``after_skip_message = after_process_message``: ``dramatiq_messages_total``
and a near-instant ``dramatiq_message_duration_milliseconds``), and
``emit_after`` calls it whatever the order of the middlewares.  Worse,
added after the suite's (``broker.add_middleware(Prometheus())``), its
``before_process_message`` never ran for the parked delivery, and its
``dramatiq_messages_inprogress`` gauge goes down by one for each park.

So :func:`quiet_parks` puts, on the broker's instance, an
``after_skip_message`` that leaves a parked delivery out: it only undoes
what Dramatiq's ``before_process_message`` did for it, if it ran (the
in-progress gauge and the start time), or the delayed-message gauge it
did not get to lower.  Every other skip is counted as before.  The woken
job's delivery is counted as Dramatiq counts any message: once, with the
time it ran.

It reads the middleware's attributes (``message_start_times``,
``inprogress_messages``, ``delayed_messages``,
``inprogress_delayed_messages``), those of Dramatiq 2.x
(:data:`dramatiq_unique.broker.keys.SUPPORTED`); an instance without
them is left as it is.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any, Callable

from dramatiq_unique.logs import PARKED

if TYPE_CHECKING:
    import dramatiq

logger = logging.getLogger(__name__)

#: Set on a middleware whose ``after_skip_message`` leaves parked deliveries out.
QUIET = "_dramatiq_unique_quiet_parks"
#: What the wrapper reads of Dramatiq's ``Prometheus`` instance (set by its ``after_process_boot``).
NEEDED = ("message_start_times", "inprogress_messages", "delayed_messages", "inprogress_delayed_messages")


def prometheus_middlewares(broker: "dramatiq.Broker") -> list[Any]:
    """The broker's instances of Dramatiq's ``Prometheus`` middleware (subclasses included)."""
    module = sys.modules.get("dramatiq.middleware.prometheus")
    if module is None:  # never imported, so on no broker; importing it would make its directory for nothing
        return []
    return [m for m in broker.middleware if isinstance(m, module.Prometheus)]


def quiet_parks(broker: "dramatiq.Broker") -> int:
    """Keep parked deliveries out of the counts of the broker's Dramatiq ``Prometheus`` middlewares;
    returns how many it wrapped now.  Call it once every middleware is added (at process boot)."""
    wrapped = 0
    for middleware in prometheus_middlewares(broker):
        if getattr(middleware, QUIET, False):
            continue
        original = middleware.after_skip_message
        middleware.after_skip_message = _leave_out_parks(middleware, original)
        setattr(middleware, QUIET, True)
        wrapped += 1
    return wrapped


def _leave_out_parks(prom: Any, original: Callable[..., None]) -> Callable[..., None]:
    def after_skip_message(broker: "dramatiq.Broker", message: Any) -> None:
        if not getattr(message, PARKED, False):
            return original(broker, message)
        if not all(hasattr(prom, name) for name in NEEDED):  # not booted, or another version: as Dramatiq does
            return original(broker, message)
        labels = (message.queue_name, message.actor_name)
        if prom.message_start_times.pop(message.message_id, None) is not None:
            prom.inprogress_messages.labels(*labels).dec()  # its before_process_message ran: undone
        elif message.message_id in prom.delayed_messages:  # it did not: the delayed gauge it would have lowered
            prom.delayed_messages.discard(message.message_id)
            prom.inprogress_delayed_messages.labels(*labels).dec()

    return after_skip_message

"""The suite's Prometheus metrics in worker processes, beside Dramatiq's ``Prometheus`` middleware, whose
counts leave parked jobs out: it counts a skipped message as processed (docs/discussions/how-it-is-built.md)."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any, Callable, Optional

from dramatiq import Middleware

from dramatiq_unique import observe
from dramatiq_unique.errors import NotConfigured
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
        # Not booted, or another version: as Dramatiq does.
        if not getattr(message, PARKED, False) or not all(hasattr(prom, name) for name in NEEDED):
            return original(broker, message)
        labels = (message.queue_name, message.actor_name)
        if prom.message_start_times.pop(message.message_id, None) is not None:
            prom.inprogress_messages.labels(*labels).dec()  # its before_process_message ran: undone
        elif message.message_id in prom.delayed_messages:  # it did not: the delayed gauge it would have lowered
            prom.delayed_messages.discard(message.message_id)
            prom.inprogress_delayed_messages.labels(*labels).dec()

    return after_skip_message


class Metrics(Middleware):
    """Turns the suite's metrics on when a worker process boots (``setup()`` adds it), and keeps parked
    deliveries out of Dramatiq's own message counts.

    ``enabled``: None, on when Dramatiq's ``Prometheus`` middleware is on the broker, in its multiprocess
    directory, so that its exposition server (port 9191) shows both; True, on anyway (in the environment's
    directory, else the process's default registry); False, off.
    """

    def __init__(self, *, enabled: Optional[bool] = None) -> None:
        self.enabled = enabled

    def after_process_boot(self, broker) -> None:
        beside = prometheus_middlewares(broker)
        quiet_parks(broker)
        if self.enabled is False or (self.enabled is None and not beside):
            return
        try:
            # Dramatiq's directory (importing its module creates it, and imports no prometheus_client),
            # whichever middleware boots first: both import prometheus_client after it is set.
            from dramatiq.middleware import prometheus

            observe.enable_metrics(multiprocess_dir=prometheus.DB_PATH if beside else None)
        except NotConfigured as e:
            logger.error("dramatiq_unique metrics are off: %s", e)

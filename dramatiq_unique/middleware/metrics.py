"""The suite's Prometheus metrics in worker processes, beside Dramatiq's ``Prometheus`` middleware."""

from __future__ import annotations

import logging
from typing import Optional

from dramatiq import Middleware

from dramatiq_unique import observe
from dramatiq_unique.broker.prometheus import prometheus_middlewares, quiet_parks
from dramatiq_unique.errors import NotConfigured

logger = logging.getLogger(__name__)


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
            # Dramatiq's directory, whichever middleware boots first: both import prometheus_client after it is set.
            observe.enable_metrics(multiprocess_dir=observe.dramatiq_directory() if beside else None)
        except NotConfigured as e:
            logger.error("dramatiq_unique metrics are off: %s", e)

"""Runs the re-drive scheduler inside worker processes."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

from dramatiq import Middleware

from dramatiq_unique.durable.redrive import start_redriver
from dramatiq_unique.suite import Suite

if TYPE_CHECKING:
    from apscheduler.schedulers.base import BaseScheduler

logger = logging.getLogger(__name__)


class Redriver(Middleware):
    """Starts :func:`~dramatiq_unique.start_redriver` after a worker boots and stops it at shutdown.

    Does nothing when the suite's ``redriver`` setting is false (run
    ``python -m dramatiq_unique redrive APP_MODULE`` instead, or nothing).
    Every worker process runs one; the pass lock keeps passes one at a
    time across the cluster.

    Parameters:
      suite: the configuration that :func:`dramatiq_unique.setup` returns.
      interval: ms between passes; the ``redrive_interval`` setting by default.
    """

    def __init__(self, *, suite: Suite, interval: Optional[float] = None) -> None:
        self.suite = suite
        self.interval = interval
        self.scheduler: Optional[BaseScheduler] = None

    def after_worker_boot(self, broker, worker) -> None:
        if not self.suite.settings.redriver or self.scheduler is not None:
            return
        self.scheduler = start_redriver(self.interval, suite=self.suite, broker=broker)

    def before_worker_shutdown(self, broker, worker) -> None:
        scheduler, self.scheduler = self.scheduler, None
        if scheduler is not None:
            # wait=True lets a pass under way finish its page and release the pass lock.
            scheduler.shutdown(wait=True)

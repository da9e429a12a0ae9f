"""Runs the re-drive scheduler inside worker processes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from dramatiq import Middleware

from dramatiq_unique.durable.redrive import start_redriver
from dramatiq_unique.suite import Suite

if TYPE_CHECKING:
    from apscheduler.schedulers.base import BaseScheduler

class Redriver(Middleware):
    """Runs :func:`~dramatiq_unique.start_redriver` (every ``interval`` ms, ``redrive_interval`` by default) in
    every worker process, unless the ``redriver`` setting is false (``python -m dramatiq_unique redrive APP``
    then runs it); the pass lock keeps passes one at a time across the cluster."""

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

"""The suite's Dramatiq middlewares, one module a concern (the two gate middlewares and their base share ``gates``)."""

from dramatiq_unique.middleware.gates import ConcurrencySlots, ExecutionLocks
from dramatiq_unique.middleware.job_tracking import JobTracking
from dramatiq_unique.middleware.metrics import Metrics
from dramatiq_unique.middleware.reclaimer import Reclaimer
from dramatiq_unique.middleware.redriver import Redriver

__all__ = ["ConcurrencySlots", "ExecutionLocks", "JobTracking", "Metrics", "Reclaimer", "Redriver"]

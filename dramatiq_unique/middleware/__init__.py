"""The suite's Dramatiq middlewares (the two gate middlewares live with the leases they take)."""

from dramatiq_unique.leases import ConcurrencySlots, ExecutionLocks
from dramatiq_unique.middleware.job_tracking import JobTracking
from dramatiq_unique.middleware.metrics import Metrics
from dramatiq_unique.middleware.redriver import Redriver

__all__ = ["ConcurrencySlots", "ExecutionLocks", "JobTracking", "Metrics", "Redriver"]

"""The suite's Dramatiq middlewares, one class a module (the gate middlewares' base is in ``leases``)."""

from dramatiq_unique.middleware.concurrency_slots import ConcurrencySlots
from dramatiq_unique.middleware.execution_locks import ExecutionLocks
from dramatiq_unique.middleware.job_tracking import JobTracking
from dramatiq_unique.middleware.metrics import Metrics
from dramatiq_unique.middleware.redriver import Redriver

__all__ = ["ConcurrencySlots", "ExecutionLocks", "JobTracking", "Metrics", "Redriver"]

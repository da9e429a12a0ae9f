"""The suite's Dramatiq middlewares."""

from .execution import ExecutionLocks
from .redriver import Redriver
from .slots import ConcurrencySlots
from .tracking import JobTracking

__all__ = ["ConcurrencySlots", "ExecutionLocks", "JobTracking", "Redriver"]

"""The suite's Dramatiq middlewares."""

from .execution import ExecutionLocks
from .tracking import JobTracking

__all__ = ["ExecutionLocks", "JobTracking"]

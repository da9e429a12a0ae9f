"""The suite's Dramatiq middlewares."""

from .execution import ExecutionLocks
from .redriver import Redriver
from .tracking import JobTracking

__all__ = ["ExecutionLocks", "JobTracking", "Redriver"]

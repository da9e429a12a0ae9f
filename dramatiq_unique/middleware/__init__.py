"""The suite's Dramatiq middlewares."""

from .tracking import JobTracking

__all__ = ["JobTracking"]

"""The one switch the hooks read: the metrics sink of this process, or None (metrics off).

A module of its own so that :mod:`dramatiq_unique.observe.events` (imported
by the whole suite) and :mod:`dramatiq_unique.observe.switch` (which builds
the sink) share it without importing each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from dramatiq_unique.observe.metrics import SuiteMetrics


class State:
    #: The metrics of this process, shared by every suite in it (metrics are per process:
    #: prometheus_client refuses a metric registered twice); None while metrics are off.
    sink: Optional[SuiteMetrics] = None


state = State()

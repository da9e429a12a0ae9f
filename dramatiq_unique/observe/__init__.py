"""Observation: the suite's log lines and Prometheus metrics, in one home.

The code calls :mod:`dramatiq_unique.observe.events` at each event (a
duplicate decided, a job parked or woken, a fenced write refused...).
Each hook writes the event's log line, if it has one, and moves its
metric when metrics are on (:func:`enable_metrics`); with metrics off a
hook costs one attribute read.  ``prometheus_client`` is imported only
when metrics are turned on.
"""

from dramatiq_unique.observe.switch import disable_metrics, enable_metrics, metrics_on

__all__ = ["disable_metrics", "enable_metrics", "metrics_on"]

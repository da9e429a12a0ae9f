"""Observation: the suite's log lines and Prometheus metrics (``prometheus_client`` is imported only
when metrics are turned on)."""

from dramatiq_unique.observe.switch import disable_metrics, enable_metrics, metrics_on

__all__ = ["disable_metrics", "enable_metrics", "metrics_on"]

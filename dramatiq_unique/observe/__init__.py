"""Observation: the suite's log lines and metrics (:mod:`.events`), and the switch that turns the metrics on,
in the multiprocess directory of Dramatiq's ``Prometheus`` middleware so that one endpoint shows both."""

from __future__ import annotations

import logging
import os
import threading
from typing import Optional

from dramatiq_unique.errors import NotConfigured
from dramatiq_unique.observe import events

__all__ = ["disable_metrics", "enable_metrics", "metrics_on"]

logger = logging.getLogger(__name__)

#: The environment variables prometheus_client reads (the lower-case one is its older name; Dramatiq sets both).
ENV = ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")
_lock = threading.Lock()


def metrics_on() -> bool:
    """Whether this process's suite events move metrics."""
    return events.sink is not None


def enable_metrics(*, multiprocess_dir: Optional[str] = None) -> None:
    """Turn the suite's metrics on in this process (once; later calls do nothing), in the multiprocess
    directory ``multiprocess_dir`` (the ``Metrics`` middleware passes Dramatiq's), else the one already in
    the environment, else the process's default registry.  :class:`~dramatiq_unique.errors.NotConfigured`
    without prometheus_client (``pip install 'dramatiq_unique[prometheus]'``)."""
    with _lock:
        if events.sink is not None:
            return
        if multiprocess_dir is not None:
            # Missing (a temporary-files cleaner took it): made again, as Dramatiq makes it at import.
            os.makedirs(multiprocess_dir, exist_ok=True)
            for name in ENV:
                os.environ[name] = multiprocess_dir
        try:
            import prometheus_client as prom
            from prometheus_client import values
        except ImportError as e:
            raise NotConfigured("metrics need prometheus_client: pip install 'dramatiq_unique[prometheus]'") from e
        multiprocess = getattr(values.ValueClass, "_multiprocess", False)
        if multiprocess_dir is not None and not multiprocess:
            logger.warning("prometheus_client was imported before its multiprocess directory was set: this "
                           "process's metrics, Dramatiq's too, stay in its default registry, off the shared "
                           "endpoint.  Import it after the worker boots, or set PROMETHEUS_MULTIPROC_DIR first.")
        # Multiprocess: a private registry, as Dramatiq's (the directory is what is shared).  Otherwise the
        # default one, that the process's own exposition serves.
        events.sink = events.SuiteMetrics(prom.CollectorRegistry() if multiprocess else prom.REGISTRY)


def disable_metrics() -> None:
    """Turn the suite's metrics off in this process (its metrics leave the default registry)."""
    with _lock:
        sink, events.sink = events.sink, None
        if sink is None:
            return
        for collector in sink.metrics.values():
            sink.registry.unregister(collector)

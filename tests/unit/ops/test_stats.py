"""Percentiles as PostgreSQL's percentile_cont computes them, for SQLite's samples: no service."""

from __future__ import annotations

from dramatiq_unique.ops.stats import percentile
from dramatiq_unique.ops.views import Stats


def test_percentiles_interpolate_as_percentile_cont():
    assert percentile([], 0.5) is None
    assert percentile([7.0], 0.95) == 7.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert abs(percentile([float(i) for i in range(1, 101)], 0.95) - 95.05) < 1e-9


def test_stats_as_json():
    s = Stats(15, {"queued": 2}, {"a": {"queued": 2}}, [0] * 15, {"p50": None, "p95": None}, {"p50": 1.5, "p95": 2.0})
    assert s.as_dict()["by_actor"] == {"a": {"queued": 2}} and s.as_dict()["down"] == []

"""The dashboard's filters, chart and timeline layout (no service)."""

from __future__ import annotations

from datetime import datetime, timedelta

from dramatiq_unique.ops.views import Attempt, JobView
from dramatiq_unique.web import pages

T0 = datetime(2026, 11, 24, 22, 0, 0)


def test_values_are_cut_to_a_line_and_times_read_well():
    assert pages.cell({"b": 1, "a": "x"}) == '{"a": "x", "b": 1}'
    assert pages.cell("a\n  b") == "a b"
    assert pages.cell("x" * 500) == "x" * 119 + "…"
    assert pages.detail("y" * 50_000).endswith("…") and len(pages.detail("y" * 50_000)) == pages.MAX_DETAIL
    assert pages.cell(None) == "" and pages.detail(None) == ""
    assert pages.cell({1: object()}).startswith('{"1": "<object')  # not JSON: its repr, still one line
    duration = pages.FILTERS["duration"]  # the one of the command line (ops.words), blank for no value
    assert [duration(ms) for ms in (None, 350, 4200, 180_000, 7_200_000, 5 * 86_400_000)] == [
        "", "350 ms", "4 s", "3 m", "2 h", "5 d"]
    assert pages.ago(T0, now=T0 + timedelta(seconds=12)) == "12 s ago"
    assert pages.ago(T0 + timedelta(minutes=3), now=T0) == "in 3 m"
    assert pages.FILTERS["when"](T0) == "2026-11-24 22:00:00" and pages.FILTERS["when"](None) == ""
    assert pages.status_class('failed" onload="x') == "st-failedonloadx"


def test_the_chart_lays_one_bar_per_minute_scaled_to_the_peak():
    drawn = pages.bars([0, 5, 10], end=T0)
    assert drawn.peak == 10 and drawn.total == 15 and len(drawn.bars) == 3
    assert drawn.bars[0].height == 0 and drawn.bars[2].height == pages.HEIGHT - 14
    assert drawn.bars[1].label == "21:58: 5 jobs"
    assert pages.bars([]).bars == [] and pages.bars([0, 0]).peak == 0


def _job(history, created=T0, finished=None) -> JobView:
    return JobView(id=1, ref="1", store=0, message_id="m", actor="a", queue="default", status="succeeded", key="",
                   args=[], kwargs={}, attempts=len(history), created_at=created, enqueued_at=None, process_after=None,
                   started_at=None, finished_at=finished, last_error=None, result=None, fencing_token=1,
                   checkpoints=None, worker=None, parked_on=None, table="t", history=history, waiting=None, why="")


def test_the_timeline_puts_attempts_on_one_axis():
    history = [
        Attempt(1, T0 + timedelta(seconds=1), T0 + timedelta(seconds=2), "failed", "boom", "w"),
        Attempt(2, (T0 + timedelta(seconds=3)).isoformat(), (T0 + timedelta(seconds=4)).isoformat(), "succeeded",
                None, "w"),
    ]
    spans = pages.timeline(_job(history, finished=T0 + timedelta(seconds=4)))
    assert [(s.x, s.width, s.css) for s in spans] == [
        (0.0, 150.0, "a-wait"), (150.0, 150.0, "a-failed"), (300.0, 150.0, "a-wait"), (450.0, 150.0, "a-succeeded")]
    assert pages.timeline(_job([Attempt(1, None, None, None, None, None)])) == []
    running = pages.timeline(_job([Attempt(1, T0, None, "running", None, "w")]), now=T0 + timedelta(seconds=1))
    assert [(s.width, s.css) for s in running] == [(pages.TIMELINE_WIDTH, "a-running")]
    first_line = pages.FILTERS["first_line"]
    assert first_line("RuntimeError: x\nTraceback ...") == "RuntimeError: x" and first_line(None) == ""

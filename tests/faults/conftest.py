"""The fault suite's terminal summary: the nemesis's seed and figures, also when it passed (pytest
shows a passing test's output only with -s, and not at all under xdist)."""

from __future__ import annotations

from typing import Any

_lines: list[str] = []


def pytest_runtest_logreport(report: Any) -> None:
    if report.when == "call":
        _lines.extend(value for name, value in report.user_properties if name == "nemesis")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _lines:
        terminalreporter.section("nemesis")
        for line in _lines:
            terminalreporter.write_line(line)

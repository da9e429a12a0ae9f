"""The nemesis (tests/faults/nemesis.py) for about three minutes: random faults from a fresh seed,
judged by tests/faults/checker.py.

The seed is ``DU_NEMESIS_SEED`` if set (.ci/run sets and prints it), else a fresh one; it is in the
output (the ``NEMESIS`` line of the terminal summary) and in the failure message, with the command
that replays it.  ``DU_NEMESIS_SECONDS`` changes the length of the fault phase (120 s).
"""

from __future__ import annotations

import os

import pytest

from tests.faults import nemesis
from tests.faults.harness import report

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_random_faults_from_a_seed_break_no_guarantee(tmp_path, record_property):
    seed = int(os.environ.get("DU_NEMESIS_SEED") or nemesis.fresh_seed())
    settings = nemesis.Settings(seconds=float(os.environ.get("DU_NEMESIS_SECONDS") or 120), seed=seed)
    record_property("nemesis", f"seed={seed}, replay: {settings.replay()}")
    problems, figures = nemesis.run(settings, tmp_path, say=report)
    summary = nemesis.summary(problems, figures)
    record_property("nemesis", summary.splitlines()[0])
    report(summary)
    assert not problems, (f"nemesis seed {seed} found {len(problems)} violations (replay: {settings.replay()}; "
                          f"histories in {tmp_path}):\n" + "\n".join(problems[:20]))

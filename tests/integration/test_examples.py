"""Every script in examples/ runs to success, so the examples cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REDIS_URL

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(script: Path, tmp_path: Path) -> None:
    # The checkout's own package, not whichever one is installed (a worktree beside an editable install).
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": REDIS_URL,
           "DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.stdout.strip(), "an example should show what it does"

"""The framework examples run to success in one command each, on PostgreSQL (tests/integration/test_examples.py
runs the single-file ones)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PG_URL, REDIS_URL

ROOT = Path(__file__).parents[3]


@pytest.mark.parametrize("project", ["django_project", "fastapi_sqlalchemy"])
def test_example_project_runs(project: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": REDIS_URL, "DATABASE_URL": PG_URL}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / project / "run.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "rolled its order and job back: 1 order, 1 job" in done.stdout
    if project == "fastapi_sqlalchemy":  # and the repeat, committed with session.commit()
        assert "published at session.commit()" in done.stdout and "invoiced = [True, True]" in done.stdout
    else:
        assert "invoiced = True" in done.stdout

"""Running the command line in-process: ``run([...])`` returns (exit code, stdout, stderr)."""

from __future__ import annotations

import io
import uuid
from typing import Callable, Optional

import pytest

from dramatiq_unique import suite as _config
from dramatiq_unique.cli import main
from dramatiq_unique.cli.context import DATABASE_ENV, PREFIX_ENV, REDIS_ENV, Context
from tests.conftest import REDIS_URL
from tests.integration.ops.conftest import scene  # noqa: F401  (the fixture, shared)

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def app(tmp_path, broker) -> str:
    """An app module (in tmp_path) whose ``broker`` is the test's, set up by the ``suite`` fixture."""
    name = f"opsapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("import dramatiq\n\nbroker = dramatiq.get_broker()\n")
    return f"{name}:broker"


@pytest.fixture
def run(tmp_path, suite, database_url, key_prefix) -> Run:
    """``run(words, env=False, answer="")``: the command line in this process, with the app (``APP`` in
    words is replaced by it) or, with ``env=True``, from the environment only; ``answer`` is what the
    operator types when a command asks."""

    def run_(words: list[str], *, env: bool = False, environ: Optional[dict] = None,
             answer: str = "") -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        variables = {DATABASE_ENV: database_url, REDIS_ENV: REDIS_URL, PREFIX_ENV: key_prefix} if env else {}
        ctx = Context(out=out, err=err, inp=io.StringIO(answer),
                      env=environ if environ is not None else variables)
        try:
            code = main([*words, "--path", str(tmp_path)], context=ctx)
        finally:
            _config.set_current(suite)  # a suite opened from the environment became the current one
        return code, out.getvalue(), err.getvalue()

    return run_

"""Real ``dramatiq`` CLI worker subprocesses for the fault tests (SIGKILL, several processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class CliWorker:
    """``python -m dramatiq <module>``: a parent process and its worker processes.

    The module reads its configuration from ``env`` (``DU_*`` variables).
    :meth:`stop` ends them all (SIGTERM, then SIGKILL); :meth:`kill_child`
    SIGKILLs one worker process.
    """

    def __init__(self, module: str, env: dict[str, str], *, processes: int = 1, threads: int = 4) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dramatiq", module, "--processes", str(processes), "--threads", str(threads),
             "--path", str(ROOT), "--worker-shutdown-timeout", "5000"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )

    def children(self) -> list[int]:
        try:
            with open(f"/proc/{self.process.pid}/task/{self.process.pid}/children") as f:
                return [int(pid) for pid in f.read().split()]
        except OSError:
            return []

    def kill_child(self, pid: int) -> None:
        if pid in self.children():  # only a worker process this object started
            os.kill(pid, signal.SIGKILL)

    def stop(self, timeout: float = 15.0) -> str:
        """Stop the workers; returns their stderr."""
        children = self.children()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            _, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, err = self.process.communicate(timeout=5)
        for pid in children:  # a worker process left behind by a killed parent
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return err or ""


def setup_from_env() -> None:
    """In a worker subprocess: the broker and suite that a :class:`CliWorker`'s ``DU_*`` variables describe."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    import dramatiq_unique

    broker = RedisBroker(url=os.environ["DU_REDIS_URL"], namespace=os.environ["DU_NAMESPACE"])
    dramatiq.set_broker(broker)
    dramatiq_unique.setup(
        broker,
        database=os.environ["DU_DATABASE_URL"],
        redis=os.environ["DU_REDIS_URL"],
        key_prefix=os.environ["DU_KEY_PREFIX"],
        redriver=False,
    )

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

    def __init__(self, module: str, env: dict[str, str], *, processes: int = 1, threads: int = 4,
                 stderr_path: "str | os.PathLike[str] | None" = None, prefix: "list[str] | None" = None,
                 gevent: bool = False) -> None:
        # A pipe nobody reads until stop() fills up and blocks a worker that logs much (a fault
        # test's workers do): with ``stderr_path`` the log goes to that file instead.
        self.stderr_path = stderr_path
        self._stderr_file = open(stderr_path, "a") if stderr_path is not None else None
        # ``prefix``: a command that execs the worker, e.g. ``ip netns exec <name>`` (the pid stays the worker's).
        self.process = subprocess.Popen(
            # ``gevent``: Dramatiq's own dramatiq-gevent script (installed beside this Python), greenlets for threads.
            [*(prefix or []), *([str(Path(sys.executable).with_name("dramatiq-gevent"))] if gevent
                                else [sys.executable, "-m", "dramatiq"]), module, "--processes", str(processes),
             "--threads", str(threads), "--path", str(ROOT), "--worker-shutdown-timeout", "5000"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdout=subprocess.DEVNULL,
            stderr=self._stderr_file if self._stderr_file is not None else subprocess.PIPE, text=True,
        )

    def children(self) -> list[int]:
        try:
            with open(f"/proc/{self.process.pid}/task/{self.process.pid}/children") as f:
                return [int(pid) for pid in f.read().split()]
        except OSError:
            return []

    def kill_child(self, pid: int) -> None:
        self.signal_child(pid, signal.SIGKILL)

    def signal_child(self, pid: int, sig: int) -> bool:
        """Send ``sig`` to worker process ``pid`` if it is one this object started; True if sent."""
        if pid in self.children():
            os.kill(pid, sig)
            return True
        return False

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
        if self._stderr_file is not None:
            self._stderr_file.close()
            with open(self.stderr_path) as f:
                err = f.read()
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

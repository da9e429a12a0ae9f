"""The nemesis's history: what every process saw, in a file of its own that no fault can touch.

Each process (the runner, every `dramatiq` worker process) appends JSON lines to
``<dir>/h-<pid>-<nonce>.jsonl`` and fsyncs each one before it goes on: a SIGKILL loses
nothing already written, a frozen process writes nothing until it resumes, and neither
Redis nor PostgreSQL is on the path (the fault suite's Redis event log dies with the
Redis the nemesis kills).

Every event carries ``t``, ``time.monotonic()``: CLOCK_MONOTONIC, one clock for every
process of the machine, so events of different processes compare; the checker reads it to
order events, never to judge how close two were (tests/faults/checker.py).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator


class History:
    """This process's history file (thread-safe): :meth:`record` appends an event and fsyncs it."""

    def __init__(self, directory: "str | os.PathLike[str]") -> None:
        self.path = Path(directory) / f"h-{os.getpid()}-{uuid.uuid4().hex[:6]}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def record(self, event: str, **fields: Any) -> float:
        """Append ``event`` with ``fields`` (and ``pid``, ``tid``, ``t``); returns its ``t``."""
        fields.setdefault("pid", os.getpid())
        fields.setdefault("tid", threading.get_ident())
        with self._lock:
            t = fields.setdefault("t", time.monotonic())
            line = json.dumps({"e": event, **fields}, separators=(",", ":")) + "\n"
            os.write(self._fd, line.encode())
            os.fsync(self._fd)
        return float(t)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def read(directory: "str | os.PathLike[str]") -> list[dict]:
    """Every event of every history file in ``directory``, by time.  A line cut short (a process
    killed while it wrote it: the write was not whole) is left out."""
    events = list(_lines(Path(directory)))
    events.sort(key=lambda e: e["t"])
    return events


def _lines(directory: Path) -> Iterator[dict]:
    for path in sorted(directory.glob("h-*.jsonl")):
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    yield json.loads(line)

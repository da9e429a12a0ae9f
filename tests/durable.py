"""Helpers for the durable-job tests: broker wipes, broker contents, re-drive passes, workers."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import socket
import subprocess
import time
from typing import Any, Iterator

import dramatiq
import redis

from dramatiq_unique.durable.redrive import CONFIRM_AFTER, RedriveCounts, redrive, run_pass


def wipe_broker(broker: Any) -> int:
    """Delete every key of a Redis broker's namespace (its queues, delay queues, unacked sets)."""
    keys = list(broker.client.scan_iter(match=f"{broker.namespace}:*", count=1000))
    if keys:
        broker.client.delete(*keys)
    return len(keys)


def pass_selects(suite: Any, broker: Any, model: Any) -> list[tuple[str, Any]]:
    """The SELECTs on ``model``'s table that one re-drive pass runs (no pass lock), as (sql, params),
    read from peewee's query log; a statement run for several pages, once."""
    seen: list[tuple[str, Any]] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.msg) if isinstance(record.msg, tuple) else None  # type: ignore
    log = logging.getLogger("peewee")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        run_pass(suite, broker)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    table = f'"{model._meta.table_name}" AS'
    selects: dict[str, Any] = {}
    for sql, params in seen:
        if sql.startswith("SELECT") and table in sql:
            selects.setdefault(sql, params)
    return list(selects.items())


def broker_messages(broker: Any, queue_name: str = "default") -> list[dict]:
    """Every message the Redis broker holds for a queue and its delay queue, decoded."""
    out = []
    for name in (queue_name, f"{queue_name}.DQ"):
        for data in broker.client.hvals(f"{broker.namespace}:{name}.msgs"):
            out.append(json.loads(data))
    return out


def passes(n: int = 2, **kwargs: Any) -> list[RedriveCounts]:
    """``n`` re-drive passes, far enough apart for a miss in one to be confirmed by the next."""
    out = []
    for i in range(n):
        if i:
            time.sleep(CONFIRM_AFTER / 1000 + 0.05)
        out.append(redrive(**kwargs))
    return out


def total(counts: list[RedriveCounts], name: str) -> int:
    return sum(getattr(c, name) for c in counts)


@contextlib.contextmanager
def running_worker(broker: Any, threads: int = 2) -> Iterator[dramatiq.Worker]:
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=threads)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(timeout=10_000)


_handed_out: set[int] = set()


def free_port() -> int:
    """A free port below the kernel's ephemeral range, never handed out twice in one run.

    A port from the ephemeral range (``bind(0)``) can be taken as the source port of any
    outgoing connection while a test's server is down, and the server then cannot come back
    on it. Each pytest-xdist worker draws from its own band, so two workers never race; the
    search starts at a random place in it, so that a child process rarely meets its parent.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    band = int(worker[2:]) % 8 if worker[2:].isdigit() else 0
    first, start = 16_000 + band * 2_000, random.randrange(2_000)
    for port in (first + (start + i) % 2_000 for i in range(2_000)):
        if port in _handed_out:
            continue
        _handed_out.add(port)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port left in {first}..{first + 1_999}")


class RedisServer:
    """A throwaway redis-server on a spare port, without persistence: stopping it loses everything."""

    def __init__(self, port: int = 0) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        binary = shutil.which("redis-server")
        assert binary, "redis-server is needed on PATH"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError as e:
                if time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"redis-server on port {self.port} did not start") from e
                time.sleep(0.02)
        client.close()
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


def env_for_children(**values: str) -> dict[str, str]:
    return {**os.environ, **values}


def bulk_insert_pg(
    model: Any, n: int, *, status: str, prefix: str, actor_name: str = "report", due_ago: str = "1 second",
    broker_ref: bool = False,
) -> None:
    """Insert ``n`` rows in one statement with PostgreSQL's generate_series (for benchmarks and plans).

    Finished rows finished half an hour ago; waiting ones were due ``due_ago``; with
    ``broker_ref`` each names a broker message that does not exist.
    """
    finished = status in ("succeeded", "failed")
    now = "(now() at time zone 'utc')"
    values = {
        "message_id": f"'{prefix}-' || g",
        "actor_name": f"'{actor_name}'",
        "queue_name": "'default'",
        "args": "'[]'",
        "kwargs": "'{}'",
        "options": "'{}'",
        "status": f"'{status}'",
        "attempts": "1" if finished else "0",
        "revision": "0",
        "fencing_token": "1" if finished else "0",
        "created_at": f"{now} - interval '1 hour'",
        "enqueued_at": f"{now} - interval '1 hour'" if status != "pending" else "NULL",
        "process_after": f"{now} - interval '{due_ago}'",
        "started_at": f"{now} - interval '40 minutes'" if finished else "NULL",
        "finished_at": f"{now} - interval '30 minutes'" if finished else "NULL",
    }
    if broker_ref:
        values["broker_ref"] = f"'{prefix}-gone-' || g"
    for field in model._meta.sorted_fields:
        if field.name in values or field.name == "id" or field.null:
            continue
        default = field.default
        assert isinstance(default, (int, str)) and not isinstance(default, bool), f"no bulk value for {field.name}"
        values[field.name] = str(default) if isinstance(default, int) else f"'{default}'"
    columns = ", ".join(f'"{model._meta.fields[name].column_name}"' for name in values)
    table = model._meta.table_name
    model._meta.database.execute_sql(
        f'INSERT INTO "{table}" ({columns}) SELECT {", ".join(values.values())} FROM generate_series(1, {int(n)}) AS g'
    )

"""Sending while the broker is down: the sends return, the jobs wait in the job table.

    python examples/broker_down.py

Starts a throwaway ``redis-server`` on a spare port as the broker (the
suite's locks stay on REDIS_URL, default redis://127.0.0.1:6379/0, under
a key prefix of its own), stops it, and sends five jobs and a duplicate of
a unique one: with ``on_broker_down="defer"`` (the default) every send
returns and the rows wait ``pending``.  Redis comes back, empty; a worker
starts, its re-drive (every 250 ms here) publishes the backlog, and every
job runs once.  The job table is SQLite in a temporary folder unless
DATABASE_URL is set.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique

DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{tempfile.mkdtemp()}/jobs.db"
LOCKS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
PREFIX = f"example-down-{uuid.uuid4().hex[:8]}"
logging.basicConfig(level=logging.WARNING, format="  log: %(levelname)s %(message)s")
logging.getLogger("dramatiq_unique.durable.deferral").setLevel(logging.INFO)  # the outage and the backlog


class OwnRedis:
    """A redis-server without persistence on a spare port."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url, self.proc = f"redis://127.0.0.1:{self.port}/0", None

    def start(self) -> None:
        binary = shutil.which("redis-server") or sys.exit("this example needs redis-server on PATH")
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client, deadline = redis.Redis.from_url(self.url), time.monotonic() + 10
        while not _pings(client):
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


own = OwnRedis()
own.start()
broker = RedisBroker(url=own.url, namespace=PREFIX)
dramatiq.set_broker(broker)
suite = dramatiq_unique.setup(broker, database=DATABASE_URL, redis=LOCKS_URL, key_prefix=PREFIX, redrive_interval=250)
done: list[str] = []


@dramatiq.actor(track=True)
def send_receipt(order: int) -> None:
    done.append(f"receipt {order}")


@dramatiq.actor(unique_args=["account"])
def sync_account(account: str) -> None:
    done.append(f"sync {account}")


def main() -> int:
    try:
        own.stop()
        print("The broker's Redis is down. Sending:")
        messages = [send_receipt.send(n) for n in (1, 2, 3)] + [sync_account.send("acme"), sync_account.send("zed")]
        duplicate = sync_account.send("acme")
        print(f"  the duplicate resolves to the waiting job: {duplicate.message_id == messages[3].message_id}")
        for m in messages:
            job = dramatiq_unique.get_job(m.message_id)
            print(f"  {m.actor_name}{m.args or tuple(m.kwargs.values())}: {job.status.value}")
        own.start()
        print("The broker's Redis is back, empty; a worker starts, with its re-drive:")
        worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=2)
        worker.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
            dramatiq_unique.get_job(m.message_id).status == "succeeded" for m in messages
        ):
            time.sleep(0.1)
        worker.stop()
    finally:
        broker.close()
        own.stop()
        keys = list(redis.Redis.from_url(LOCKS_URL).scan_iter(match=f"*{PREFIX}*"))
        if keys:
            redis.Redis.from_url(LOCKS_URL).delete(*keys)
    statuses = [dramatiq_unique.get_job(m.message_id).status.value for m in messages]
    print(f"  statuses: {statuses}")
    print(f"  done: {sorted(done)}")
    ok = statuses == ["succeeded"] * 5 and len(done) == 5
    print("every job sent while the broker was down ran once" if ok else "SOMETHING WENT WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

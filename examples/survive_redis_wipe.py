"""Redis restarts without its data: the queued jobs are gone from the broker, not from the job table.

    python examples/survive_redis_wipe.py

Three invoice jobs are sent (one of them delayed), then Redis is wiped
before any worker ran them.  A worker starts; its re-drive (started after
boot, every 250 ms here) looks each job's message up in the broker, misses
it in two passes, and sends it again.  Every invoice is sent exactly once.

Runs its own throwaway ``redis-server`` on a spare port (so the wipe is a
real restart without persistence, and touches nobody else's data).  If
there is no redis-server on PATH, it uses REDIS_URL (default
redis://127.0.0.1:6379/0) under its own key prefix and deletes only those
keys.  The job table is SQLite in a temporary folder unless DATABASE_URL is set.
"""

from __future__ import annotations

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
RUN = uuid.uuid4().hex[:8]


class OwnRedis:
    """A redis-server without persistence on a spare port: stopping it loses everything."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError as e:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from e
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


own = OwnRedis() if shutil.which("redis-server") else None
if own is not None:
    own.start()
    REDIS_URL = own.url
else:
    REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
PREFIX = f"example-wipe-{RUN}"

broker = RedisBroker(url=REDIS_URL, namespace=PREFIX)
dramatiq.set_broker(broker)
suite = dramatiq_unique.setup(
    broker, database=DATABASE_URL, redis=REDIS_URL, key_prefix=PREFIX,
    lost_after=500,  # a message missing 0.5 s after it was due counts as lost (default: 60 s)
    redrive_interval=250,  # a pass every 0.25 s (default: 5 s)
)

sent_invoices: list[int] = []


@dramatiq.actor(track=True)
def send_invoice(customer_id: int) -> str:
    sent_invoices.append(customer_id)
    return f"invoice sent to customer {customer_id}"


def wipe_redis() -> None:
    if own is not None:
        own.stop()  # Redis dies; it had no persistence ...
        own.start()  # ... and comes back empty
        return
    client = redis.Redis.from_url(REDIS_URL)
    for pattern in (f"{PREFIX}*", f"redlock:{PREFIX}*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)


def show(messages, title: str) -> None:
    print(title)
    for m in messages:
        job = dramatiq_unique.get_job(m.message_id)
        print(f"  job {job.id}: {job.status:<9} attempts={job.attempts} revision={job.revision} {job.result or ''}")


def main() -> int:
    started = time.monotonic()
    messages = [send_invoice.send(1), send_invoice.send(2), send_invoice.send_with_options(args=(3,), delay=1000)]
    client = redis.Redis.from_url(REDIS_URL)
    in_broker = len(list(client.scan_iter(match=f"{PREFIX}:*.msgs")))
    show(messages, f"Sent 3 jobs ({in_broker} message hashes in Redis):")

    wipe_redis()
    print(f"Redis wiped: {len(list(client.scan_iter(match=f'{PREFIX}:*')))} broker keys left.")

    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()  # ... and with it the re-drive
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            jobs = [dramatiq_unique.get_job(m.message_id) for m in messages]
            if all(job.status in ("succeeded", "failed") for job in jobs):
                break
            time.sleep(0.1)
    finally:
        worker.stop()
        broker.close()
        suite.db.close()
        if own is not None:
            own.stop()
        else:
            wipe_redis()
    show(messages, f"After {time.monotonic() - started:.1f} s, with a worker and its re-drive:")
    print(f"invoices sent: {sorted(sent_invoices)}")
    ok = all(job.status == "succeeded" and job.revision == 1 for job in jobs) and sorted(sent_invoices) == [1, 2, 3]
    print("every job survived the wipe and ran once" if ok else "SOMETHING WENT WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""A user presses refresh ten times: one report job is made, and it runs once.

    python examples/dedupe_reports.py

Uses the embedded default job table (SQLite, in a temporary folder unless
DATABASE_URL is set) and the local Redis (REDIS_URL, default
redis://127.0.0.1:6379/0) as both broker and lock store.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid

import dramatiq
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{tempfile.mkdtemp()}/jobs.db"
# Own key namespace per run, so runs never see each other's jobs.
RUN = uuid.uuid4().hex[:8]

broker = RedisBroker(url=REDIS_URL, namespace=f"example-{RUN}")
suite = dramatiq_unique.setup(broker, database=DATABASE_URL, redis=REDIS_URL, key_prefix=f"example-{RUN}")
dramatiq.set_broker(broker)

runs = []


@dramatiq.actor(unique_args=["user_id"], unique_lock="until_executed")
def build_report(user_id: int, requested_at: float) -> dict:
    runs.append(user_id)
    time.sleep(0.2)  # an expensive query
    return {"user_id": user_id, "rows": 1234}


def main() -> int:
    # Ten clicks on "refresh": ten sends, each with its own timestamp.
    messages = [build_report.send(7, requested_at=time.time()) for _ in range(10)]
    ids = {m.message_id for m in messages}
    print(f"10 sends -> {len(ids)} job: {ids.pop()}")

    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        deadline = time.monotonic() + 15
        job = dramatiq_unique.get_job(messages[0].message_id)
        while job.status not in ("succeeded", "failed") and time.monotonic() < deadline:
            time.sleep(0.05)
            job = dramatiq_unique.get_job(messages[0].message_id)
    finally:
        worker.stop()
        broker.flush_all()
    print(f"job {job.id}: {job.status}, attempts={job.attempts}, result={job.result}")
    print(f"the report was built {len(runs)} time(s)")
    return 0 if job.status == "succeeded" and len(runs) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())

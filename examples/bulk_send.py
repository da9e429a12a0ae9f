"""Send 5,000 welcome e-mails in one call; a second call with overlapping users sends only the new ones;
a third, inside transaction(), is published only when its block commits (in batches), and a block
that rolls back sends nothing.

    python examples/bulk_send.py

Uses the embedded default job table (SQLite, in a temporary folder unless DATABASE_URL is set)
and the local Redis (REDIS_URL, default redis://127.0.0.1:6379/0) as both broker and lock store.
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
RUN = uuid.uuid4().hex[:8]  # own key namespace per run

broker = RedisBroker(url=REDIS_URL, namespace=f"example-{RUN}")
suite = dramatiq_unique.setup(broker, database=DATABASE_URL, redis=REDIS_URL, key_prefix=f"example-{RUN}")
dramatiq.set_broker(broker)


@dramatiq.actor(unique_args=["user_id"], unique_window=3_600_000)  # one welcome per user an hour
def welcome(user_id: int, plan: str = "free") -> None:
    pass


@dramatiq.actor(track=True)
def invoice(order_id: int) -> None:
    pass


def in_transaction() -> tuple[int, int]:
    """Invoices sent with the caller's writes: (jobs published after the commit, rows a rollback left)."""
    queue = f"{broker.namespace}:default"
    before = broker.client.llen(queue)
    with dramatiq_unique.transaction():
        sent = dramatiq_unique.send_many(invoice, [(order_id,) for order_id in range(2_500)])
        held = broker.client.llen(queue) - before  # nothing published inside the block
    published = broker.client.llen(queue) - before
    print(f"{len(sent)} invoices in a transaction: {held} published inside the block, {published} after its commit")
    try:
        with dramatiq_unique.transaction():
            dramatiq_unique.send_many(invoice, [(order_id,) for order_id in range(2_500, 3_000)])
            raise RuntimeError("the order failed")
    except RuntimeError:
        pass
    left = dramatiq_unique.JobModel.select().where(dramatiq_unique.JobModel.actor_name == "invoice").count() - 2_500
    print(f"a rolled-back block: {left} rows left, {broker.client.llen(queue) - before - published} published")
    return published - held, left


def main() -> int:
    started = time.perf_counter()
    first = dramatiq_unique.send_many(welcome, [(user_id,) for user_id in range(5_000)])
    print(f"5000 items -> {len({m.message_id for m in first})} jobs in {time.perf_counter() - started:.2f} s")
    # users 4000-5999: the first 1000 already have a job, which their items resolve to
    second = dramatiq_unique.send_many(welcome, [{"user_id": u, "plan": "pro"} for u in range(4_000, 6_000)])
    reused = sum(a.message_id == b.message_id for a, b in zip(first[4_000:], second, strict=False))
    print(f"2000 more items -> {len({m.message_id for m in second}) - reused} new jobs, {reused} resolved to existing")
    jobs = dramatiq_unique.JobModel.select().count()
    queued = broker.client.llen(f"{broker.namespace}:default")
    print(f"{jobs} job rows, {queued} messages queued")
    outbox = in_transaction()
    broker.flush_all()
    return 0 if (jobs, queued, reused, outbox) == (6_000, 6_000, 1_000, (2_500, 0)) else 1


if __name__ == "__main__":
    sys.exit(main())

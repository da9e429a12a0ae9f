"""A long job walks a tree and calls heartbeat() at every node.

    python examples/tree_walk.py

The job's lease (``unique_ttl``) is one second; the walk takes about four,
so without heartbeat() its lock would lapse and a second walk of the same
tree could start beside it.  With heartbeat() the lock holds: a second walk
sent meanwhile waits (parked, holding no worker thread) and starts the
moment the first ends.  Each walk writes its results with its fencing token,
so a write from an older walk can never overwrite a newer one's.

Uses SQLite for the job table (in a temporary folder unless DATABASE_URL is
set) and the local Redis (REDIS_URL, default redis://127.0.0.1:6379/0).
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
import time
import uuid

import dramatiq
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import current_job, heartbeat

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
FOLDER = tempfile.mkdtemp()
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{FOLDER}/jobs.db"
RUN = uuid.uuid4().hex[:8]  # own key namespace per run

broker = RedisBroker(url=REDIS_URL, namespace=f"example-{RUN}")
suite = dramatiq_unique.setup(broker, database=DATABASE_URL, redis=REDIS_URL, key_prefix=f"example-{RUN}")
dramatiq.set_broker(broker)

# The job's own storage: a search index where every write carries the writer's
# fencing token, and a write with an older token than the stored one is refused.
INDEX = f"{FOLDER}/index.db"
UPSERT = """
INSERT INTO search_index (node, summary, fencing_token) VALUES (?, ?, ?)
ON CONFLICT (node) DO UPDATE SET summary = excluded.summary, fencing_token = excluded.fencing_token
WHERE excluded.fencing_token >= search_index.fencing_token
"""

walks: list[dict] = []


def children(node: str, depth: int, fanout: int) -> list[str]:
    return [] if node.count(".") >= depth else [f"{node}.{i}" for i in range(fanout)]


@dramatiq.actor(unique_args=["root"], unique_lock="until_and_while_executing", unique_ttl=1_000)
def index_tree(root: str, depth: int = 4, fanout: int = 3, per_node_ms: int = 30) -> int:
    token = current_job().fencing_token
    walk = {"token": token, "start": time.monotonic(), "nodes": 0, "least_left": float("inf")}
    walks.append(walk)
    db = sqlite3.connect(INDEX)
    stack = [root]
    while stack:
        node = stack.pop()
        time.sleep(per_node_ms / 1000)  # the work for one node
        with db:
            db.execute(UPSERT, (node, f"indexed by walk {token}", token))
        walk["nodes"] += 1
        # Renew the lease; raises LockLost if it lapsed, and then we must stop.
        walk["least_left"] = min(walk["least_left"], heartbeat())
        stack.extend(children(node, depth, fanout))
    db.close()
    walk["end"] = time.monotonic()
    return walk["nodes"]


def wait_for(message, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = dramatiq_unique.get_job(message.message_id)
        if job.status in ("succeeded", "failed"):
            return job
        time.sleep(0.05)
    raise SystemExit(f"job {message.message_id} did not finish")


def main() -> int:
    with sqlite3.connect(INDEX) as db:
        db.execute("CREATE TABLE search_index (node TEXT PRIMARY KEY, summary TEXT, fencing_token INTEGER)")
    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=4)
    worker.start()
    try:
        first = index_tree.send("docs")
        while not walks:
            time.sleep(0.02)
        second = index_tree.send("docs")  # the tree changed again: walk it once more after this walk
        third = index_tree.send("docs")  # and again: the waiting walk covers it
        time.sleep(0.2)
        waiting = dramatiq_unique.get_job(second.message_id)
        print(f"walk 1 running; walk 2 is {waiting.status} (waits on {waiting.parked_on!r}); "
              f"walk 3 was {'merged into walk 2' if third.message_id == second.message_id else 'sent'}")
        jobs = [wait_for(first), wait_for(second)]
    finally:
        worker.stop()
        broker.flush_all()

    for job, walk in zip(jobs, walks, strict=False):
        print(f"walk {job.id}: {job.status}, {walk['nodes']} nodes in {walk['end'] - walk['start']:.1f}s "
              f"with a 1.0s lease, heartbeat() left at least {walk['least_left']:.2f}s, "
              f"fencing token {job.fencing_token}")
    gap = walks[1]["start"] - walks[0]["end"]
    print(f"walk 2 started {gap * 1000:.0f} ms after walk 1 ended")

    # A stalled walk 1 waking up now and writing with its old token is refused.
    with sqlite3.connect(INDEX) as db:
        db.execute(UPSERT, ("docs", "stale write from walk 1", walks[0]["token"]))
        summary, token = db.execute("SELECT summary, fencing_token FROM search_index WHERE node = 'docs'").fetchone()
    print(f"index entry 'docs' after a stale write with token {walks[0]['token']}: {summary!r} (token {token})")

    ok = (
        [j.status for j in jobs] == ["succeeded", "succeeded"]
        and third.message_id == second.message_id
        and gap >= 0
        and all(w["end"] - w["start"] > 3 * 1.0 for w in walks)
        and token == walks[1]["token"] > walks[0]["token"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

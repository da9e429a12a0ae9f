"""Single sends from one producer against the physical floor, on PostgreSQL.

    python tests/benchmarks/bench_send.py [--jobs 2000] [--rounds 5]

Times, in turn within each round, one producer thread sending distinct no-op
jobs one by one:

* ``plain``: plain Dramatiq's ``send`` (Redis broker);
* ``tracked``: a ``track=True`` actor (a job row, then the publish);
* ``unique``: ``unique_args=["i"], unique_lock="until_executing"`` on distinct keys
  (a row holding the key, its queue lock, then the publish);
* ``floor``: the physical floor of a tracked send: one ``INSERT ... RETURNING``
  round trip (psycopg2, prepared, autocommit, into a table of three text columns
  and a bigserial key) plus one ``LPUSH`` (redis-py) of a message-sized value;
* ``floor: INSERT`` and ``floor: LPUSH``: each alone;
* ``our INSERT``: the suite's own INSERT of a tracked send's row (prepared, into the
  job table with its indexes), alone.

Prints the median microseconds per send of the rounds and each kind's ratio of
speed to plain Dramatiq (sends per second, ours / plain), median and range; and the
producer thread's CPU per send (thread time), which a loaded machine moves less.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from typing import Callable
from urllib.parse import unquote

import dramatiq
import psycopg2
import redis
from common import PG, REDIS_URL, pg_database, rig

from dramatiq_unique import JobModel
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobStatus, utcnow


def senders(url: str) -> tuple[dict[str, Callable[[int], object]], Callable[[], None]]:
    """The kinds, each a function sending job ``i``; and a cleanup."""
    ns, broker, suite = rig(url)

    @dramatiq.actor(queue_name="plain")
    def plain(i):
        pass

    @dramatiq.actor(queue_name="tracked", track=True)
    def tracked(i):
        pass

    @dramatiq.actor(queue_name="unique", unique_args=["i"], unique_lock="until_executing")
    def unique(i):
        pass

    schema = unquote(url).split("search_path=")[1]
    conn = psycopg2.connect(dbname=PG["database"], host=PG["host"], user=PG["user"], options=f"-csearch_path={schema}")
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("CREATE TABLE floor (id bigserial PRIMARY KEY, message_id text, actor_name text, args text)")
    cur.execute("PREPARE floor_insert AS INSERT INTO floor (message_id, actor_name, args) VALUES ($1, $2, $3)"
                " RETURNING id")
    client = redis.Redis.from_url(REDIS_URL)
    body = b"x" * len(plain.message(0).encode())  # a message's size

    def floor_insert(i: int) -> None:
        cur.execute("EXECUTE floor_insert (%s, %s, %s)", (uuid.uuid4().hex, "floor", f"[{i}]"))
        cur.fetchone()

    def floor_lpush(i: int) -> None:
        client.lpush(f"{ns}:floor", body)

    def floor(i: int) -> None:
        floor_insert(i)
        floor_lpush(i)

    def our_insert(i: int) -> None:
        # The fields a tracked send writes (unique/enqueue.py: row_fields), without the publish.
        now = utcnow()
        jobs.adopt(JobModel, {
            "app": suite.settings.key_prefix, "message_id": uuid.uuid4().hex, "actor_name": "tracked",
            "queue_name": "tracked", "args": [i], "kwargs": {}, "options": {"_du": {}},
            "status": JobStatus.QUEUED.value, "created_at": now, "enqueued_at": now, "process_after": now,
            "broker_ref": uuid.uuid4().hex,
        })

    kinds: dict[str, Callable[[int], object]] = {
        "plain": plain.send, "tracked": tracked.send, "unique": unique.send, "floor": floor,
        "floor: INSERT": floor_insert, "floor: LPUSH": floor_lpush, "our INSERT": our_insert,
    }

    def close() -> None:
        broker.flush_all()
        client.delete(f"{ns}:floor")
        client.close()
        conn.close()
        suite.close()

    return kinds, close


def bench(url: str, args: argparse.Namespace) -> None:
    kinds, close = senders(url)
    micros: dict[str, list[float]] = {kind: [] for kind in kinds}
    cpu: dict[str, list[float]] = {kind: [] for kind in kinds}
    ratios: dict[str, list[float]] = {kind: [] for kind in kinds}
    sent = 10_000_000
    try:
        for _ in range(args.rounds):
            timed, used = {}, {}
            for kind, send in kinds.items():
                for i in range(50):  # warm: connections open, statements prepared
                    send(sent + i)
                sent += 50
                start, started = time.perf_counter(), time.thread_time()
                for i in range(args.jobs):
                    send(sent + i)
                timed[kind] = (time.perf_counter() - start) / args.jobs
                used[kind] = (time.thread_time() - started) / args.jobs
                sent += args.jobs
            for kind, secs in timed.items():
                micros[kind].append(secs * 1e6)
                cpu[kind].append(used[kind] * 1e6)
                ratios[kind].append(timed["plain"] / secs)
    finally:
        close()
    print(f"{'kind':<16}{'us/send':>9}  {'speed vs plain, median (range)':<32}{'producer CPU us/send':>21}")
    for kind in kinds:
        r = ratios[kind]
        us = statistics.median(micros[kind])
        speed = f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})"
        print(f"{kind:<16}{us:>9.0f}  {speed:<32}{statistics.median(cpu[kind]):>21.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')} UTC, {os.cpu_count()} cores, PostgreSQL, {args.jobs} sends x "
          f"{args.rounds} rounds, one producer")
    with pg_database() as url:
        bench(url, args)


if __name__ == "__main__":
    main()

"""The app that ``bench_worker.py``'s real ``dramatiq`` workers load: ``dramatiq worker_app``.

Set up from the environment: ``BW_REDIS_URL``, ``BW_NAMESPACE`` (the broker's and the suite's key
prefix) and ``BW_DATABASE_URL``.  Three no-op actors, one queue each, as in ``bench_throughput.py``:
``plain`` (no options), ``tracked`` (``track=True``) and ``unique`` (``unique_args=["i"]``,
``unique_lock="until_executing"``: a queue lock per job, released when it starts); and ``floor``,
an untracked actor that makes, with psycopg2 on a connection of its thread's own, the two statements
a tracked job's promise costs the database (its start's UPDATE, prepared, then its outcome's) on a
row the benchmark inserted: plain Dramatiq plus the database's share and nothing else of ours, the
ceiling of what ``tracked`` could reach on the same machine; and ``floor8``, the same two statements
each written for :data:`BATCH` rows at once by every BATCH-th job of a thread (``--ceiling``).  Imported
without ``BW_DATABASE_URL`` (by the benchmark itself, after its own ``setup()``), it only declares
the actors on the current broker.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
from typing import Any

import dramatiq

# The start and outcome of a tracked job's first attempt, as queries.sql has them on PostgreSQL
# (start_attempt; update_fenced_with_history), with fixed values where the worker's vary.
FLOOR_START = (
    'UPDATE "dramatiq_unique_jobs" SET "status" = \'running\', "attempts" = "attempts" + 1, "started_at" = $2, '
    '"lease_until" = $3, "worker" = $4, "fencing_token" = COALESCE(NULL, "fencing_token" + 1), "parked_on" = NULL, '
    '"unique_hold" = "unique_hold" WHERE "id" = $1 AND "revision" = 0 AND "status" NOT IN (\'succeeded\', \'failed\') '
    'AND ("status" <> \'running\' OR "lease_until" IS NULL OR "lease_until" <= $2 OR "worker" LIKE \'\') '
    'RETURNING "message_id", "actor_name", "attempts", "unique_key", "fencing_token", "checkpoints"'
)
FLOOR_FINISH = (
    'UPDATE "dramatiq_unique_jobs" SET "status" = \'succeeded\', "finished_at" = $3, "result" = NULL, '
    '"last_error" = NULL, "lease_until" = NULL, "history" = CASE WHEN "history" IS NULL THEN \'[\' || $4 || \']\' '
    'ELSE "history" END WHERE "id" = $1 AND "fencing_token" = $2'
)
# The same two statements over BATCH rows at once, each of a thread's BATCH-th floor8 job: what group
# commit could reach at best (no wait for company, no per-row values), a ceiling, not a design.
BATCH = 8
BATCH_START = (
    'UPDATE "dramatiq_unique_jobs" SET "status" = \'running\', "attempts" = "attempts" + 1, "started_at" = $1, '
    '"lease_until" = $2, "worker" = $3, "fencing_token" = "fencing_token" + 1, "parked_on" = NULL '
    'WHERE "id" IN ({ids}) AND "revision" = 0 AND "status" NOT IN (\'succeeded\', \'failed\') '
    'RETURNING "id", "fencing_token"'
)
BATCH_FINISH = (
    'UPDATE "dramatiq_unique_jobs" SET "status" = \'succeeded\', "finished_at" = $1, "result" = NULL, '
    '"last_error" = NULL, "lease_until" = NULL, "history" = \'[\' || $2 || \']\' '
    'WHERE "id" IN ({ids}) AND "fencing_token" > 0'
)
_floor = threading.local()


def _floor_cursor() -> Any:
    cursor = getattr(_floor, "cursor", None)
    if cursor is None:
        import psycopg2

        dsn, _, options = os.environ["BW_DATABASE_URL"].partition("?options=")
        conn = psycopg2.connect(dsn, options=options.replace("%3D", "="))
        conn.autocommit = True
        cursor = _floor.cursor = conn.cursor()
        cursor.execute(f"PREPARE floor_start AS {FLOOR_START}")
        cursor.execute(f"PREPARE floor_finish AS {FLOOR_FINISH}")
        cursor.execute("PREPARE batch_start AS " + BATCH_START.format(ids=_params(4)))
        cursor.execute("PREPARE batch_finish AS " + BATCH_FINISH.format(ids=_params(3)))
        _floor.batch = []
    return cursor


def _params(first: int) -> str:
    return ", ".join(f"${i}" for i in range(first, first + BATCH))


#: The ``EXECUTE`` marks of a batch's BATCH ids.
_IDS = ", ".join(["%s"] * BATCH)


def setup_from_env() -> None:
    from dramatiq.brokers.redis import RedisBroker

    import dramatiq_unique

    ns = os.environ["BW_NAMESPACE"]
    broker = RedisBroker(url=os.environ["BW_REDIS_URL"], namespace=ns)
    dramatiq.set_broker(broker)
    from tests.benchmarks.common import borrowed  # BENCH_BORROW=django: on Django's connections

    dramatiq_unique.setup(broker, database=borrowed(os.environ["BW_DATABASE_URL"]), redis=os.environ["BW_REDIS_URL"],
                          key_prefix=ns, redriver=False)


def declare() -> dict[str, dramatiq.Actor]:
    @dramatiq.actor(actor_name="plain", queue_name="plain")
    def plain(i: int) -> None:
        pass

    @dramatiq.actor(actor_name="tracked", queue_name="tracked", track=True)
    def tracked(i: int) -> None:
        pass

    @dramatiq.actor(actor_name="unique", queue_name="unique", unique_args=["i"], unique_lock="until_executing")
    def unique(i: int) -> None:
        pass

    @dramatiq.actor(actor_name="floor", queue_name="floor")
    def floor(i: int) -> None:
        cursor = _floor_cursor()
        now, worker = datetime.datetime.utcnow(), f"floor:{threading.get_ident()}"
        cursor.execute("EXECUTE floor_start(%s, %s, %s, %s)", (i, now, now + datetime.timedelta(seconds=60), worker))
        token = cursor.fetchone()[4]
        end = datetime.datetime.utcnow()
        entry = json.dumps({"attempt": 1, "started_at": now.isoformat(timespec="milliseconds"),
                            "finished_at": end.isoformat(timespec="milliseconds"), "status": "succeeded",
                            "error": None, "worker": worker})
        cursor.execute("EXECUTE floor_finish(%s, %s, %s, %s)", (i, token, end, entry))

    @dramatiq.actor(actor_name="floor8", queue_name="floor8")
    def floor8(i: int) -> None:
        cursor = _floor_cursor()
        _floor.batch.append(i)
        if len(_floor.batch) < BATCH:
            return
        ids, _floor.batch = _floor.batch, []
        now, worker = datetime.datetime.utcnow(), f"floor8:{threading.get_ident()}"
        cursor.execute(f"EXECUTE batch_start(%s, %s, %s, {_IDS})",
                       (now, now + datetime.timedelta(seconds=60), worker, *ids))
        cursor.fetchall()
        end = datetime.datetime.utcnow()
        entry = json.dumps({"attempt": 1, "started_at": now.isoformat(timespec="milliseconds"),
                            "finished_at": end.isoformat(timespec="milliseconds"), "status": "succeeded",
                            "error": None, "worker": worker})
        cursor.execute(f"EXECUTE batch_finish(%s, %s, {_IDS})", (end, entry, *ids))

    return {"plain": plain, "tracked": tracked, "unique": unique, "floor": floor, "floor8": floor8}


if os.environ.get("BW_DATABASE_URL"):
    setup_from_env()
    declare()

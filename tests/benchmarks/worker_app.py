"""The app that ``bench_worker.py``'s real ``dramatiq`` workers load: ``dramatiq worker_app``.

Set up from the environment: ``BW_REDIS_URL``, ``BW_NAMESPACE`` (the broker's and the suite's key
prefix) and ``BW_DATABASE_URL``.  Three no-op actors, one queue each, as in ``bench_throughput.py``:
``plain`` (no options), ``tracked`` (``track=True``) and ``unique`` (``unique_args=["i"]``,
``unique_lock="until_executing"``: a queue lock per job, released when it starts).  Imported
without ``BW_DATABASE_URL`` (by the benchmark itself, after its own ``setup()``), it only declares
the actors on the current broker.
"""

from __future__ import annotations

import os

import dramatiq


def setup_from_env() -> None:
    from dramatiq.brokers.redis import RedisBroker

    import dramatiq_unique

    ns = os.environ["BW_NAMESPACE"]
    broker = RedisBroker(url=os.environ["BW_REDIS_URL"], namespace=ns)
    dramatiq.set_broker(broker)
    dramatiq_unique.setup(broker, database=os.environ["BW_DATABASE_URL"], redis=os.environ["BW_REDIS_URL"],
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

    return {"plain": plain, "tracked": tracked, "unique": unique}


if os.environ.get("BW_DATABASE_URL"):
    setup_from_env()
    declare()

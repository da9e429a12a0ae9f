"""Functions run in child processes by the tests (importable under the spawn start method)."""

from __future__ import annotations

import time


def send_burst(args: tuple) -> list[str]:
    """Set up a suite like the parent's, wait for ``start_at``, send one key ``count`` times."""
    redis_url, namespace, database_url, key_prefix, lock, start_at, count = args
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    import dramatiq_unique

    broker = RedisBroker(url=redis_url, namespace=namespace)
    dramatiq.set_broker(broker)
    dramatiq_unique.setup(broker, database=database_url, redis=redis_url, key_prefix=key_prefix, redriver=False)

    @dramatiq.actor(actor_name="report", unique_args=["report_id"], unique_lock=lock)
    def report(report_id, n):
        pass

    time.sleep(max(0.0, start_at - time.time()))
    return [report.send(1, i).message_id for i in range(count)]


def send_many_burst(args: tuple) -> list[tuple[int, str]]:
    """Set up a suite like the parent's, wait for ``start_at``, send_many the keys ``keys``
    (batches of 100); returns (key, message id) per item."""
    redis_url, namespace, database_url, key_prefix, start_at, keys = args
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    import dramatiq_unique

    broker = RedisBroker(url=redis_url, namespace=namespace)
    dramatiq.set_broker(broker)
    dramatiq_unique.setup(broker, database=database_url, redis=redis_url, key_prefix=key_prefix, redriver=False,
                          send_many_batch=100)

    @dramatiq.actor(actor_name="bulk", unique_args=["key"], unique_window=60_000)
    def bulk(key):
        pass

    time.sleep(max(0.0, start_at - time.time()))
    return [(key, m.message_id) for key, m in zip(keys, dramatiq_unique.send_many(bulk, [(k,) for k in keys]),
                                                   strict=True)]

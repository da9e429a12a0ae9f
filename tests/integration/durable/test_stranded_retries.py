"""A retry that a live worker fetched and dropped is run all the same.

A worker keeps the delayed messages it fetched in memory, their ids in its ack set in Redis.  When
its connection breaks (here: its Redis, with an append-only file, killed and started again; in
production a Sentinel fail-over or a restart), Dramatiq's consumer starts afresh with an empty delay
queue: the worker forgets the retry, while its id stays in the ack set of a worker that is alive, so
no maintenance hands it back.  The re-drive's lost-message check found the message "present" there
for ever, and the job stayed ``retrying``; it now hands the message back to its delay queue.
"""

from __future__ import annotations

import time

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import JobModel
from dramatiq_unique.broker.refs import BrokerKeys
from tests.helpers import wait_until
from tests.servers import PrivateRedis


def test_a_retry_a_live_worker_dropped_when_its_redis_restarted_is_run(tmp_path, key_prefix):
    server = PrivateRedis(args=["--appendonly", "yes", "--appendfsync", "always", "--dir", str(tmp_path)]).start()
    worker = None
    try:
        broker = RedisBroker(url=server.url, namespace=f"{key_prefix}-broker")
        dramatiq.set_broker(broker)
        suite = dramatiq_unique.setup(broker, database=f"sqlite:///{tmp_path / 'jobs.db'}", redis=server.url,
                                      key_prefix=key_prefix, redriver=False, lost_after=300)
        runs: list[int] = []

        # A retry 2 to 4 s later (Dramatiq's jitter halves the backoff at most): long enough to be
        # fetched into the worker's delay queue before the restart, and to be held there across it.
        @dramatiq.actor(track=True, max_retries=3, min_backoff=4_000, max_backoff=4_000)
        def flaky(n):
            runs.append(n)
            if len(runs) == 1:
                raise ValueError("the first attempt fails")

        worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=2)
        worker.start()
        message = flaky.send(1)
        keys, client = BrokerKeys(broker.namespace), redis.Redis.from_url(server.url)

        def held_by_a_worker() -> bool:
            row = dramatiq_unique.get_job(message.message_id)
            if row.status != "retrying" or not row.broker_ref:
                return False
            return any(client.sismember(key, row.broker_ref)
                       for key in client.scan_iter(match=keys.acks("*", "default.DQ")))

        wait_until(held_by_a_worker, timeout=20, what="the retry in the worker's delay queue")
        client.close()
        server.stop()  # SIGKILL; the append-only file keeps every write
        time.sleep(3)  # longer than redis-py's retries: the worker's consumers see the connection break
        server.start()
        deadline = time.monotonic() + 30
        while dramatiq_unique.get_job(message.message_id).status != "succeeded":
            assert time.monotonic() < deadline, (
                f"the retry never ran: {JobModel.get(JobModel.message_id == message.message_id).status}")
            try:
                dramatiq_unique.redrive(broker)
            except dramatiq_unique.RedisUnavailable:
                pass  # the server is still loading its file
            time.sleep(0.2)
        assert runs == [1, 1]
        suite.close()
    finally:
        if worker is not None:
            worker.stop(timeout=10_000)
        server.stop()

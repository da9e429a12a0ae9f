"""The Redis broker's consumers take a socket timeout for a lost connection (dramatiq_unique.broker.consumer).

A worker reaches Redis through a proxy (tests/proxy.py) that the test stalls while a job runs and a delayed job
waits: the job's ack, and the consumers' fetches, time out.  With Dramatiq 2.2's consumers the ack's error was
logged as a bug in Dramatiq and the message left unacked, and the delay queue's consumer thread, whose requeue of
the delayed job after the error timed out too, ended: the worker took no delayed job again.
"""

from __future__ import annotations

import threading
import time

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from redis.backoff import NoBackoff
from redis.retry import Retry

import dramatiq_unique
from dramatiq_unique.broker.consumer import LostOnTimeout
from dramatiq_unique.broker.refs import BrokerKeys
from tests.conftest import REDIS_URL
from tests.helpers import wait_until
from tests.proxy import Proxy


def test_a_worker_whose_link_stalls_as_it_acks_keeps_its_threads_and_takes_the_next_job(database_url, key_prefix):
    proxy = Proxy(6379)
    # Retries bounded, as the docs advise (redis-py 8 retries ten times, with back-off, by default).
    client = redis.Redis(port=proxy.port, socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 1))
    broker = RedisBroker(client=client, namespace=f"{key_prefix}-broker")
    suite = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix,
                                  redriver=False)
    runs: list[int] = []
    started = threading.Event()

    @dramatiq.actor(broker=broker, max_retries=0)
    def job(i: int) -> None:
        runs.append(i)
        if i == 1:
            started.set()
            time.sleep(0.3)  # its ack comes while the link is stalled

    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=1)
    try:
        job.send_with_options(args=(0,), delay=60_000)  # waits in the delay queue's consumer
        job.send(1)
        worker.start()
        assert started.wait(10)
        proxy.stall()
        time.sleep(2.0)  # the ack and the fetches time out
        proxy.flow()
        job.send(2)
        job.send_with_options(args=(3,), delay=100)
        wait_until(lambda: runs == [1, 2, 3], timeout=20, what="the next jobs")
        keys = BrokerKeys(broker.namespace)
        wait_until(lambda: broker.client.scard(keys.acks(broker.broker_id, "default")) == 0, timeout=10,
                   what="job 1's ack")
        assert all(thread.is_alive() for thread in worker.workers), "a worker thread ended"
        assert all(thread.is_alive() for thread in worker.consumers.values()), "a consumer thread ended"
        assert all(isinstance(thread.consumer, LostOnTimeout) for thread in worker.consumers.values())
    finally:
        worker.stop(timeout=5_000)
        broker.flush_all()
        broker.close()
        suite.db.close()
        proxy.close()

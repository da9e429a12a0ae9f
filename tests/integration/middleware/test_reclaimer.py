"""The Reclaimer hands back what a worker's ack set holds and the worker does not.

A fetch whose answer never reached the consumer is played by running the broker's own fetch script for the
worker's id and throwing its answer away: the messages are in the worker's ack set, in no consumer's hands.
"""

from __future__ import annotations

import threading
import time

import dramatiq
import pytest
from dramatiq.worker import ConsumerThread

import dramatiq_unique
from dramatiq_unique import JobModel, Reclaimer
from dramatiq_unique.broker.refs import BrokerKeys, dispatch
from tests.conftest import REDIS_URL
from tests.helpers import wait_until


def reclaimer_of(broker, interval: float = 100) -> Reclaimer:
    (reclaimer,) = [m for m in broker.middleware if isinstance(m, Reclaimer)]
    reclaimer.interval = interval
    return reclaimer


def test_setup_adds_one_reclaimer_first_and_keeps_it_when_called_again(suite, broker, database_url, key_prefix):
    assert isinstance(broker.middleware[0], Reclaimer)
    again = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix,
                                  redriver=False)
    try:
        assert isinstance(broker.middleware[0], Reclaimer)
        assert sum(isinstance(m, Reclaimer) for m in broker.middleware) == 1
    finally:
        again.db.close()


@pytest.mark.parametrize("track", [False, True])
def test_a_message_stranded_in_the_workers_ack_set_is_handed_back_and_runs_once(suite, broker, make_worker, track):
    """Given a message moved into the worker's ack set by a fetch whose answer was lost, When the worker
    runs, Then after two looks it is handed back to its queue and runs, once (tracked: its row succeeded)."""
    runs: list[int] = []
    reclaimer = reclaimer_of(broker)

    @dramatiq.actor(max_retries=0, **({"track": True} if track else {}))
    def job(i: int) -> None:
        runs.append(i)

    job.send(1)
    fetched = dispatch(broker, "fetch", "default", 10)  # the answer, lost
    assert len(fetched) == 1
    make_worker(2)
    wait_until(lambda: runs == [1], timeout=10, what="the stranded job to run")
    time.sleep(0.5)
    assert runs == [1] and reclaimer.handed_back == 1
    if track:
        wait_until(lambda: JobModel.get().status == "succeeded", timeout=10, what="its outcome")
    keys = BrokerKeys(broker.namespace)
    assert broker.client.scard(keys.acks(broker.broker_id, "default")) == 0


def test_messages_the_worker_holds_are_never_handed_back(suite, broker, make_worker):
    """Given one worker thread busy with slow jobs (the others wait prefetched, in its ack set), a delayed
    message waiting in its delay queue, and looks every 50 ms, Then nothing is handed back and each job
    runs once."""
    runs: list[int] = []
    lock = threading.Lock()
    reclaimer = reclaimer_of(broker, interval=50)

    @dramatiq.actor(max_retries=0, track=True)
    def slow(i: int) -> None:
        time.sleep(0.3)
        with lock:
            runs.append(i)

    for i in range(5):
        slow.send(i)
    slow.send_with_options(args=(5,), delay=1_500)
    make_worker(1)
    wait_until(lambda: len(runs) == 6, timeout=20, what="every job to run")
    time.sleep(0.3)
    assert sorted(runs) == list(range(6)) and reclaimer.handed_back == 0


def test_a_delayed_message_whose_move_to_its_queue_waits_is_not_handed_back(suite, broker, make_worker):
    """Given a delayed message that came due, When the consumer's move of it to its queue waits (a hook of
    its enqueue held up 1 s, as by a stalled database) across many looks, Then it is not handed back to its
    delay queue (out of the delay queue, it is still among the consumer's unacked messages): it is delivered
    once."""
    reclaimer = reclaimer_of(broker, interval=50)
    deliveries: list[str] = []

    class SlowPromotion(dramatiq.Middleware):
        def before_enqueue(self, broker, message, delay):
            if isinstance(threading.current_thread(), ConsumerThread):  # moving a delayed message
                time.sleep(1.0)

        def before_process_message(self, broker, message):
            deliveries.append(message.message_id)

    broker.add_middleware(SlowPromotion())

    @dramatiq.actor(max_retries=0)
    def later(i: int) -> None:
        pass

    later.send_with_options(args=(1,), delay=300)
    make_worker(2)
    wait_until(lambda: len(deliveries) == 1, timeout=10, what="the delayed job to run")
    time.sleep(1.0)
    assert len(deliveries) == 1 and reclaimer.handed_back == 0


def test_an_entry_dramatiq_cannot_read_is_left_where_it_is(suite, broker, make_worker):
    reclaimer = reclaimer_of(broker, interval=50)
    keys = BrokerKeys(broker.namespace)
    make_worker(1)
    broker.client.hset(keys.messages("default"), "garbage", b"not a message")
    broker.client.sadd(keys.acks(broker.broker_id, "default"), "garbage")
    time.sleep(0.5)
    assert reclaimer.handed_back == 0 and broker.client.sismember(keys.acks(broker.broker_id, "default"), "garbage")

"""Three Redlock masters: one down, then two, then both back.

Three ``redis-server`` processes of the test's own are the suite's Redlock
masters, made as a user may make them (``redis.Redis(host=..., port=...)``:
redis-py's defaults of 5 s timeouts and ten retries with back-off).  The broker stays on the shared
Redis; an in-process worker runs ``while_executing`` jobs over a few keys
and ``until_and_while_executing`` jobs of a key each.  Every run writes
its start and its end into a Redis list with a sequence number from the
same Redis (one order, no clocks), and the test judges from that list:

* with one master stalled (SIGSTOP), then with one down (the first: it also
  holds the wake-up flags), jobs keep flowing (the test prints their rate as a ratio to all up; the
  benchmark ``tests/benchmarks/bench_redlock.py`` measures it);
* with two down, no job starts, and a unique send raises
  ``RedisUnavailable`` (nothing is published);
* with both back, every job that waited runs, once;
* no key ever had two runs at once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Callable, Iterator

import dramatiq
import pytest
import redis

import dramatiq_unique
from dramatiq_unique import RedisUnavailable
from tests.conftest import REDIS_URL
from tests.durable import RedisServer
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

# KEYS[1] the sequence, KEYS[2] the event list; ARGV the event (JSON without its seq).
_RECORD = """
local seq = redis.call('incr', KEYS[1])
redis.call('rpush', KEYS[2], seq .. ' ' .. ARGV[1])
return seq
"""
#: Fast retries: a job refused for want of a quorum comes back within half a second.
RETRY = dict(max_retries=1_000, min_backoff=100, max_backoff=500)


class Events:
    """The runs' records, on the shared Redis under the test's key prefix."""

    def __init__(self, prefix: str) -> None:
        self.client = redis.Redis.from_url(REDIS_URL)
        self.keys = [f"{prefix}:events:seq", f"{prefix}:events"]
        self.script = self.client.register_script(_RECORD)

    def record(self, event: str, **fields) -> int:
        return int(self.script(keys=self.keys, args=[json.dumps({"event": event, **fields})]))

    def all(self) -> list[dict]:
        out = []
        for raw in self.client.lrange(self.keys[1], 0, -1):
            seq, data = raw.decode().split(" ", 1)
            out.append({"seq": int(seq), **json.loads(data)})
        return sorted(out, key=lambda e: e["seq"])

    def ended(self, jobs: set[str]) -> int:
        return sum(1 for e in self.all() if e["event"] == "end" and e["job"] in jobs)


@pytest.fixture
def masters() -> Iterator[list[RedisServer]]:
    servers = [RedisServer().start() for _ in range(3)]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def check_one_holder_per_key(events: list[dict]) -> None:
    """Each job ran once, and the runs of a key never overlap in the one order of the records."""
    open_runs: dict[str, str] = {}  # key -> job running
    starts: dict[str, int] = {}
    for e in events:
        if e["event"] == "start":
            assert e["key"] not in open_runs, f"{e['job']} started while {open_runs.get(e['key'])} held {e['key']}"
            open_runs[e["key"]] = e["job"]
            starts[e["job"]] = starts.get(e["job"], 0) + 1
        elif e["event"] == "end":
            assert open_runs.pop(e["key"]) == e["job"]
    assert not open_runs, f"runs that never ended: {open_runs}"
    assert all(n == 1 for n in starts.values()), {job: n for job, n in starts.items() if n > 1}


def test_one_master_down_jobs_flow_two_down_none_runs_both_back_all_finish(broker, sqlite_url, key_prefix,
                                                                           masters):
    events = Events(key_prefix)
    suite = dramatiq_unique.setup(
        broker, database=sqlite_url, key_prefix=key_prefix, redriver=True, redrive_interval=1_000,
        # As a user may make them: redis-py's own defaults (5 s timeouts, ten retries with back-off).
        redis=[redis.Redis(host="127.0.0.1", port=server.port) for server in masters],
    )

    def run(key: str, job: str) -> None:
        events.record("start", key=key, job=job)
        time.sleep(0.01)
        events.record("end", key=key, job=job)

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", **RETRY)
    def serial(key, n):
        run(key, f"serial-{n}")

    @dramatiq.actor(unique_args=["key"], unique_lock="until_and_while_executing", **RETRY)
    def single(key):
        run(key, key)

    sent: set[str] = set()
    message_ids: dict[str, str] = {}  # job -> message id

    def send_batch(tag: str, n: int, delay: int = 0) -> set[str]:
        batch = set()
        for i in range(n):
            name = f"{tag}-{i}"
            if i % 2:
                # Keys of the batch's own: a master that was stalled may keep, once it resumes, leases
                # its stall held up (docs/howto/execution-locks.md, "Crashes and outages"), until they expire.
                message = serial.send_with_options(args=(f"{tag}-k{i % 4}", name), delay=delay or None)
                name = f"serial-{name}"
            else:
                message = single.send_with_options(args=(name,), delay=delay or None)
            batch.add(name)
            message_ids[name] = message.message_id
        sent.update(batch)
        return batch

    refused: set[str] = set()

    def all_refused(jobs: set[str]) -> bool:
        """Whether every one of ``jobs`` was refused for want of a quorum at least once (seen
        waiting for its retry in the delay queue, RedisUnavailable in its traceback)."""
        for raw in broker.client.hvals(f"{broker.namespace}:default.DQ.msgs"):
            message = dramatiq.Message.decode(raw)
            if "RedisUnavailable" in (message.options.get("traceback") or ""):
                refused.add(message.message_id)
        return {message_ids[job] for job in jobs} <= refused

    def run_batch(tag: str, n: int, fault: Callable[[], object] = lambda: None) -> float:
        """Send ``n`` jobs, apply ``fault`` once a quarter of them ran (under load), wait for all."""
        began = time.monotonic()
        batch = send_batch(tag, n)
        wait_until(lambda: events.ended(batch) >= n // 4, timeout=20, what=f"a quarter of batch {tag}")
        fault()
        try:
            wait_until(lambda: events.ended(batch) == len(batch), timeout=20, what=f"batch {tag}")
        except AssertionError:  # say what each unfinished job waits for, and who holds its key
            done = {e["job"] for e in events.all() if e["event"] == "end"}
            for job in sorted(batch - done):
                row = dramatiq_unique.get_job(message_ids[job])
                print("unfinished:", job, row.status, row.parked_on, row.attempts, row.last_error)
                if row.parked_on:
                    name = "redlock:" + suite.keys.execution_lock(row.parked_on.split(":", 1)[1])
                    for node in suite.locks.nodes:
                        try:
                            print("  lock on a master:", node.client.get(name), node.client.pttl(name))
                        except redis.RedisError as e:
                            print("  master down:", e)
            raise
        return n / (time.monotonic() - began)

    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=4)
    worker.start()
    try:
        all_up = run_batch("up", 60)
        # One master of three stalled under load: it takes connections and never answers.
        try:
            stalled = run_batch("stalled", 60, lambda: os.kill(masters[2].proc.pid, signal.SIGSTOP))
        finally:
            os.kill(masters[2].proc.pid, signal.SIGCONT)
        # One master of three killed under load: the first, which also holds the wake-up flags.
        one_down = run_batch("one-down", 60, masters[0].stop)
        print(f"\nredlock masters: {all_up:.0f} jobs/s all up, {stalled:.0f} with one stalled, {one_down:.0f} "
              f"with one down (ratios {stalled / all_up:.2f}, {one_down / all_up:.2f}; see bench_redlock.py)")
        # Jobs that come due while the quorum is lost: they must wait for it.
        waiting = send_batch("waiting", 10, delay=300)
        masters[1].stop()
        lost = events.record("quorum lost")
        with pytest.raises(RedisUnavailable):
            single.send("refused")  # its queue lock cannot be taken: the send raises, publishes nothing
        for key, job in (("k0", "a"), ("k1", "b")):  # no queue lock at send: accepted, and they wait
            message_ids[f"serial-{job}"] = serial.send(key, job).message_id
            waiting.add(f"serial-{job}")
        sent.update(waiting)
        wait_until(lambda: all_refused(waiting), timeout=20, interval=0.01, what="every waiting job refused")
        back = events.record("quorum back")
        for index in (0, 1):
            masters[index] = RedisServer(masters[index].port).start()
        restored = time.monotonic()
        wait_until(lambda: events.ended(waiting) == len(waiting), timeout=30, what="the jobs that waited")
        print(f"FAULT redlock-masters jobs={len(sent)} waited={len(waiting)} refused_sends=1 "
              f"recover_s={time.monotonic() - restored:.1f}")
    finally:
        worker.stop(timeout=10_000)
        suite.db.close()
    log = events.all()
    check_one_holder_per_key(log)
    assert not [e for e in log if e["event"] == "start" and lost < e["seq"] < back], "a job ran without a quorum"
    assert {e["job"] for e in log if e["event"] == "end"} == sent, "every job ran"
    assert "refused" not in {e.get("key") for e in log}

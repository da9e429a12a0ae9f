"""The app of the fault suite (tests/faults/), loaded by the tests and by ``dramatiq tests.fault_app`` workers.

Configured by ``DU_*`` variables (the test passes the same values to its own :func:`build`):

``DU_REDIS_URL``            the broker's Redis (a ``redis+sentinel://`` URL: a service behind Sentinel)
``DU_LOCK_REDIS_URL``       the suite's Redis (locks, slots, parking); default: the broker's
``DU_LOG_REDIS_URL``        where the event log goes; default: the suite's
``DU_NAMESPACE``            the broker's namespace
``DU_DATABASE_URL``         the job table
``DU_KEY_PREFIX``           the suite's key prefix (and the event log's)
``DU_TTL``                  ``unique_ttl`` and ``concurrency_ttl`` (ms)
``DU_LIMIT``                the slot actor's ``concurrency_limit``
``DU_HEARTBEAT_TIMEOUT``    the broker's ``heartbeat_timeout`` (ms): how soon a killed worker counts as dead
``DU_MAINTENANCE_CHANCE``   the broker's ``maintenance_chance`` (per million commands; Dramatiq's default 1000):
                            how soon some consumer hands a dead worker's messages back, as in a busy cluster

Every run writes events to one Redis list, ``<key prefix>:events``, in one
server-side order (a Lua script draws a sequence number with INCR and appends
the event under it, so no clock is compared across processes):

- ``start`` when the actor begins, ``beat`` after each ``heartbeat()`` that
  held, ``lost`` when one raised ``LockLost``, ``end`` when the actor body is
  done (all inside the actor, so while its lock or slot is held); ``fail``
  when a tracked run asked to fail (``fail_first``) raises, to be retried;
- ``done`` from a middleware whose ``after_process_message`` runs after every
  suite middleware's: the outcome of the run has been recorded (or tried).

The test adds its own events (``kill``, ``stop``, ``cont``, ``fault``,
``back``) to the same list; :mod:`tests.faults.events` judges the log.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware

import dramatiq_unique
from dramatiq_unique import LockLost, current_job, heartbeat
from dramatiq_unique.redis.servers import is_sentinel_url

#: KEYS[1] the sequence, KEYS[2] the list; ARGV[1] the event as a JSON array.  The list's order
#: is the order of the sequence numbers: one script, run atomically by the server.
_RECORD = """
local n = redis.call('incr', KEYS[1])
redis.call('rpush', KEYS[2], n .. ' ' .. ARGV[1])
return n
"""

#: What a run that was fenced out returns (after swallowing LockLost): never a row's result.
ZOMBIE = "zombie"


class EventLog:
    """The ordered event log in Redis under ``key_prefix``."""

    def __init__(self, url: str, key_prefix: str) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self.keys = [f"{key_prefix}:events:seq", f"{key_prefix}:events"]
        self._record = self.client.register_script(_RECORD)

    def record(self, event: str, **fields: Any) -> int:
        fields.setdefault("pid", os.getpid())
        fields.setdefault("tid", threading.get_ident())
        fields["t"] = time.time()  # for the figures only (time to recover), never for ordering
        return int(self._record(keys=self.keys, args=[json.dumps({"event": event, **fields})]))

    def read(self) -> list[dict]:
        out = []
        for raw in self.client.lrange(self.keys[1], 0, -1):
            seq, _, body = raw.decode().partition(" ")
            out.append({"seq": int(seq), **json.loads(body)})
        return out

    def close(self) -> None:
        self.client.close()


class Recorder(Middleware):
    """``done`` after a message was processed: added first, so its after-hook runs last."""

    def __init__(self, log: EventLog) -> None:
        self.log = log

    def after_process_message(self, broker, message, *, result=None, exception=None):
        self.log.record("done", job=message.message_id, actor=message.actor_name,
                        error=type(exception).__name__ if exception is not None else None)


@dataclass
class App:
    broker: RedisBroker
    suite: dramatiq_unique.Suite
    log: EventLog
    unique: dramatiq.Actor
    while_executing: dramatiq.Actor
    slot: dramatiq.Actor
    tracked: dramatiq.Actor

    def close(self) -> None:
        self.suite.close()
        self.broker.close()
        self.log.close()


class Deliberate(Exception):
    """Raised by a run asked to fail (``fail_first``): its job is retried by Dramatiq's Retries."""


def _body(log: EventLog, kind: str, key: str, run_ms: int, beat_ms: int, fail_first: int = 0) -> Any:
    job = current_job()
    run = dict(kind=kind, job=job.message_id, key=key, token=job.fencing_token, attempt=job.attempts)
    log.record("start", **run)
    if job.attempts <= fail_first:
        log.record("fail", **run)
        raise Deliberate(f"attempt {job.attempts} fails on purpose")
    deadline = time.monotonic() + run_ms / 1000
    step = (beat_ms or run_ms) / 1000
    beats = 0
    while True:
        left = deadline - time.monotonic()
        if left > 0:
            time.sleep(min(step, left))
        if beat_ms:
            # Also once the work is done, before the result counts, as a careful job does: a run
            # frozen past its deadline (SIGSTOP) then learns it lost its lease, whenever it was stopped.
            try:
                heartbeat()
            except LockLost as e:
                log.record("lost", **run, error=str(e))
                return ZOMBIE  # swallowed on purpose: the suite must not record this outcome
            beats += 1
            log.record("beat", **run, n=beats)
        if left <= 0:
            break
    log.record("end", **run)
    return [os.getpid(), job.fencing_token]


def build(env: Mapping[str, str]) -> App:
    """A broker, a suite and the fault suite's actors, as ``env`` describes them."""
    broker_url = env["DU_REDIS_URL"]
    lock_url = env.get("DU_LOCK_REDIS_URL") or broker_url
    log_url = env.get("DU_LOG_REDIS_URL") or lock_url
    key_prefix = env["DU_KEY_PREFIX"]
    ttl = int(env.get("DU_TTL", "2000"))
    limit = int(env.get("DU_LIMIT", "2"))
    timings = dict(namespace=env["DU_NAMESPACE"], heartbeat_timeout=int(env.get("DU_HEARTBEAT_TIMEOUT", "3000")),
                   maintenance_chance=int(env.get("DU_MAINTENANCE_CHANCE", "1000")))
    if is_sentinel_url(broker_url):  # a service behind Sentinel: the broker on the master of the moment
        broker = RedisBroker(client=dramatiq_unique.redis_client(broker_url, socket_timeout=5,
                                                                 socket_connect_timeout=5), **timings)
    else:
        broker = RedisBroker(url=broker_url, socket_timeout=5, socket_connect_timeout=5, **timings)
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=env["DU_DATABASE_URL"], redis=lock_url,
                                  key_prefix=key_prefix, redriver=False,
                                  lost_after=int(env.get("DU_LOST_AFTER", "500")))
    log = EventLog(log_url, key_prefix)
    broker.add_middleware(Recorder(log), before=type(broker.middleware[0]))
    # Killed and lost attempts count as attempts: enough retries that every job finishes.
    retries = dict(max_retries=50, min_backoff=100, max_backoff=1_000)

    @dramatiq.actor(actor_name="fault_unique", unique_args=["key"], unique_lock="until_and_while_executing",
                    unique_ttl=ttl, **retries)
    def unique(key: str, n: int, run_ms: int = 50, beat_ms: int = 0) -> Any:
        return _body(log, "unique", key, run_ms, beat_ms)

    @dramatiq.actor(actor_name="fault_while", unique_args=["key"], unique_lock="while_executing",
                    unique_ttl=ttl, **retries)
    def while_executing(key: str, n: int, run_ms: int = 50, beat_ms: int = 0) -> Any:
        return _body(log, "while", key, run_ms, beat_ms)

    @dramatiq.actor(actor_name="fault_slot", concurrency_limit=limit, concurrency_key=["tenant"],
                    concurrency_ttl=ttl, unique_ttl=ttl, **retries)
    def slot(tenant: str, n: int, run_ms: int = 50, beat_ms: int = 0) -> Any:
        return _body(log, "slot", tenant, run_ms, beat_ms)

    @dramatiq.actor(actor_name="fault_tracked", track=True, unique_ttl=ttl, **retries)
    def tracked(key: str, n: int, run_ms: int = 50, beat_ms: int = 0, fail_first: int = 0) -> Any:
        return _body(log, "tracked", key, run_ms, beat_ms, fail_first)

    return App(broker, suite, log, unique, while_executing, slot, tracked)


app: Optional[App] = None
if os.environ.get("DU_FAULT_APP") == "1":  # a `dramatiq tests.fault_app` worker process
    app = build(os.environ)

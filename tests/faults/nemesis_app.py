"""The nemesis's app: every kind of actor the suite offers, each run written to the history.

Loaded by the runner (tests/faults/nemesis.py, which sends and re-drives) and by its
``dramatiq tests.faults.nemesis_app`` worker processes, configured by ``DU_*`` variables:

``DU_REDIS_URL``            the broker's and the suite's Redis (one server: killing it loses both)
``DU_NAMESPACE``            the broker's namespace
``DU_DATABASE_URL``         the job table
``DU_KEY_PREFIX``           the suite's key prefix
``DU_HISTORY_DIR``          where each process writes its history (tests/faults/history.py)
``DU_TTL``                  every lease: ``unique_ttl``, ``concurrency_ttl`` (ms)
``DU_HEARTBEAT_TIMEOUT``    the broker's ``heartbeat_timeout`` (ms): how soon a frozen worker counts as dead
``DU_MAINTENANCE_CHANCE``   the broker's ``maintenance_chance``: how soon a dead worker's messages come back
``DU_LOST_AFTER``           the suite's ``lost_after`` (ms)

Events of a run (one execution of an actor body; ``job`` is its message id, ``token`` and
``attempt`` its row's, all written while the body runs):

- ``start``; ``beat`` after a ``heartbeat()`` that held (``t0``: when the call began), or
  ``lost`` (``LockLost``) or ``beat_error`` (a dependency down), after which the body raises;
- ``step_run`` inside a checkpoint's step function (its side effect), ``step_ok`` once
  ``checkpoint()`` returned (``wrote``: the step ran in this call, so its result was written),
  ``step_refused`` when it raised ``LockLost``;
- ``fail`` before a deliberate failure (the retry actors fail their first attempts);
- ``raised`` when the body raises (whatever the cause), ``end`` with the result, after a last
  ``heartbeat()`` that held: the body's last events, after which its lock or slot may be released.

The first middleware adds ``deliver`` (before any suite hook), and ``done`` (with the
error's type) or ``skip`` after every suite hook, so after the outcome was recorded.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Mapping, Optional

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware

import dramatiq_unique
from dramatiq_unique import LockLost, checkpoint, current_job, heartbeat
from tests.faults.history import History


@dataclasses.dataclass(frozen=True)
class Kind:
    """One actor of the app, and how the checker judges its runs."""

    name: str
    options: dict
    #: Runs of one key that may hold it at once (None: the key is not exclusive, only the job is).
    holders: Optional[int]
    #: heartbeat() renews a Redis lease (an execution lock, a slot): a beat that held proves it live.
    leased: bool
    #: How many keys the sender draws from (fewer keys, more duplicates and waiting).
    keys: int
    #: How often the sender picks it, relative to the others.
    weight: int
    #: Its checkpoint steps.
    steps: tuple[str, ...] = ()
    #: Its fencing tokens are drawn per key (an execution lock), so they order the runs of the key's jobs;
    #: otherwise per job row, and they order only the attempts of one job.
    key_tokens: bool = False
    #: Its runs call ``heartbeat()``; without, as most actors, they run shorter than the lease
    #: (``SHORT_MS``) and touch no server from their start to their end.
    beats: bool = True


KINDS = {
    kind.name: kind
    for kind in (
        Kind("while", dict(unique_args=["key"], unique_lock="while_executing"), 1, True, 3, 3, key_tokens=True),
        Kind("uawe", dict(unique_args=["key"], unique_lock="until_and_while_executing"), 1, True, 6, 2,
             key_tokens=True),
        Kind("until_executed", dict(unique_args=["key"], unique_lock="until_executed"), None, False, 6, 2),
        Kind("until_executing", dict(unique_args=["key"], unique_lock="until_executing"), None, False, 6, 1),
        Kind("slot", dict(concurrency_limit=2, concurrency_key=["key"]), 2, True, 3, 3),
        # One slot for the whole actor, no heartbeat: its jobs queue, and each leaving holder hands the
        # slot on straight from the end of its body.
        Kind("serial", dict(concurrency_limit=1), 1, False, 1, 4, beats=False),
        Kind("retry", dict(track=True), None, False, 100, 2),
        Kind("steps", dict(track=True), None, False, 100, 2, ("a", "b", "c")),
    )
}
#: ms between two heartbeats of a run.
BEAT_MS = 250
#: ms of the runs of a kind that does not beat, drawn per send: well within the shortest lease.
SHORT_MS = (200, 400, 800)


class Flaky(Exception):
    """A deliberate failure: the retry actors' first attempts."""


class Recorder(Middleware):
    """``deliver`` before every other hook; ``done`` or ``skip`` after all of them (added first)."""

    def __init__(self, history: History) -> None:
        self.history = history

    def before_process_message(self, broker: Any, message: Any) -> None:
        self.history.record("deliver", job=message.message_id, actor=message.actor_name)

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None, exception: Any = None) -> None:
        self.history.record("done", job=message.message_id,
                            error=type(exception).__name__ if exception is not None else None)

    def after_skip_message(self, broker: Any, message: Any) -> None:
        self.history.record("skip", job=message.message_id)


@dataclasses.dataclass
class App:
    broker: RedisBroker
    suite: dramatiq_unique.Suite
    history: History
    actors: dict[str, dramatiq.Actor]

    def close(self) -> None:
        self.suite.close()
        self.broker.close()
        self.history.close()


def _run(history: History, kind: Kind, key: str, run_ms: int, fail_until: int) -> list:
    job = current_job()
    run = dict(job=job.message_id, kind=kind.name, key=key, token=job.fencing_token, attempt=job.attempts)
    history.record("start", **run)
    try:
        slices = len(kind.steps) + 1
        for name in kind.steps:
            _step(history, run, name, run_ms / slices)
            _beat(history, run)
        if kind.beats:
            _work(history, run, run_ms / slices)
        else:
            time.sleep(run_ms / 1000)
        if job.attempts <= fail_until:
            history.record("fail", **run)
            raise Flaky(f"attempt {job.attempts} fails on purpose")
        if kind.beats:
            _beat(history, run)  # the work is done: is its lease still held before the result counts?
    except BaseException as e:  # TimeLimitExceeded too
        history.record("raised", **run, error=type(e).__name__)  # its lock or slot may go from now on
        raise
    result = [os.getpid(), job.fencing_token, job.attempts]
    history.record("end", **run, result=result)
    return result


def _work(history: History, run: dict, ms: float) -> None:
    deadline = time.monotonic() + ms / 1000
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(BEAT_MS / 1000, left))
        _beat(history, run)


def _beat(history: History, run: dict) -> None:
    t0 = time.monotonic()
    try:
        left = heartbeat()
    except LockLost as e:
        history.record("lost", **run, t0=t0, error=str(e)[-160:])
        raise
    except Exception as e:
        history.record("beat_error", **run, t0=t0, error=type(e).__name__)
        raise
    history.record("beat", **run, t0=t0, left=round(left, 3))


def _step(history: History, run: dict, name: str, ms: float) -> None:
    ran = []

    def side_effect() -> str:
        ran.append(history.record("step_run", **run, step=name))
        time.sleep(ms / 1000)
        return name

    t0 = time.monotonic()
    try:
        checkpoint(name, side_effect)
    except LockLost:
        history.record("step_refused", **run, step=name, t0=t0)
        raise
    history.record("step_ok", **run, step=name, t0=t0, wrote=bool(ran))


def build(env: Mapping[str, str]) -> App:
    """A broker, a suite, this process's history and the app's actors, as ``env`` describes them."""
    url = env["DU_REDIS_URL"]
    ttl = int(env["DU_TTL"])
    broker = RedisBroker(url=url, namespace=env["DU_NAMESPACE"],
                         heartbeat_timeout=int(env["DU_HEARTBEAT_TIMEOUT"]),
                         maintenance_chance=int(env["DU_MAINTENANCE_CHANCE"]),
                         socket_timeout=5, socket_connect_timeout=5)
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=env["DU_DATABASE_URL"], redis=url, key_prefix=env["DU_KEY_PREFIX"],
                                  redriver=False, lost_after=int(env["DU_LOST_AFTER"]))
    history = History(env["DU_HISTORY_DIR"])
    broker.add_middleware(Recorder(history), before=type(broker.middleware[0]))
    # Killed, frozen and lost attempts count as attempts: enough retries that every job finishes.
    common = dict(max_retries=100, min_backoff=200, max_backoff=2_000, unique_ttl=ttl)
    actors = {}
    for kind in KINDS.values():
        options = {**common, **kind.options}
        if "concurrency_limit" in options:
            options["concurrency_ttl"] = ttl

        def fn(key: str, n: int, run_ms: int, fail_until: int = 0, kind: Kind = kind) -> list:
            return _run(history, kind, key, run_ms, fail_until)

        actors[kind.name] = dramatiq.actor(fn, actor_name=f"nem_{kind.name}", **options)
    return App(broker, suite, history, actors)


app: Optional[App] = None
if os.environ.get("DU_NEMESIS_APP") == "1":  # a `dramatiq tests.faults.nemesis_app` worker process
    app = build(os.environ)

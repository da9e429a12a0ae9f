"""The modules of the package a job's message goes through from the worker's ``before_process_message``
hooks to its start: not a speed, a count, for the docs' "how it is built" page.

    python tests/benchmarks/trace_start_path.py [--lock until_and_while_executing] [--track] [--calls]

Sends one job of an actor (a unique one of ``--lock``, or with ``--track`` a tracked one without a key)
to a real worker on the shared Redis and PostgreSQL (``DATABASE_URL`` for another), waits for it, then
sends a second one and records, with :func:`sys.setprofile` on the worker thread, every function of
``dramatiq_unique`` called while Dramatiq emits ``before_process_message`` for it: the gates (the
execution lock) and JobTracking's start. The first job warms the caches (statements, scripts). Prints the
modules in the order they are first entered, with their calls (``--calls``: each function).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import uuid
from collections import Counter
from types import FrameType
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import dramatiq  # noqa: E402
from common import REDIS_URL  # noqa: E402
from dramatiq.brokers.redis import RedisBroker  # noqa: E402

import dramatiq_unique  # noqa: E402

PG_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
PACKAGE = os.path.dirname(dramatiq_unique.__file__)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lock", default="until_and_while_executing")
    parser.add_argument("--track", action="store_true", help="a tracked job without a unique key")
    parser.add_argument("--calls", action="store_true", help="print each function, not only each module")
    args = parser.parse_args()

    run = f"trace-{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=REDIS_URL, namespace=run)
    suite = dramatiq_unique.setup(broker, database=PG_URL, redis=REDIS_URL, key_prefix=run, redriver=False)
    dramatiq.set_broker(broker)
    ran = threading.Event()
    options: dict[str, Any] = {"track": True} if args.track else {"unique_args": ["n"], "unique_lock": args.lock}

    @dramatiq.actor(queue_name=run, **options)
    def job(n: int) -> None:
        ran.set()

    calls: Counter[tuple[str, str]] = Counter()
    tracing = threading.Event()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        path = frame.f_code.co_filename
        if event == "call" and path.startswith(PACKAGE):
            calls[(os.path.relpath(path, PACKAGE), frame.f_code.co_name)] += 1

    emit_before = broker.emit_before

    def traced(signal: str, *a: Any, **k: Any) -> Any:
        if signal != "process_message" or not tracing.is_set():
            return emit_before(signal, *a, **k)
        sys.setprofile(profile)
        try:
            return emit_before(signal, *a, **k)
        finally:
            sys.setprofile(None)

    broker.emit_before = traced  # type: ignore[method-assign]
    worker = dramatiq.Worker(broker, worker_threads=1)
    worker.start()
    try:
        for n, trace in ((1, False), (2, True)):
            ran.clear()
            if trace:
                tracing.set()
            job.send(n)
            if not ran.wait(30):
                sys.exit("the job did not run within 30 s")
    finally:
        worker.stop()
        broker.flush_all()
        suite.close()

    modules: Counter[str] = Counter()
    for (module, _), count in calls.items():  # insertion order: the order first entered
        modules[module] += count
    what = ", ".join(f"{k}={v}" for k, v in options.items())
    print(f"{len(modules)} modules of dramatiq_unique from before_process_message to the start ({what}):")
    for module, count in modules.items():
        print(f"  {module:36} {count:3d} calls")
        if args.calls:
            for (name_module, name), n in calls.items():
                if name_module == module:
                    print(f"      {name} ({n})")


if __name__ == "__main__":
    main()

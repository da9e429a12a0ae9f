"""Helpers shared by the tests of the suite on Dramatiq's RabbitmqBroker (fixtures: tests/integration/conftest.py)."""

from __future__ import annotations

import dramatiq


def start_worker(broker, threads: int = 2) -> dramatiq.Worker:
    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=threads)
    worker.start()
    return worker

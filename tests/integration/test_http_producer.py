"""The HTTP producer example (examples/http_producer.py), driven over real HTTP on loopback."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import dramatiq
import pytest

from tests.conftest import REDIS_URL
from tests.helpers import wait_until

_spec = importlib.util.spec_from_file_location(
    "http_producer", Path(__file__).parents[2] / "examples" / "http_producer.py"
)
http_producer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(http_producer)  # type: ignore[union-attr]
call = http_producer.call


@pytest.fixture
def app(database_url, key_prefix):
    app = http_producer.build(REDIS_URL, database_url, key_prefix)
    threading.Thread(target=app["server"].serve_forever, daemon=True).start()
    worker = dramatiq.Worker(app["broker"], worker_timeout=50, worker_threads=2)
    worker.start()
    app["base"] = f"http://127.0.0.1:{app['server'].server_address[1]}"
    yield app
    worker.stop()
    app["server"].shutdown()
    app["server"].server_close()
    app["broker"].flush_all()
    app["suite"].db.close()


def test_201_then_202_for_the_same_key_and_one_refund(app):
    base, headers = app["base"], {"Idempotency-Key": "k-1", "X-User": "alice"}
    status, body = call(base, "POST", "/refunds", {"charge_id": "ch_1", "amount": 700}, headers)
    assert status == 201 and body["location"] == f"/jobs/{body['job_id']}"
    again = call(base, "POST", "/refunds", {"charge_id": "ch_1", "amount": 700}, headers)
    assert again == (202, {**body, "status": again[1]["status"]})

    job = wait_until(lambda: (lambda s: s if s["status"] == "succeeded" else None)(
        call(base, "GET", f"/jobs/{body['job_id']}")[1]), timeout=20)
    assert job["result"]["amount"] == 700 and job["steps"] == ["refund", "receipt"]
    assert job["attempts"] == 2  # the mailer failed once ...
    assert app["payments"].calls == 1  # ... and the refund was not made again


def test_a_reused_key_missing_key_and_unknown_job(app):
    base = app["base"]
    headers = {"Idempotency-Key": "k-2"}
    assert call(base, "POST", "/refunds", {"charge_id": "ch_2", "amount": 1}, headers)[0] == 201
    assert call(base, "POST", "/refunds", {"charge_id": "ch_2", "amount": 2}, headers)[0] == 422
    bob = {"Idempotency-Key": "k-2", "X-User": "bob"}
    assert call(base, "POST", "/refunds", {"charge_id": "ch_2", "amount": 2}, bob)[0] == 201
    assert call(base, "POST", "/refunds", {"charge_id": "ch_2", "amount": 1})[0] == 400
    assert call(base, "GET", "/jobs/999999")[0] == 404

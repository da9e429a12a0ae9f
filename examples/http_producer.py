"""An HTTP producer with idempotency keys, and a refund job in steps.

    python examples/http_producer.py

``POST /refunds`` with an ``Idempotency-Key`` header answers 201 with the
job when it made one, 202 with the same job when the key was seen before
(a client retrying after a timeout), 422 if the key was used with other
arguments.  ``GET /jobs/<id>`` returns the job's status and result, for
polling.  The refund job charges back through a payment provider, then
mails a receipt; the mailer fails once, and the retry does not refund
again: the refund step is a checkpoint, and the provider is also given
the step's idempotency key.

Run as a script, it serves on a free loopback port, runs a worker, plays
the client, and prints what happened.  Only the standard library serves.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import IdempotencyKeyReused, checkpoint, step_key, submit


class PaymentProvider:
    """A stand-in for Stripe: refunds are idempotent by key, as Stripe's are."""

    def __init__(self) -> None:
        self.refunds: dict[str, dict] = {}
        self.calls = 0

    def refund(self, charge_id: str, amount: int, *, key: str) -> dict:
        self.calls += 1
        refund = {"refund_id": f"re_{len(self.refunds) + 1}", "charge_id": charge_id, "amount": amount}
        return self.refunds.setdefault(key, refund)


class Mailer:
    def __init__(self, failures: int = 1) -> None:
        self.failures, self.sent = failures, []

    def send(self, refund: dict) -> str:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("mail server did not answer")
        self.sent.append(refund["refund_id"])
        return "sent"


def build(redis_url: str, database_url: str, namespace: str) -> dict[str, Any]:
    """Broker, suite, actor and HTTP server (not yet serving) of the producer."""
    broker = RedisBroker(url=redis_url, namespace=namespace)
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=database_url, redis=redis_url, key_prefix=namespace)
    payments, mailer = PaymentProvider(), Mailer()

    @dramatiq.actor(track=True, max_retries=3, min_backoff=100, max_backoff=200)
    def refund(charge_id: str, amount: int) -> dict:
        done = checkpoint("refund", lambda: payments.refund(charge_id, amount, key=step_key("refund")))
        checkpoint("receipt", mailer.send, done)
        return done

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            if self.path != "/refunds":
                return self._reply(404, {"error": "not found"})
            key = self.headers.get("Idempotency-Key")
            if not key:
                return self._reply(400, {"error": "an Idempotency-Key header is required"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                charge_id, amount = str(body["charge_id"]), int(body["amount"])
            except (ValueError, KeyError, TypeError):
                return self._reply(400, {"error": "expected JSON with charge_id and amount"})
            owner = self.headers.get("X-User", "anonymous")  # in real life: the authenticated user
            try:
                job, created = submit(refund, charge_id, amount, idempotency_key=key, owner=owner)
            except IdempotencyKeyReused as e:
                return self._reply(422, {"error": str(e), "job_id": e.job.id})
            reply = {"job_id": job.id, "status": job.status, "location": f"/jobs/{job.id}"}
            self._reply(201 if created else 202, reply)

        def do_GET(self) -> None:
            match = re.fullmatch(r"/jobs/(\d+)", self.path)
            job = dramatiq_unique.get_job(int(match.group(1))) if match else None
            if job is None:
                return self._reply(404, {"error": "no such job"})
            self._reply(200, {
                "job_id": job.id, "status": job.status, "attempts": job.attempts, "result": job.result,
                "steps": list(job.checkpoints or {}),
                "error": job.last_error.splitlines()[0] if job.last_error else None,
            })

        def finish(self) -> None:
            super().finish()
            suite.close()  # peewee connections are per thread: one per request here

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    return {"broker": broker, "suite": suite, "server": server, "payments": payments, "mailer": mailer}


def call(base: str, method: str, path: str, body: Any = None, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(base + path, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})},
                                     data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def main() -> int:
    app = build(
        os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        os.environ.get("DATABASE_URL") or f"sqlite:///{tempfile.mkdtemp()}/jobs.db",
        f"example-{uuid.uuid4().hex[:8]}",
    )
    server, broker = app["server"], app["broker"]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
    worker.start()
    try:
        headers = {"Idempotency-Key": "9b2e-refund-ch_42", "X-User": "alice"}
        order = {"charge_id": "ch_42", "amount": 1500}
        first = call(base, "POST", "/refunds", order, headers)
        retry = call(base, "POST", "/refunds", order, headers)  # the client timed out and retried
        print(f"POST /refunds        -> {first[0]} {first[1]}")
        print(f"POST /refunds again  -> {retry[0]} {retry[1]}")
        print(f"POST other amount    -> {call(base, 'POST', '/refunds', {**order, 'amount': 9}, headers)[0]}")
        job_id, deadline = first[1]["job_id"], time.monotonic() + 20
        status = call(base, "GET", f"/jobs/{job_id}")[1]
        while status["status"] not in ("succeeded", "failed") and time.monotonic() < deadline:
            time.sleep(0.1)
            status = call(base, "GET", f"/jobs/{job_id}")[1]
        print(f"GET /jobs/{job_id}         -> {status}")
        print(f"provider called {app['payments'].calls} time(s), {len(app['payments'].refunds)} refund(s) made, "
              f"receipts sent: {app['mailer'].sent}")
        ok = (first[0], retry[0], retry[1]["job_id"]) == (201, 202, job_id) and status["status"] == "succeeded"
        return 0 if ok and app["payments"].calls == 1 else 1
    finally:
        worker.stop()
        server.shutdown()
        broker.flush_all()


if __name__ == "__main__":
    sys.exit(main())

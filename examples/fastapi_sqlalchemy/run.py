"""The FastAPI shop, end to end, in one command: ``python examples/fastapi_sqlalchemy/run.py``.

Places one order, one whose payment fails and a repeat of the first (committed with
``session.commit()``) through FastAPI's test client, runs a Dramatiq worker and waits for the invoice
jobs.  Needs PostgreSQL and Redis (``DATABASE_URL``, ``REDIS_URL``; the
defaults are local), in a schema of its own, dropped at the end.
"""

import os
import sys
import time
import uuid
from pathlib import Path

import psycopg2

if not os.environ.get("DATABASE_URL", "").startswith("postgresql"):
    os.environ["DATABASE_URL"] = "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA = f"shop_{uuid.uuid4().hex[:8]}"
admin = psycopg2.connect(os.environ["DATABASE_URL"])
admin.autocommit = True
admin.cursor().execute(f'CREATE SCHEMA "{SCHEMA}"')
os.environ["DATABASE_URL"] += f"?options=-csearch_path%3D{SCHEMA}"
os.environ["EXAMPLE_NAMESPACE"] = SCHEMA
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dramatiq  # noqa: E402
from app import Base, Order, app, broker, engine  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

import dramatiq_unique  # noqa: E402

try:
    Base.metadata.create_all(engine)
    client = TestClient(app)
    placed = client.post("/orders", params={"customer": "ada", "total": 99}).json()
    print(f"order {placed['order']} placed; its invoice job {placed['job']} was published at the commit")
    refused = client.post("/orders", params={"customer": "bob", "total": 5, "fail": True})
    with engine.connect() as conn:
        orders = conn.exec_driver_sql("SELECT count(*) FROM orders").scalar()
    print(f"a failed payment ({refused.status_code}) rolled its order and job back: {orders} order, "
          f"{dramatiq_unique.JobModel.select().count()} job")
    repeated = client.post(f"/orders/{placed['order']}/repeat").json()
    print(f"order {repeated['order']} repeats it; its job {repeated['job']} was published at session.commit()")
    worker = dramatiq.Worker(broker, worker_threads=2)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while any(dramatiq_unique.get_job(done["job"]).status != "succeeded" for done in (placed, repeated)):
            assert time.monotonic() < deadline, "the worker did not run the invoice jobs"
            time.sleep(0.1)
    finally:
        worker.stop()
    with engine.connect() as conn:
        invoiced = [row.invoiced for row in conn.execute(Order.__table__.select().order_by(Order.id))]
        print("the worker ran them: invoiced =", invoiced)
finally:
    broker.flush_all()
    engine.dispose()
    admin.cursor().execute(f'DROP SCHEMA "{SCHEMA}" CASCADE')

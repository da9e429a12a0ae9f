"""The shop, end to end, in one command: ``python examples/django_project/run.py``.

Runs ``manage.py migrate`` (Django's tables, the shop's, and the job tables), starts django_dramatiq's
``manage.py rundramatiq``, places one order and one whose payment fails, waits for the invoice job,
and shows the dashboard at /admin/jobs/ to a staff user.  Needs PostgreSQL and Redis
(``DATABASE_URL``, ``REDIS_URL``; the defaults are local), in a schema of its own, dropped at the end.
"""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
if not os.environ.get("DATABASE_URL", "").startswith("postgresql"):
    os.environ["DATABASE_URL"] = "postgresql://postgres@127.0.0.1:5432/test"
os.environ["EXAMPLE_SCHEMA"] = f"shop_{uuid.uuid4().hex[:8]}"
os.environ["DJANGO_SETTINGS_MODULE"] = "shop.settings"
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
sys.path.insert(0, str(HERE))


def manage(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE / "manage.py"), *args], cwd=HERE, **kwargs)


def main() -> None:
    import django
    import psycopg2
    from shop.settings import DATABASE, SCHEMA

    admin = psycopg2.connect(dbname=DATABASE.path.lstrip("/"), user=DATABASE.username, host=DATABASE.hostname,
                             port=DATABASE.port or 5432)
    admin.autocommit = True
    admin.cursor().execute(f'CREATE SCHEMA "{SCHEMA}"')
    worker = None
    try:
        assert manage("migrate", "--verbosity", "0").wait(120) == 0
        print("manage.py migrate: Django's tables, the orders' and the job tables")
        worker = manage("rundramatiq", "--processes", "1", "--threads", "2", start_new_session=True)
        django.setup()
        from django.contrib.auth.models import User
        from django.test import Client
        from orders.models import Order

        import dramatiq_unique

        client = Client()
        placed = client.post("/orders/", {"customer": "ada", "total": "99.00"}).json()
        print(f"order {placed['order']} placed; its invoice job {placed['job']} was published at the commit")
        try:
            client.post("/orders/", {"customer": "bob", "total": "5.00", "fail": "1"})
        except ValueError:
            print(f"a failed payment rolled its order and job back: {Order.objects.count()} order, "
                  f"{dramatiq_unique.JobModel.select().count()} job")
        deadline = time.monotonic() + 60
        while dramatiq_unique.get_job(placed["job"]).status != "succeeded":
            assert time.monotonic() < deadline, "the worker did not run the invoice job"
            time.sleep(0.2)
        print("rundramatiq ran it: invoiced =", Order.objects.get(id=placed["order"]).invoiced)
        assert client.get("/admin/jobs/").status_code == 302  # anonymous: sent to the admin's login
        User.objects.create_user("staff", password="example", is_staff=True)
        client.login(username="staff", password="example")
        page = client.get("/admin/jobs/jobs")
        assert page.status_code == 200 and b"send_invoice" in page.content
        print("the dashboard at /admin/jobs/ shows it to staff, and refuses anonymous users")
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(30)
        from django.db import connections

        connections.close_all()
        admin.cursor().execute(f'DROP SCHEMA "{SCHEMA}" CASCADE')


if __name__ == "__main__":
    main()

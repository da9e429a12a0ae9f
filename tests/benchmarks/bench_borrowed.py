"""Sends through a borrowed connection (contrib/) against the suite's own, side by side.

    python tests/benchmarks/bench_borrowed.py [--jobs 1000] [--rounds 5]

Three suites on one PostgreSQL schema, each on its own Redis broker: ``own`` opens its connection from
the URL (psycopg2, prepared statements), ``django`` runs the same statements on Django's connection of
that database (contrib/django/database.py; Django's driver, psycopg 3 when installed), ``sqlalchemy``
on the session's connection inside ``session.begin()`` (contrib/sqlalchemy.py; psycopg2).  Within each
round the kinds take turns, so the machine's load falls on all alike: ``plain`` Dramatiq, then a
tracked and a unique send on each suite, outside any transaction (autocommit), and a tracked send
inside a transaction of one send (``transaction()`` on the own connection, ``transaction.atomic()`` on
Django's, ``session.begin()`` on SQLAlchemy's, beside that session's cost without a send).  Prints
the median microseconds per send, wall clock and this process's CPU (the client's own cost, which the
machine's load moves less), and each one's speed ratio to plain Dramatiq.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable

import dramatiq
from common import REDIS_URL, pg_database
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique


def suites(url: str) -> dict[str, Callable[[int], object]]:
    import django
    from django.conf import settings
    from django.db import transaction

    schema = url.split("search_path%3D", 1)[1]
    settings.configure(USE_TZ=True, DATABASES={"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": "test", "HOST": "127.0.0.1", "USER": "postgres",
        "CONN_MAX_AGE": None, "OPTIONS": {"options": f"-c search_path={schema}"}}})
    django.setup()
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from dramatiq_unique.contrib.django.database import DjangoDatabase

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg2://"))
    kinds: dict[str, Callable[[int], object]] = {}
    for name, database in (("own", url), ("django", DjangoDatabase("default")), ("sqlalchemy", engine)):
        broker = RedisBroker(url=REDIS_URL, namespace=f"bench-borrowed-{name}-{os.getpid()}")
        dramatiq.set_broker(broker)
        suite = dramatiq_unique.setup(broker, database=database, redis=REDIS_URL, key_prefix=broker.namespace,
                                      redriver=False)
        tracked = dramatiq.actor(lambda i: None, actor_name="tracked", queue_name="tracked", track=True)
        unique = dramatiq.actor(lambda i: None, actor_name="unique", queue_name="unique", unique_args=["i"],
                                unique_lock="until_executing")
        if name == "own":
            kinds["plain"] = dramatiq.actor(lambda i: None, actor_name="plain", queue_name="plain").send

            def in_block(i: int, actor: dramatiq.Actor = tracked, suite: dramatiq_unique.Suite = suite) -> None:
                with dramatiq_unique.transaction(suite=suite):
                    actor.send(i)
        elif name == "django":
            def in_block(i: int, actor: dramatiq.Actor = tracked) -> None:
                with transaction.atomic():
                    actor.send(i)
        else:  # outside a session, its sends run on the suite's own connection: the same as "own"
            def in_block(i: int, actor: dramatiq.Actor = tracked) -> None:
                with Session(engine) as session, session.begin():
                    actor.send(i)
            def alone(i: int) -> None:  # what session.begin() costs without a send: to take off
                with Session(engine) as session, session.begin():
                    session.connection()

            kinds[f"{name}: in a transaction"], kinds[f"{name}: the session alone"] = in_block, alone
            continue
        kinds[f"{name}: tracked"], kinds[f"{name}: unique"] = tracked.send, unique.send
        kinds[f"{name}: in a transaction"] = in_block
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')} UTC, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, "
          f"PostgreSQL, {args.jobs} sends x {args.rounds} rounds")
    with pg_database() as url:
        kinds = suites(url)
        micros: dict[str, list[float]] = {kind: [] for kind in kinds}
        cpu: dict[str, list[float]] = {kind: [] for kind in kinds}
        sent = 0
        for _ in range(args.rounds):
            for kind, send in kinds.items():
                for i in range(50):  # warm
                    send(sent + i)
                sent += 50
                start, start_cpu = time.perf_counter(), time.process_time()
                for i in range(args.jobs):
                    send(sent + i)
                micros[kind].append((time.perf_counter() - start) / args.jobs * 1e6)
                cpu[kind].append((time.process_time() - start_cpu) / args.jobs * 1e6)
                sent += args.jobs
        for broker_ns in {f"bench-borrowed-{n}-{os.getpid()}" for n in ("own", "django", "sqlalchemy")}:
            RedisBroker(url=REDIS_URL, namespace=broker_ns).flush_all()
    plain = micros["plain"]
    print(f"{'kind':<26}{'us/send':>9}{'cpu us':>8}  speed vs plain, median (range)")
    for kind, us in micros.items():
        ratios = [p / u for p, u in zip(plain, us, strict=True)]
        print(f"{kind:<26}{statistics.median(us):>9.0f}{statistics.median(cpu[kind]):>8.0f}  "
              f"{statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()

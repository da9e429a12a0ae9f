"""PostgreSQL through PgBouncer (Debian's, 1.18), in transaction and in session mode, with its defaults.

A throwaway PostgreSQL cluster behind a PgBouncer of the test's own, configured as a new user leaves
it: no ``ignore_startup_parameters`` (so the ``options`` start-up parameter is refused), the default
``server_reset_query``; in transaction mode a pool of 4 server connections for 2 worker processes of 3
threads, 2 producer threads and the re-drive (transaction pooling shares them), in session mode one
server connection per client connection (``threads + 3`` per worker process, see docs/operations/deploying.md).
The suite is set up with its defaults (``prepared_statements`` left alone).  A few hundred mixed
sends while two `dramatiq` workers run them; one worker process is SIGKILLed mid-run.

Asserted: setup() works through the pooler; in transaction mode it found the pooler and prepares
nothing, in session mode it prepares as usual; statements are bounded by ``database_timeout`` all the
same (a ``pg_sleep`` through the pooler is cancelled); every job succeeded, no key had more holders
than allowed, no job ran beside itself, the reruns are no more than the kill cut.  Statement mode,
which refuses the suite's transactions, is named in setup()'s error.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable

import dramatiq
import peewee as pw
import psycopg2
import pytest
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique.storage import queries
from dramatiq_unique.storage.database import is_psycopg3, transaction_pooled
from tests.conftest import REDIS_URL
from tests.durable import RedisServer, free_port
from tests.faults.harness import fault_env, open_runs_by_pid, prefix, report, start_rig, wait_for
from tests.faults.shape_load import LIMIT, Load, judge
from tests.servers import PostgresCluster
from tests.shape_servers import PgBouncer

pytestmark = pytest.mark.slow

SENDS = 300
THREADS = 3


@pytest.fixture(scope="module")
def cluster():
    cluster = PostgresCluster()
    try:
        yield cluster.start()
    finally:
        cluster.remove()


def database(cluster: PostgresCluster) -> str:
    """A database of the test's own on the cluster (a pooler passes no search_path: no schema URL)."""
    name = prefix()
    conn = psycopg2.connect(host="127.0.0.1", port=cluster.port, user="postgres", dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    return name


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_pgbouncer_with_its_defaults(mode, cluster, tmp_path):
    # Session mode holds a server connection per client connection: per worker process its threads, its
    # two consumers (default and delay queue) and its main thread; here too the producers and the re-drive.
    pool = 4 if mode == "transaction" else 2 * (THREADS + 3) + 8
    bouncer = PgBouncer("127.0.0.1", cluster.port, mode=mode, pool_size=pool)
    with contextlib.ExitStack() as cleanup:
        bouncer.start()
        cleanup.callback(bouncer.remove)
        server = RedisServer().start()
        cleanup.callback(server.stop)
        env = fault_env(broker_url=server.url, database_url=bouncer.url(database(cluster)), key_prefix=prefix(),
                        limit=LIMIT, lost_after=2_000)
        app, fleet, redriver = start_rig(cleanup, env, tmp_path, threads=THREADS)
        db = app.suite.db
        assert getattr(db, queries._ON) is (mode != "transaction"), "prepared statements off in transaction mode"
        # Bounded through the pooler: the start-up option was refused, SET LOCAL bounds each statement.
        assert db.local_timeout == app.suite.settings.database_timeout
        db.local_timeout = 300
        with pytest.raises(pw.DatabaseError, match="statement timeout"):
            db.execute_sql("SELECT pg_sleep(5)")
        with pytest.raises(pw.DatabaseError, match="statement timeout"), db.atomic():
            db.execute_sql("SELECT pg_sleep(5)")
        db.local_timeout = app.suite.settings.database_timeout

        load = Load(app, SENDS).start()
        busy = wait_for(lambda: [pid for pid, runs in open_runs_by_pid(app.log, fleet.pids()).items() if runs],
                        timeout=60, what="a worker process running a job")
        kill = fleet.kill(busy[0])
        load.join()
        figures, rows, log = judge(app, fleet, tmp_path, load)
        waited = max(row[-2] if mode else 0 for row in bouncer.admin("SHOW POOLS") if row[0] != "pgbouncer")
    last_done = max(r.t_done for r in log.runs if r.t_done is not None)
    report(figures.line(f"shape-pgbouncer-{mode}", 1, last_done - log.seq_time(kill), sends=len(load.sent),
                        pool=pool, slowest_send_s=round(load.slowest, 1), maxwait_s=waited))


def test_a_statement_prepared_under_a_transaction_pooler_is_refused_when_asked_for(cluster):
    """prepared_statements=True, asked for outright, is refused at setup() behind a transaction pooler,
    naming the setting; None (the default) turns them off; False needs no probe."""
    bouncer = PgBouncer("127.0.0.1", cluster.port, mode="transaction", pool_size=4).start()
    try:
        url = bouncer.url(database(cluster))
        with pytest.raises(dramatiq_unique.InvalidOption, match="prepared_statements=False"):
            dramatiq_unique.Suite(database=url, redis="redis://127.0.0.1:1/0", prepared_statements=True)
        suite = dramatiq_unique.Suite(database=url, redis="redis://127.0.0.1:1/0")
        assert getattr(suite.db, queries._ON) is False
        suite.close()
    finally:
        bouncer.remove()


def test_a_pooler_lending_its_server_connections_in_turn_is_found_and_survived(cluster, caplog):
    """Transaction mode with ``server_round_robin = 1``: each statement of a client connection runs on the
    next server connection, so a second client never meets the first's. setup() finds the pooler all
    the same. Forced to prepare there (as on a pooler or a framework's connection that set-up cannot
    probe), the first statement missing on the connection it was prepared on turns preparing off for
    that database, with a warning, and every send is recorded."""
    with contextlib.ExitStack() as cleanup:
        bouncer = PgBouncer("127.0.0.1", cluster.port, mode="transaction", pool_size=2,
                            settings={"server_round_robin": "1"}).start()
        cleanup.callback(bouncer.remove)
        url = bouncer.url(database(cluster))
        both = [psycopg2.connect(url) for _ in range(2)]  # two transactions at once: two server connections
        for conn in both:
            conn.cursor().execute("SELECT 1")
        for conn in both:
            conn.commit()  # a client leaving inside a transaction would take its server connection along
            conn.close()
        broker, suite = suite_on(cleanup, url)
        assert getattr(suite.db, queries._ON) is False, "setup() found the pooler"

        @dramatiq.actor(track=True, broker=broker)
        def turn(n: int) -> None:
            pass

        queries.enable(suite.db, True)
        with caplog.at_level(logging.WARNING, logger="dramatiq_unique.storage.queries"):
            sent = [turn.send(n) for n in range(20)]
        assert all(dramatiq_unique.get_job(m.message_id).status == "queued" for m in sent)
        assert getattr(suite.db, queries._ON) is False
        assert "pooler in transaction mode" in caplog.text


def suite_on(cleanup: contextlib.ExitStack, database: Any) -> tuple[RedisBroker, Any]:
    """A broker of its own on the shared Redis, and the suite set up on it and ``database``; both closed
    with ``cleanup``."""
    broker = RedisBroker(url=REDIS_URL, namespace=prefix())
    cleanup.callback(broker.close)
    cleanup.callback(broker.flush_all)
    suite = dramatiq_unique.setup(broker, database=database, redis=REDIS_URL, key_prefix=prefix(), redriver=False)
    cleanup.callback(suite.close)
    return broker, suite


@pytest.mark.parametrize("psycopg3", [False, True], ids=["psycopg2", "psycopg3"])
def test_the_pooler_probe_tells_transaction_mode_on_either_driver(cluster, psycopg3):
    """setup()'s probe (storage/database.py, transaction_pooled) on either driver: PostgreSQL itself and
    PgBouncer in session mode are not transaction pooling, even with the one server connection held by
    another client (the probe's wait is bounded); transaction mode is, whichever server connection it
    lends next."""
    name = database(cluster)

    def pooled(port: int, meanwhile: Callable[[], None] = lambda: None) -> bool:
        db = pw.PostgresqlDatabase(name, host="127.0.0.1", port=port, user="postgres", prefer_psycopg3=psycopg3)
        assert is_psycopg3(db) is psycopg3
        try:
            db.execute_sql("SELECT 1")
            meanwhile()
            return transaction_pooled(db)
        finally:
            db.close()

    assert pooled(cluster.port) is False
    with contextlib.ExitStack() as cleanup:
        bouncers = {}
        for key, mode, settings in [("lifo", "transaction", {}), ("turns", "transaction", {"server_round_robin": "1"}),
                                    ("session", "session", {})]:
            bouncers[key] = PgBouncer("127.0.0.1", cluster.port, mode=mode, pool_size=2, settings=settings).start()
            cleanup.callback(bouncers[key].remove)
        both = [psycopg2.connect(bouncers["turns"].url(name)) for _ in range(2)]
        for conn in both:  # two server connections, lent in turn from now on
            conn.cursor().execute("SELECT 1")
        for conn in both:
            conn.commit()
            conn.close()
        assert pooled(bouncers["lifo"].port) is True
        assert pooled(bouncers["turns"].port) is True
        assert pooled(bouncers["session"].port) is False

        def hold_the_other_server_connection() -> None:
            holder = psycopg2.connect(bouncers["session"].url(name))
            cleanup.callback(holder.close)
            holder.cursor().execute("SELECT 1")

        started = time.monotonic()
        assert pooled(bouncers["session"].port, hold_the_other_server_connection) is False
        assert time.monotonic() - started < 10, "the probe waited for a server connection without bound"


@pytest.mark.parametrize("psycopg3", [False, True], ids=["psycopg2", "psycopg3"])
def test_statement_mode_is_named_at_setup(cluster, psycopg3):
    """PgBouncer in statement mode runs a statement outside a transaction and closes the connection at
    BEGIN (psycopg 3 shows its words, psycopg2 only the closed connection): setup() fails, naming the
    pooler's mode and the modes that work, not only a lost server."""
    with contextlib.ExitStack() as cleanup:
        bouncer = PgBouncer("127.0.0.1", cluster.port, mode="statement", pool_size=2).start()
        cleanup.callback(bouncer.remove)
        name = database(cluster)
        db = pw.PostgresqlDatabase(name, host="127.0.0.1", port=bouncer.port, user="postgres", prefer_psycopg3=True) \
            if psycopg3 else bouncer.url(name)
        with pytest.raises(dramatiq_unique.DatabaseUnavailable) as raised:
            suite_on(cleanup, db)
        assert "pool_mode = statement" in str(raised.value)
        assert "use transaction or session mode" in str(raised.value)
    # The same transaction straight to PostgreSQL, and a lost server, say nothing of a pooler.
    with contextlib.ExitStack() as cleanup:
        broker, suite = suite_on(cleanup, f"postgresql://postgres@127.0.0.1:{cluster.port}/{name}")
        assert suite.db.execute_sql("SELECT 1").fetchone() == (1,)
    with pytest.raises(dramatiq_unique.DatabaseUnavailable) as raised:
        with contextlib.ExitStack() as cleanup:
            suite_on(cleanup, f"postgresql://postgres@127.0.0.1:{free_port()}/{name}")
    assert "statement" not in str(raised.value)


def test_a_psycopg_3_database_behind_a_transaction_pooler_prepares_nothing(cluster):
    """A psycopg 3 database of the app's own through PgBouncer in transaction mode: setup() finds the
    pooler, so psycopg 3 prepares nothing by itself (``prepare_threshold=None``), and sends from three
    threads at once are all recorded (before, about a third raised: ``prepared statement "_pg3_0" does
    not exist`` or ``already exists``)."""
    with contextlib.ExitStack() as cleanup:
        bouncer = PgBouncer("127.0.0.1", cluster.port, mode="transaction", pool_size=2).start()
        cleanup.callback(bouncer.remove)
        db = pw.PostgresqlDatabase(database(cluster), host="127.0.0.1", port=bouncer.port, user="postgres",
                                   prefer_psycopg3=True)
        broker, suite = suite_on(cleanup, db)
        assert is_psycopg3(suite.db) and suite.db.connect_params.get("prepare_threshold", 5) is None

        @dramatiq.actor(track=True, broker=broker)
        def pooled(n: int) -> None:
            pass

        sent: list[Any] = []
        errors: list[BaseException] = []

        def send(first: int) -> None:
            for n in range(first, first + 50):
                try:
                    sent.append(pooled.send(n))
                except Exception as e:  # noqa: BLE001 - judged below
                    errors.append(e)

        threads = [threading.Thread(target=send, args=(first,)) for first in (0, 50, 100)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors, errors[:3]
        assert len(sent) == 150
        assert all(dramatiq_unique.get_job(m.message_id).status == "queued" for m in sent)


def test_a_wait_for_a_server_connection_ends_at_the_poolers_query_wait_timeout(cluster):
    """Session mode with a pool smaller than the threads: a thread whose connection finds no free server
    connection waits in PgBouncer, before PostgreSQL (statement_timeout cannot bound it); its
    ``query_wait_timeout`` (2 s here; docs/operations/deploying.md says how to size pools and set it) ends the wait
    and the call raises DatabaseUnavailable, instead of waiting PgBouncer's default two minutes."""
    bouncer = PgBouncer("127.0.0.1", cluster.port, mode="session", pool_size=1,
                        settings={"query_wait_timeout": "2"}).start()
    try:
        suite = dramatiq_unique.Suite(database=bouncer.url(database(cluster)), redis="redis://127.0.0.1:1/0")
        suite.db.execute_sql("SELECT 1")  # this thread's connection holds the one server connection
        errors: list[BaseException] = []

        def other_thread() -> None:
            try:
                dramatiq_unique.get_job("no-such-message")
            except BaseException as e:  # noqa: BLE001 - judged below
                errors.append(e)
            finally:
                suite.close()

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(60)
        assert not thread.is_alive(), "the wait for a server connection was not bounded"
        # PgBouncer closes the connection (psycopg2 says "server closed the connection"); the call was retried
        # once on a new connection, as after any dropped connection, and waited once more.
        assert errors and isinstance(errors[0], dramatiq_unique.DatabaseUnavailable), errors
        suite.close()
    finally:
        bouncer.remove()

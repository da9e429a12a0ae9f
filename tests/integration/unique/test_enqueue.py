"""Uniqueness at enqueue (dramatiq_unique.unique.enqueue), on real Redis with SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time

import dramatiq
import pytest

import dramatiq_unique
from dramatiq_unique import DatabaseUnavailable, DuplicateJob, InvalidOption, JobModel, RedisUnavailable
from dramatiq_unique.storage import jobs as store
from dramatiq_unique.storage.models import utcnow
from tests.helpers import job_of, queue_size, wait_until

QUEUE_LOCKS = ["until_executing", "until_executed", "until_and_while_executing", "until_expired"]


def rows(actor_name: str) -> list[JobModel]:
    return list(JobModel.select().where(JobModel.actor_name == actor_name).order_by(JobModel.id))


@pytest.mark.parametrize("lock", QUEUE_LOCKS)
def test_a_duplicate_send_is_skipped_and_resolves_to_the_waiting_job(suite, broker, lock):
    """Given a waiting job, when the same key is sent again, then nothing new is
    published and the returned message id resolves to the waiting job."""

    @dramatiq.actor(unique_args=["report_id"], unique_lock=lock, unique_window=60_000)
    def report(report_id, user=None):
        pass

    first = report.send(1, user="ann")
    second = report.send(report_id=1, user="bob")

    assert second.message_id == first.message_id
    assert dramatiq_unique.get_job(second.message_id).message_id == first.message_id
    assert len(rows("report")) == 1
    assert queue_size(broker) == 1


@pytest.mark.parametrize("lock", QUEUE_LOCKS)
def test_a_duplicate_send_can_raise_with_the_existing_job(suite, broker, lock):
    @dramatiq.actor(unique_args=["report_id"], unique_lock=lock, unique_on_conflict="raise", unique_window=60_000)
    def report(report_id):
        pass

    first = report.send(1)
    with pytest.raises(DuplicateJob) as error:
        report.send(1)
    assert error.value.job.message_id == first.message_id
    assert error.value.job.status == "queued"
    assert queue_size(broker) == 1
    # Another key is not a duplicate.
    report.send(2)
    assert len(rows("report")) == 2


def test_replace_gives_the_waiting_job_the_new_arguments_and_due_time(suite, broker, worker):
    """Given a delayed waiting job, when a duplicate is sent with replace, then the
    same job runs once, with the new arguments, at the new due time."""
    ran = []

    @dramatiq.actor(unique_args=["report_id"], unique_on_conflict="replace")
    def report(report_id, version):
        ran.append(version)
        return version

    first = report.send_with_options(args=(1, "old"), delay=60_000)
    second = report.send_with_options(args=(1, "new"), delay=50)

    assert second.message_id == first.message_id
    job = dramatiq_unique.get_job(first.message_id)
    assert job.args == [1, "new"] and job.revision == 1
    assert (job.process_after - utcnow()).total_seconds() < 5
    wait_until(lambda: dramatiq_unique.get_job(first.message_id).status == "succeeded", timeout=15)
    assert ran == ["new"]
    assert dramatiq_unique.get_job(first.message_id).result == "new"
    assert len(rows("report")) == 1


def test_replace_does_not_touch_a_running_job(suite, broker, worker):
    started, release = threading.Event(), threading.Event()

    @dramatiq.actor(unique_args=["report_id"], unique_lock="until_executed", unique_on_conflict="replace")
    def report(report_id, version):
        started.set()
        release.wait(10)
        return version

    first = report.send(1, "old")
    assert started.wait(10)
    second = report.send(1, "new")  # the holder runs: nothing to replace
    release.set()
    assert second.message_id == first.message_id
    wait_until(lambda: dramatiq_unique.get_job(first.message_id).status == "succeeded", timeout=10)
    assert dramatiq_unique.get_job(first.message_id).result == "old"
    assert len(rows("report")) == 1


@pytest.mark.parametrize("lock, accepted_while_running", [("until_executing", True), ("until_executed", False)])
def test_when_the_queue_lock_ends(suite, broker, worker, lock, accepted_while_running):
    """until_executing frees the key when the job starts; until_executed when it ends."""
    started, release = threading.Event(), threading.Event()

    @dramatiq.actor(unique_args=["report_id"], unique_lock=lock)
    def report(report_id):
        started.set()
        release.wait(10)

    first = report.send(1)
    assert started.wait(10)
    second = report.send(1)
    assert (second.message_id != first.message_id) is accepted_while_running
    release.set()
    wait_until(lambda: dramatiq_unique.get_job(first.message_id).status == "succeeded", timeout=10)
    third = report.send(1)  # once finished, the key is free for every lock type
    assert third.message_id != first.message_id


def test_an_until_executing_job_may_send_its_own_key_again_from_inside(suite, broker, worker):
    """Given an until_executing job that sends its own key again while it runs (a poller that
    re-schedules itself), Then each send is a new job: the queue lock was freed at the start,
    before the job's code ran, though the start does not wait for Redis's reply."""
    runs: list[str] = []

    @dramatiq.actor(unique_args=["feed"], unique_lock="until_executing")
    def poll(feed, n):
        # Its own id, not runs[-1]: the job it sends may start in another worker thread and append first.
        mine = dramatiq_unique.current_job().message_id
        runs.append(mine)
        if n < 5:
            again = poll.send(feed, n + 1)
            assert again.message_id != mine, "skipped as a duplicate of the running job"

    poll.send("news", 1)
    # Every one: a job's outcome is written after it sent the next, which may finish first.
    wait_until(lambda: len(runs) == 5 and all(dramatiq_unique.get_job(m).status == "succeeded" for m in runs),
               timeout=20)
    assert len(set(runs)) == 5
    assert all(dramatiq_unique.get_job(m).status == "succeeded" for m in runs)


def test_a_pipeline_step_skipped_as_a_duplicate_says_the_pipeline_stops_there(suite, broker, worker, caplog):
    """A unique step of a Dramatiq pipeline whose key a waiting job holds is skipped like any duplicate: the rest
    of the pipeline, which its message carried, never runs.  The suite says so, naming both jobs."""
    runs: list[tuple[str, int]] = []

    @dramatiq.actor
    def fetch(n):
        runs.append(("fetch", n))
        return n

    @dramatiq.actor(unique_args=["n"], unique_lock="until_executed")
    def render(n):
        runs.append(("render", n))
        time.sleep(0.5)  # holding its key while the pipeline's own render step is sent

    @dramatiq.actor
    def notify(n=None):
        runs.append(("notify", 0))

    worker.pause()
    holder = render.send(5)
    dramatiq.pipeline([fetch.message(5), render.message(), notify.message()]).run()
    worker.resume()
    wait_until(lambda: "will not run" in caplog.text and job_of(holder).status == "succeeded", timeout=10)
    assert "(pipe_target) will not run: a pipeline stops there" in caplog.text and holder.message_id in caplog.text
    time.sleep(0.3)
    assert sorted(runs) == [("fetch", 5), ("render", 5)]


def test_a_send_refused_before_its_row_is_written_leaves_the_key_free(suite, broker):
    """Given a middleware ahead of ours that refuses a unique send (after the early look for a
    holder), When the key is sent again, Then it is a new job, not skipped in favour of the
    refused one."""
    from dramatiq.middleware import MiddlewareError

    from dramatiq_unique.middleware import JobTracking

    class Refuse(dramatiq.Middleware):
        on = True

        def before_enqueue(self, broker, message, delay):
            if self.on:
                raise MiddlewareError("refused")

    @dramatiq.actor(unique_args=["report_id"])
    def report(report_id):
        pass

    refuse = Refuse()
    broker.add_middleware(refuse, before=JobTracking)
    with pytest.raises(MiddlewareError):
        report.send(1)
    refuse.on = False
    second = report.send(1)
    assert dramatiq_unique.get_job(second.message_id) is not None
    assert queue_size(broker) == 1


def test_until_expired_holds_the_key_for_the_window_whatever_the_state(suite, broker, worker):
    @dramatiq.actor(unique_args=True, unique_lock="until_expired", unique_window=600)
    def ping(host):
        pass

    first = ping.send("a")
    wait_until(lambda: dramatiq_unique.get_job(first.message_id).status == "succeeded", timeout=10)
    assert ping.send("a").message_id == first.message_id  # finished, still inside the window
    time.sleep(0.7)
    assert ping.send("a").message_id != first.message_id


def test_unique_window_lets_a_new_job_past_an_old_waiting_one(suite, broker):
    @dramatiq.actor(unique_args=True, unique_lock="until_executing", unique_window=300)
    def sync(account):
        pass

    first = sync.send("acme")
    assert sync.send("acme").message_id == first.message_id
    time.sleep(0.4)
    assert sync.send("acme").message_id != first.message_id
    holders = [row for row in rows("sync") if row.unique_hold is not None]
    assert len(holders) == 1


def test_while_executing_does_not_limit_waiting_jobs(suite, broker):
    @dramatiq.actor(unique_args=True, unique_lock="while_executing")
    def sync(account):
        pass

    assert sync.send("acme").message_id != sync.send("acme").message_id
    assert queue_size(broker) == 2


def test_the_database_decides_when_the_redis_lock_is_gone(suite, broker, redis_client):
    """Given a waiting job whose Redis queue lock was lost, a duplicate is still skipped."""

    @dramatiq.actor(unique_args=True)
    def sync(account):
        pass

    first = sync.send("acme")
    job = dramatiq_unique.get_job(first.message_id)
    assert redis_client.delete(f"redlock:{suite.keys.queue_lock(job.unique_key)}") == 1
    assert sync.send("acme").message_id == first.message_id
    assert sync.send("acme").message_id == first.message_id
    # The lock is not written back for the holder: it could start meanwhile,
    # and a lock naming a started job would skip sends it should not.
    assert redis_client.get(f"redlock:{suite.keys.queue_lock(job.unique_key)}") is None
    assert queue_size(broker) == 1


def test_a_duplicate_is_skipped_alike_whether_the_process_sent_its_key_lately_or_not(suite, broker):
    """Given a waiting job, When its key is sent again by a process that did not send it
    (its insert clashes) and then again (asked early, before the broker builds the message),
    Then every duplicate resolves to the waiting job, and none left a row or a message."""
    from dramatiq_unique.unique import recent
    @dramatiq.actor(unique_args=True, unique_lock="until_executing")
    def sync(account):
        pass

    first = sync.send("acme")
    for _ in range(2):
        recent._recent.keys.clear()  # as if another process sent the duplicates
        assert sync.send("acme").message_id == first.message_id
        assert sync.send("acme").message_id == first.message_id
    sync.send("globex")
    assert [j.unique_key.split(":")[0] for j in rows("sync")] == ["sync", "sync"]
    assert queue_size(broker) == 2


def test_a_queue_lock_naming_another_job_does_not_turn_a_send_away(suite, broker, redis_client):
    """The database decides: a queue lock left by a crash (naming a job that no longer holds
    the key) is overwritten by the next send's."""

    @dramatiq.actor(unique_args=True, unique_lock="until_executing")
    def sync(account):
        pass

    first = sync.send("acme")
    job = dramatiq_unique.get_job(first.message_id)
    lock = f"redlock:{suite.keys.queue_lock(job.unique_key)}"
    JobModel.update(unique_hold=None, status="succeeded").where(JobModel.id == job.id).execute()
    assert redis_client.get(lock).decode() == first.message_id  # as after a crash at the start
    second = sync.send("acme")
    assert second.message_id != first.message_id
    assert redis_client.get(lock).decode() == second.message_id
    assert sync.send("acme").message_id == second.message_id


def test_a_stale_redis_lock_does_not_block_a_new_job_on_the_db_path(suite, broker, redis_client):
    @dramatiq.actor(unique_args=True, unique_on_conflict="raise")
    def sync(account):
        pass

    first = sync.send("acme")
    job = dramatiq_unique.get_job(first.message_id)
    JobModel.update(unique_hold=None, status="succeeded").where(JobModel.id == job.id).execute()
    second = sync.send("acme")  # the Redis lock still names the finished job
    assert second.message_id != first.message_id
    assert redis_client.get(f"redlock:{suite.keys.queue_lock(job.unique_key)}").decode() == second.message_id


def test_bad_options_fail_at_declaration(suite):
    with pytest.raises(InvalidOption, match="unique_args names 'nope'"):

        @dramatiq.actor(unique_args=["nope"])
        def report(report_id):
            pass

    with pytest.raises(InvalidOption, match="unique_lock"):

        @dramatiq.actor(unique_args=True, unique_lock="forever")
        def other(report_id):
            pass


def test_an_unreachable_database_fails_the_send_and_publishes_nothing(suite, broker):
    @dramatiq.actor(unique_args=True)
    def sync(account):
        pass

    @dramatiq.actor
    def plain(x):
        pass

    suite.db.close()
    if suite.db.database.endswith(".db"):
        suite.db.init("/nonexistent/dir/jobs.db", pragmas={"busy_timeout": 100})
    else:
        suite.db.init(suite.db.database, host="127.0.0.1", port=1, user="postgres")
    with pytest.raises(DatabaseUnavailable):
        sync.send("acme")
    assert queue_size(broker) == 0
    plain.send(1)  # an untracked actor pays nothing, needs nothing
    assert queue_size(broker) == 1


def test_an_unreachable_redis_fails_a_unique_send_and_leaves_no_row(broker, sqlite_url, key_prefix):
    dramatiq_unique.setup(broker, database=sqlite_url, redis="redis://127.0.0.1:1/0", key_prefix=key_prefix,
                          check_redis=False)

    @dramatiq.actor(unique_args=True)
    def sync(account):
        pass

    with pytest.raises(RedisUnavailable):
        sync.send("acme")
    assert queue_size(broker) == 0
    assert rows("sync") == []


# -- zero slippage -------------------------------------------------------------


@pytest.mark.parametrize("lock", ["until_executing", "until_executed", "until_expired"])
def test_eight_threads_sending_one_key_at_once_make_one_job(suite, broker, lock):
    @dramatiq.actor(unique_args=["report_id"], unique_lock=lock, unique_window=60_000)
    def report(report_id, n):
        pass

    barrier = threading.Barrier(8)
    ids, errors = [], []

    def send(n: int) -> None:
        try:
            barrier.wait(10)
            for i in range(5):
                ids.append(report.send(1, n * 10 + i).message_id)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            suite.close()

    threads = [threading.Thread(target=send, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len(ids) == 40 and len(set(ids)) == 1
    assert len(rows("report")) == 1
    assert queue_size(broker) == 1


def test_the_unique_index_alone_admits_one_holder(suite):
    """Without Redis in the way: 8 threads inserting rows holding one key, one wins."""
    barrier = threading.Barrier(8)
    winners, holders = [], set()

    def insert(n: int) -> None:
        try:
            barrier.wait(10)
            row_id, holder = store.insert_holding(
                JobModel,
                {"message_id": f"m{n}", "actor_name": "race", "queue_name": "default", "unique_key": "race:k"},
                "race:k",
                None,
            )
            if row_id is not None:
                winners.append(f"m{n}")
            else:
                holders.add(holder.message_id)
        finally:
            suite.close()

    threads = [threading.Thread(target=insert, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(winners) == 1
    assert holders <= set(winners)


def test_four_processes_sending_one_key_at_once_make_one_job(suite, broker, database_url, key_prefix):
    import multiprocessing

    from tests.conftest import REDIS_URL
    from tests.procs import send_burst

    @dramatiq.actor(actor_name="report", unique_args=["report_id"])
    def report(report_id, n):
        pass

    start_at = time.time() + 3  # after every child has imported and set up
    jobs = [(REDIS_URL, broker.namespace, database_url, key_prefix, "until_executing", start_at, 10)] * 4
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.map_async(send_burst, jobs).get(60)
    ids = {message_id for result in results for message_id in result}
    assert len(ids) == 1
    assert len(rows("report")) == 1
    assert queue_size(broker) == 1

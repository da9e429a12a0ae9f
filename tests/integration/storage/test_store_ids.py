"""Naming a job to retry or cancel with several job stores: each store numbers its rows, so
a number may name a job in more than one; a message id or the row itself names one job."""

from __future__ import annotations

import dramatiq
import pytest

import dramatiq_unique
from dramatiq_unique import AmbiguousJobId, DatabaseUnavailable, JobNotFound, get_job
from dramatiq_unique.storage.models import utcnow
from dramatiq_unique.web import make_app
from tests.conftest import REDIS_URL
from tests.integration.storage.test_stores import store, two_urls  # noqa: F401  (two_urls: the fixture)
from tests.integration.web.conftest import Dash

LATER = 600_000


def _failed(job) -> None:
    table = type(job)
    table.update(status="failed", finished_at=utcnow()).where(table.id == job.id).execute()


def test_a_number_two_stores_have_is_refused_and_a_row_or_message_id_acts_in_its_store(
    broker, two_urls, key_prefix  # noqa: F811
):
    """Given job 1 in each of two stores and job 2 in the secondary only, retry_job/cancel_job
    (and the CLI's and dashboard's actions) refuse 1 as ambiguous, naming both stores and message
    ids, and change nothing; 2 acts on the secondary's job; the row from dead_jobs() or get_job()
    acts on the job it is, in its store."""
    suite = dramatiq_unique.setup(
        broker, database=two_urls, redis=REDIS_URL, key_prefix=key_prefix, redriver=False, store_down_for=60_000,
    )
    try:

        @dramatiq.actor(track=True, max_retries=0)
        def charge(n):
            return n

        in_primary = charge.send_with_options(args=(1,), delay=LATER)
        suite.stores.mark_down(0, "the test says so")  # the next tracked sends land in the secondary
        first, second, third = (charge.send_with_options(args=(n,), delay=LATER) for n in (2, 3, 4))
        suite.stores.mark_up(0)
        assert [store(m) for m in (in_primary, first, second, third)] == [0, 1, 1, 1]
        rows = {m.message_id: get_job(m.message_id) for m in (in_primary, first, second, third)}
        number = rows[first.message_id].id
        assert rows[in_primary.message_id].id == number, "both stores' sequences begin at the same number"
        only_secondary = rows[second.message_id].id
        assert get_job(only_secondary) is None, "the primary has no job of that number"

        for action in (dramatiq_unique.cancel_job, lambda n: dramatiq_unique.cancel_job(str(n), suite=suite),
                       lambda n: dramatiq_unique.retry_job(str(n), suite=suite)):
            with pytest.raises(AmbiguousJobId) as refused:
                action(number)
            text = str(refused.value)
            assert in_primary.message_id in text and first.message_id in text and "store 1" in text, text
        assert {get_job(m).status for m in rows} == {"queued"}, "nothing was cancelled"

        assert dramatiq_unique.cancel_job(only_secondary).message_id == second.message_id
        assert get_job(second.message_id).status == "cancelled"
        assert get_job(in_primary.message_id).status == "queued"

        assert dramatiq_unique.cancel_job(rows[first.message_id]).message_id == first.message_id
        assert (get_job(first.message_id).status, get_job(in_primary.message_id).status) == ("cancelled", "queued")

        _failed(rows[in_primary.message_id])
        _failed(rows[third.message_id])
        dead = {job.message_id: job for job in dramatiq_unique.dead_jobs()}
        assert set(dead) == {in_primary.message_id, third.message_id}
        with pytest.raises(AmbiguousJobId):
            dramatiq_unique.retry_job(number)
        retried = dramatiq_unique.retry_job(dead[third.message_id])  # the row from the dead set
        assert retried.message_id == third.message_id and store(third) == 1
        assert (get_job(third.message_id).status, get_job(in_primary.message_id).status) == ("queued", "failed")

        with pytest.raises(JobNotFound):
            dramatiq_unique.retry_job(10_000)
        with pytest.raises(JobNotFound):
            dramatiq_unique.cancel_job(2**64)

        dash = Dash(make_app(suite).test_client())
        assert dash.post(f"/jobs/{number}/retry").status_code == 409
        response = dash.post(f"/jobs/{number}/cancel")
        assert response.status_code == 409 and in_primary.message_id in response.get_data(as_text=True)
        assert get_job(in_primary.message_id).status == "failed"

        # A store that does not answer may have a job of that number: a number the other has is refused.
        suite.stores.mark_down(1, "the test says so")
        with pytest.raises(DatabaseUnavailable, match=in_primary.message_id):
            dramatiq_unique.retry_job(number)
        assert dramatiq_unique.retry_job(in_primary.message_id).status == "queued"  # its message id names it
    finally:
        suite.close()

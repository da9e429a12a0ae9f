"""The dashboard's bulk actions: retry all of the dead set (or an actor's), cancel the waiting jobs a
filter matches; each counted on a confirmation page first, then done by a POST that passes the CSRF
check, read-only and the host's hook, asked "retry_all" or "cancel_all"."""

from __future__ import annotations

import re

import dramatiq
import pytest

from dramatiq_unique import JobModel
from dramatiq_unique.web import make_app
from tests.durable import running_worker
from tests.helpers import job_of, wait_until
from tests.integration.web.conftest import Dash


@pytest.fixture
def dead(suite, broker):
    """Two dead jobs of ``a``, one of ``b``; and ``later``, whose two jobs wait a minute."""

    @dramatiq.actor(track=True, max_retries=0)
    def a(n):
        raise RuntimeError(f"a {n}")

    @dramatiq.actor(track=True, max_retries=0)
    def b(n):
        raise RuntimeError(f"b {n}")

    @dramatiq.actor(track=True)
    def later(n):
        pass

    messages = [a.send(1), a.send(2), b.send(3)]
    with running_worker(broker, threads=1):
        wait_until(lambda: all(job_of(m).status == "failed" for m in messages), what="three dead jobs")
    waiting = [later.send_with_options(args=(n,), delay=60_000) for n in (1, 2)]
    return messages, waiting


def test_retry_all_of_an_actor_counts_asks_then_retries(dash, dead):
    messages, _ = dead
    assert 'id="retry-all"' in dash.page("/dead")
    page = dash.page("/dead/retry-all?actor=a")
    assert re.search(r"Retry 2 dead jobs of a\?", page), page
    assert all(job_of(m).status == "failed" for m in messages)  # asking did nothing
    response = dash.post("/dead/retry-all", {"actor": "a"})
    assert response.status_code == 303
    location = response.headers["Location"]
    assert location.startswith("/dead?") and "done=retried_all" in location and "n=2" in location
    assert "2 dead jobs are due again" in dash.page(location)
    assert [str(job_of(m).status) for m in messages] == ["pending", "pending", "failed"]
    assert "No dead jobs of a to retry" in dash.page("/dead/retry-all?actor=a")
    assert dash.page("/dead/retry-all?actor=nobody", status=400)


def test_cancel_all_that_a_filter_of_the_jobs_page_matches(dash, dead):
    messages, waiting = dead
    assert 'id="cancel-all"' in dash.page("/jobs?actor=later")
    assert 'id="cancel-all"' not in dash.page("/jobs?status=failed")  # dead jobs are not waiting
    assert "Cancel 2 waiting jobs of later?" in dash.page("/jobs/cancel-all?actor=later")
    response = dash.post("/jobs/cancel-all", {"actor": "later", "since": "1h"})
    assert response.status_code == 303 and "done=cancelled_all" in response.headers["Location"]
    assert all(job_of(m).status == "cancelled" for m in waiting)
    assert all(job_of(m).status == "failed" for m in messages)
    assert dash.post("/jobs/cancel-all", {"status": "failed"}).status_code == 400
    assert dash.post("/jobs/cancel-all", {"since": "forever"}).status_code == 400


def test_a_hook_that_allows_one_retry_does_not_allow_all(suite, dead):
    """The host's hook is asked "retry_all", not "retry": without it, no button, no confirmation page,
    no action; with CSRF missing or read-only, no action either."""
    asked = []

    def hook(request, action):
        asked.append(action)
        return action in (None, "retry", "cancel")

    dash = Dash(make_app(suite, auth=hook).test_client())
    page = dash.page("/dead")
    assert 'id="retry-all"' not in page and 'data-action="retry"' in page
    dash.page("/dead/retry-all", status=403)
    assert dash.post("/dead/retry-all").status_code == 403
    assert dash.post("/jobs/cancel-all", {"actor": "later"}).status_code == 403
    assert {"retry_all", "cancel_all"} <= set(asked)
    assert JobModel.select().where(JobModel.status == "failed").count() == 3

    open_dash = Dash(make_app(suite).test_client())
    assert open_dash.post("/dead/retry-all", token="0" * 64).status_code == 403  # a forged CSRF token
    read_only = Dash(make_app(suite, read_only=True).test_client())
    assert 'id="retry-all"' not in read_only.page("/dead")
    assert read_only.client.post("/dead/retry-all").status_code == 403
    assert JobModel.select().where(JobModel.status == "failed").count() == 3

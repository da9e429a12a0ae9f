"""Every page of the dashboard, on a real suite (Redis broker, Redis locks, SQLite and PostgreSQL).

Jobs are made by real sends and a real worker: a failed one (the dead set), a
succeeded one, jobs parked behind a full slot group and behind an execution
lock held by a running job.
"""

from __future__ import annotations

import re
import threading

import dramatiq
import pytest

import dramatiq_unique
from tests.durable import running_worker
from tests.helpers import job_of, wait_until

EVIL = '<script>alert("x")</script>'


def _failed(message) -> None:
    wait_until(lambda: (job := job_of(message)) is not None and job.status == "failed", what="a dead job")


@pytest.mark.parametrize("database_url", ["sqlite", "postgres"], indirect=True)
def test_every_page_renders_what_the_suite_holds(suite, broker, dash):
    release = threading.Event()

    @dramatiq.actor(max_retries=0, track=True)
    def explode(note):
        raise RuntimeError(f"exploded on {note}")

    @dramatiq.actor(concurrency_limit=1, concurrency_key=["customer"], unique_args=["doc"])
    def render(customer, doc):
        release.wait(10)

    dead = explode.send(EVIL)
    with running_worker(broker, threads=2):
        _failed(dead)
        holder = render.send("acme", 1)
        wait_until(lambda: job_of(holder).status == "running", what="the holder runs")
        parked = render.send("acme", 2)  # the slot group is full: parked
        wait_until(lambda: job_of(parked).parked_on, what="a parked job")
        try:
            overview = dash.page("/")
            assert "Overview" in overview and "<svg" in overview and "explode" in overview
            jobs = dash.page("/jobs")
            assert jobs.count("data-job=") == 3 and "doc=2" in jobs
            detail = dash.page(f"/jobs/{job_of(parked).id}")
            assert 'id="why"' in detail and "acme" in detail  # why it waits, in words
            slots = dash.page("/slots")
            assert "render" in slots and "customer=acme" in slots and 'data-action="halt"' in slots
            locks = dash.page("/locks")
            assert "render" in locks and f">#{job_of(holder).id}<" in locks
            dead_page = dash.page("/dead")
            assert f'data-job="{dead.message_id}"' in dead_page and "RuntimeError: exploded on" in dead_page
            # The job's arguments are user data: escaped everywhere they show.
            dead_detail = dash.page(f"/jobs/{dead.message_id}")
            assert "exploded on" in dead_detail
            for html in (jobs, dead_page, dead_detail):
                assert EVIL not in html
            assert "&lt;script&gt;" in dead_detail
        finally:
            release.set()
        wait_until(lambda: job_of(parked).status == "succeeded", what="the parked job runs")
    done = dash.page(f"/jobs/{job_of(holder).id}")
    assert 'id="job-status">succeeded' in done and 'svg class="timeline"' in done


def test_jobs_filters_and_keyset_pages(suite, broker, dash):
    @dramatiq.actor(track=True)
    def a(customer):
        pass

    @dramatiq.actor(track=True)
    def b(customer):
        pass

    sent = [a.send(n) for n in range(5)] + [b.send(7)]
    ids = [job_of(m).id for m in sent]
    page = dash.page("/jobs?actor=b")
    assert re.findall(r'data-job="(\d+)"', page) == [str(ids[-1])]
    assert dash.page("/jobs?status=succeeded").count("data-job=") == 0
    assert dash.page("/jobs?status=queued&actor=a").count("data-job=") == 5
    assert dash.page("/jobs?since=5m").count("data-job=") == 6
    for bad in ("/jobs?status=nope", "/jobs?since=3y", "/jobs?cursor=x", "/jobs?key=" + "k" * 300):
        assert dash.get(bad).status_code == 400, bad

    small = dash.__class__(dramatiq_unique.web.make_app(suite, page_size=2).test_client())
    seen, path = [], "/jobs?actor=a"
    for _ in range(5):
        html = small.page(path)
        seen += re.findall(r'data-job="(\d+)"', html)
        more = re.search(r'rel="next" href="([^"]+)"', html)
        if not more:
            break
        path = more.group(1).replace("&amp;", "&")
        assert "actor=a" in path  # the filters go on to the next page
    assert seen == [str(i) for i in reversed(ids[:5])]


def test_a_job_page_by_id_or_message_id_and_what_is_no_job(suite, dash):
    @dramatiq.actor(track=True)
    def big(blob):
        pass

    message = big.send("x" * 2_000_000 + EVIL)  # 2 MB of arguments: shown cut, escaped
    job = job_of(message)
    for ref in (str(job.id), message.message_id):
        html = dash.page(f"/jobs/{ref}")
        assert 'id="job-status">queued' in html and EVIL not in html and len(html) < 60_000
    for ref in ("0", "99999999", "9" * 40, "nope", "%00", "a" * 300, "..%2F..%2Fetc"):
        assert dash.get(f"/jobs/{ref}").status_code == 404, ref

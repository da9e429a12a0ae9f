"""Slot numbers an operator can trust: every holder of a slot named, a held count above the limit
explained, and a woken job that holds a slot while it waits in the broker saying so on its page; in
the ops views, the command line's and the dashboard's (dramatiq_unique.ops.held, ops.detail)."""

from __future__ import annotations

import json

from dramatiq_unique import JobModel, concurrency_status, ops, set_concurrency_limit
from dramatiq_unique.web import make_app
from tests.conftest import REDIS_URL
from tests.helpers import wait_until
from tests.slots_app import Tally, WorkerProcess, declare


def _ids(tenant: str) -> list[int]:
    rows = JobModel.select().where(JobModel.actor_name == "slot_job").order_by(JobModel.id)
    return [row.id for row in rows if row.args[0] == tenant]


def test_holders_woken_while_every_thread_is_busy_are_named(suite, broker, database_url, key_prefix, run, app):
    """Given tenant a (limit 1) running one long job with two parked, and the worker's two threads
    busy, When an operator raises a's limit to 3 (from this process, which runs no worker: the two
    are woken through the broker and wait there for a thread) and lowers it to 1 again, Then the
    slots view names all three holders, marks the two queued ones, and says why 3 hold a group of 1;
    the woken job's page says it holds its slot; the running one's too; the dashboard names them all."""
    declare(REDIS_URL, key_prefix, limit=1, ttl=60_000)
    job = broker.get_actor("slot_job")
    tally = Tally(REDIS_URL, key_prefix)
    workers = WorkerProcess(redis_url=REDIS_URL, namespace=broker.namespace, database_url=database_url,
                            key_prefix=key_prefix, limit=1, threads=2)
    try:
        job.send("a", 0, run_ms=15_000)
        wait_until(lambda: tally.running("a") == 1, timeout=30, what="a's first job to start")
        job.send("a", 1)
        job.send("a", 2)
        wait_until(lambda: concurrency_status("slot_job", key="a").parked == 2, timeout=15, what="two parked")
        job.send("b", 0, run_ms=15_000)  # the second thread: busy from now on
        wait_until(lambda: tally.running("b") == 1, timeout=15, what="b's job to start")
        # The worker reserves the next rows of a busy group for its own holder (parking/lot.py) and
        # gives them back after a while: wait for that, so another process can wake them.
        wait_until(lambda: all(JobModel.get_by_id(i).worker is None for i in _ids("a")[1:]), timeout=15,
                   what="the parked rows off the worker's deck")

        assert set_concurrency_limit("slot_job", 3, key="a") == 2
        set_concurrency_limit("slot_job", 1, key="a")
        first, *woken = _ids("a")
        assert {JobModel.get_by_id(i).status for i in woken} == {"queued"}

        [group] = [g for g in ops.slots(suite, actor="slot_job") if g.key == "tenant=a"]
        assert (group.held, group.limit, group.limit_from) == (3, 1, "override")
        assert group.holders == [first, *woken] and group.queued_holders == woken
        assert group.note == "3 held, limit lowered to 1 while they ran"

        view = ops.job(suite, woken[0])
        assert view.why.startswith("woken with a slot of slot_job tenant=a, which it holds: queued since ")
        names = f"jobs {first}, {woken[0]} and {woken[1]}"
        assert view.slot == f"holds a slot of slot_job tenant=a: 3 held ({names}), limit lowered to 1 while they ran"
        assert ops.job(suite, first).slot == view.slot and ops.job(suite, first).why == ""

        code, out, _ = run(["slots", app])
        assert code == 0 and f"{first},{woken[0]}(queued),{woken[1]}(queued)" in out
        assert "slot_job tenant=a: 3 held, limit lowered to 1 while they ran" in out
        assert json.loads(run(["job", app, str(woken[1]), "--json"])[1])["slot"] == view.slot

        page = make_app(suite).test_client().get("/slots").get_data(as_text=True)
        for i in (first, *woken):
            assert f'href="/jobs/{i}"' in page
        assert " more" not in page.split('id="slots"')[1].split("</table>")[0]
        assert "3 held, limit lowered to 1 while they ran" in page
        job_page = make_app(suite).test_client().get(f"/jobs/{woken[0]}").get_data(as_text=True)
        assert "holds a slot of slot_job tenant=a" in job_page and "woken with a slot" in job_page
    finally:
        workers.stop()

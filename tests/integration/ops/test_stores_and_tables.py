"""The jobs list and job() over several stores and an actor's own table, and a ``history`` column."""

from __future__ import annotations

import dramatiq

import dramatiq_unique
from dramatiq_unique import JobModel, ops
from dramatiq_unique.storage.models import JSONField
from tests.conftest import REDIS_URL


class WithHistory(JobModel):
    """An actor's own table with the per-attempt history the schema adds."""

    history = JSONField(null=True)

    class Meta:
        table_name = "ops_history_jobs"


def test_pages_merge_stores_and_tables_and_job_shows_the_history(broker, tmp_path, key_prefix):
    urls = [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
    suite = dramatiq_unique.setup(broker, database=urls, redis=REDIS_URL, key_prefix=key_prefix, redriver=False,
                                  store_down_for=60_000)
    try:
        @dramatiq.actor(track=True)
        def report(n):
            pass

        @dramatiq.actor(track=True, job_model=WithHistory)
        def audited(n):
            pass

        sent = [report.send(1), audited.send(2)]
        suite.stores.mark_down(0, "the test says so")  # the next tracked send lands in the secondary
        sent.append(report.send(3))
        suite.stores.mark_up(0)
        ids = {m.message_id for m in sent}
        seen, cursor = [], None
        for _ in range(5):
            page = ops.jobs(suite, limit=1, cursor=cursor)
            seen += page.rows
            cursor = page.cursor
            if cursor is None:
                break
        assert {r.message_id for r in seen} == ids and len(seen) == 3  # every row once, ids of 3 sequences
        assert [r.id for r in seen] == sorted((r.id for r in seen), reverse=True)
        by_id = {r.message_id: r for r in seen}
        assert by_id[sent[0].message_id].ref == str(by_id[sent[0].message_id].id)  # the shared table, primary
        assert by_id[sent[1].message_id].ref == sent[1].message_id  # its own table: by message id
        assert by_id[sent[2].message_id].store == 1
        assert ops.job(suite, by_id[sent[2].message_id].ref).message_id == sent[2].message_id

        WithHistory.update(history=[
            {"attempt": 1, "started_at": "2026-11-24T21:00:00", "finished_at": "2026-11-24T21:00:01",
             "status": "failed", "error": "boom", "worker": "h:1:2"},
            {"attempt": 2, "started_at": "2026-11-24T21:01:00", "finished_at": None, "status": "running",
             "error": None, "worker": "h:1:3"},
        ]).execute()
        view = ops.job(suite, sent[1].message_id)
        assert [(a.attempt, a.status, a.error) for a in view.history] == [(1, "failed", "boom"), (2, "running", None)]
        assert view.as_dict()["history"][0]["worker"] == "h:1:2"
    finally:
        suite.close()

"""Every command of the command line against real Redis and SQLite/PostgreSQL, run in-process
with an app module (``APP``) or from the environment only (read-only)."""

from __future__ import annotations

import json
import sys
import types

from dramatiq_unique import JobModel
from dramatiq_unique.cli.context import DATABASE_ENV, PREFIX_ENV, REDIS_ENV
from tests.helpers import wait_until


def test_the_views_name_holders_waiters_and_keys(run, app, scene):
    """jobs, job, locks, slots, stats and dead, as tables and as JSON."""
    code, out, _ = run(["jobs", app])
    assert code == 0 and out.count("customer=42") == 5 and out.count("user=7") == 3
    code, out, _ = run(["jobs", app, "--key", "customer=42", "--limit", "2", "--json"])
    page = json.loads(out)
    assert code == 0 and [r["id"] for r in page["rows"]] == sorted(scene.slot_holders + scene.slot_waiters)[::-1][:2]
    code, out, _ = run(["jobs", app, "--cursor", page["cursor"], "--key", "customer=42", "--json"])
    assert len(json.loads(out)["rows"]) == 3

    code, out, _ = run(["job", app, str(scene.slot_waiters[-1])])
    holders = " and ".join(map(str, scene.slot_holders))
    assert code == 0
    assert f"waiting for a slot of deliver_webhook customer=42: 2 of 2 held by jobs {holders}; 2 waiting ahead" in out
    code, out, _ = run(["job", app, str(scene.lock_waiters[0]), "--json"])
    view = json.loads(out)
    assert view["waiting"]["reason"] == "lock" and view["waiting"]["holders"] == [scene.lock_holder]
    assert view["why"].startswith(f"waiting for the execution lock of report user=7: held by job {scene.lock_holder}")

    code, out, _ = run(["locks", app])
    assert code == 0
    [line] = [line for line in out.splitlines() if line.startswith("run")]
    assert line.split()[:5] == ["run", "report", "user=7", str(scene.lock_holder), "1"]
    assert line.split()[-2:] == ["2", ",".join(map(str, scene.lock_waiters))]

    code, out, _ = run(["slots", app, "--json"])
    [group] = json.loads(out)
    assert (group["key"], group["limit"], group["holders"], group["waiters"]) == (
        "customer=42", 2, scene.slot_holders, scene.slot_waiters)

    code, out, _ = run(["stats", app, "--json"])
    assert code == 0 and json.loads(out)["by_status"]["pending"] == 5
    code, out, _ = run(["stats", app])
    assert "finished per minute" in out and "deliver_webhook" in out
    code, out, _ = run(["dead", app, "--json"])
    assert [r["id"] for r in json.loads(out)] == [scene.dead]


def test_limit_then_slots_then_retry_and_cancel(run, app, scene):
    """limit raises a group (a parked job starts), halts it, restores it; retry sends a dead job
    again and it succeeds; cancel cancels a waiting job and refuses a finished one."""
    code, out, err = run(["limit", app, "deliver_webhook", "customer=42", "3"])
    assert code == 0, err
    assert "limit     3" in out
    wait_until(lambda: json.loads(run(["slots", app, "--json"])[1])[0]["held"] == 3, timeout=10, what="a third holder")
    assert run(["limit", app, "deliver_webhook", "customer=42", "halt"])[0] == 0
    [group] = json.loads(run(["slots", app, "--json"])[1])
    assert group["halted"] is True and group["limit"] == 0
    assert "HALTED" in run(["slots", app])[1]
    assert run(["limit", app, "deliver_webhook", "customer=42", "default", "--json"])[0] == 0
    assert json.loads(run(["slots", app, "--json"])[1])[0]["limit"] == 2

    scene.fixed.set()
    code, out, err = run(["retry", app, str(scene.dead)])
    assert code == 0 and "sent again" in out, err
    wait_until(lambda: JobModel.get_by_id(scene.dead).status == "succeeded", timeout=10, what="the retried job")
    assert run(["retry", app, str(scene.dead)])[0] == 1  # not dead any more: refused

    waiting = scene.lock_waiters[-1]
    code, out, _ = run(["cancel", app, str(waiting), "--json"])
    assert code == 0 and json.loads(out)["status"] == "cancelled"
    code, _, err = run(["cancel", app, str(scene.done)])
    assert code == 1 and "cancel" in err


def test_read_only_from_the_environment(run, scene, suite, database_url, key_prefix):
    """Without the app, the views read the tables the environment names; changes are refused."""
    code, out, _ = run(["jobs", "--json"], env=True)
    assert code == 0 and len(json.loads(out)["rows"]) == 10
    code, out, _ = run(["job", str(scene.slot_waiters[0])], env=True)
    assert code == 0 and "waiting for a slot of deliver_webhook" in out
    for words in (["retry", str(scene.dead)], ["cancel", str(scene.slot_waiters[0])],
                  ["limit", "deliver_webhook", "3"], ["prune"], ["redrive", "--once"]):
        code, _, err = run(words, env=True)
        assert code == 1 and "read-only" in err, (words, err)
    assert JobModel.get_by_id(scene.dead).status == "failed"
    code, _, err = run(["jobs"], environ={})
    assert code == 2 and "DRAMATIQ_UNIQUE_DATABASE_URL" in err

    # Redis down: the views of the job tables still answer; those of Redis say why they cannot.
    redis_down = {DATABASE_ENV: database_url, REDIS_ENV: "redis://127.0.0.1:1/0", PREFIX_ENV: key_prefix}
    assert run(["jobs"], environ=redis_down)[0] == 0
    code, out, _ = run(["job", str(scene.slot_waiters[0])], environ=redis_down)
    assert code == 0 and "waiting for a slot" in out and "not all known" in out
    code, _, err = run(["locks"], environ=redis_down)
    assert code == 1 and "Redis" in err and "Traceback" not in err


def test_bad_input_gives_usage_or_not_found(run, app, scene):
    for words, code in (
        (["job", app, "999999"], 1), (["job", app, "no-such-message"], 1), (["job", app, "x" * 500], 2),
        (["job", app, "99999999999999999999999"], 1), (["jobs", app, "--cursor", "garbage"], 2),
        (["jobs", app, "--status", "nope"], 2), (["jobs", app, "--limit", "0"], 2),
        (["jobs", app, "--since", "then"], 2),
        (["jobs", app, "--key", " "], 2), (["nonsense"], 2), (["job", app], 2), (["job", app, "1", "2"], 2),
        (["limit", app, "no_actor", "3"], 2), (["limit", app, "report", "3"], 2),
        (["limit", app, "deliver_webhook", "customer=42", "lots"], 2),
        (["limit", app, "deliver_webhook", "region=eu", "3"], 2), (["jobs", "no_such_module:broker"], 2),
        (["stats", app, "--minutes", "0"], 2),
    ):
        got, _, err = run(words)
        assert got == code, (words, got, err)
        assert "Traceback" not in err


def test_the_dead_set_names_each_job_s_error(run, app, scene):
    code, out, _ = run(["dead", app])
    header, line = out.splitlines()
    assert code == 0 and header.split() == ["REF", "ACTOR", "KEY", "ATTEMPTS", "FAILED", "ERROR"]
    assert line.split()[0] == str(scene.dead) and line.endswith("RuntimeError: broken 2")


def test_a_job_s_arguments_are_shown_whole_and_its_attempt_times_as_times(run, app, scene, broker):
    long = "z" * 300
    message = broker.get_actor("fine").send(long)
    wait_until(lambda: JobModel.get(JobModel.message_id == message.message_id).status == "succeeded", timeout=10)
    job_id = JobModel.get(JobModel.message_id == message.message_id).id
    code, out, _ = run(["job", app, str(job_id)])
    assert code == 0 and f'["{long}"] {{}}' in out and out.count(long) == 2  # the arguments and the result
    code, out, _ = run(["job", app, str(scene.dead)])
    [attempt] = [line for line in out.splitlines() if line.startswith("1 ")]
    # 2026-11-24 22:09:51, not the history column's ISO text (2026-11-24T22:09:51.246)
    assert attempt.split()[1:3] == ["failed", JobModel.get_by_id(scene.dead).started_at.strftime("%Y-%m-%d")], attempt


def test_a_refusal_names_the_job_by_the_id_typed(run, app, scene):
    code, _, err = run(["retry", app, str(scene.done)])
    assert code == 1 and f"job {scene.done} (" in err and "only a failed job can be retried" in err, err
    code, _, err = run(["cancel", app, str(scene.done)])
    assert code == 1 and f"job {scene.done} (" in err, err


def test_prune_redrive_and_web(run, app, scene, monkeypatch):
    import dramatiq_unique.web.app  # noqa: F401  (the command imports it too; the fake below replaces the package)

    code, out, _ = run(["prune", app, "--json"])
    assert code == 0 and json.loads(out) == {"pruned": 0}
    code, out, _ = run(["redrive", app, "--once", "--json"])
    assert code == 0 and json.loads(out)["ran"] is True
    code, out, _ = run(["redrive", app, "--once"])
    assert code == 0 and out.startswith("one pass: ") and "0 pruned" in out and "{" not in out

    monkeypatch.setitem(sys.modules, "dramatiq_unique.web", None)  # the extra is not installed
    code, _, err = run(["web", app])
    assert code == 2 and "pip install dramatiq_unique[web]" in err
    served: list = []
    fake = types.ModuleType("dramatiq_unique.web")
    fake.serve = lambda suite, **options: served.append((suite, options))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dramatiq_unique.web", fake)
    assert run(["web", app, "--port", "8099"])[0] == 0
    assert served[0][1] == {"host": "127.0.0.1", "port": 8099, "read_only": False, "allow_anonymous": False}
    assert run(["web", "--port", "8099"], env=True)[0] == 0
    assert served[1][1]["read_only"] is True


def test_end_to_end_in_a_process_of_its_own(tmp_path, broker, suite, database_url, key_prefix):
    """``python -m dramatiq_unique`` with an app module that sets the suite up itself."""
    import os
    import subprocess
    from pathlib import Path

    import dramatiq

    from tests.conftest import REDIS_URL

    @dramatiq.actor(unique_args=["user"], unique_lock="until_executing")
    def report(user):
        pass

    message = report.send(7)
    (tmp_path / "e2e_app.py").write_text(
        "import dramatiq\nfrom dramatiq.brokers.redis import RedisBroker\nimport dramatiq_unique\n"
        f"broker = RedisBroker(url={REDIS_URL!r}, namespace={broker.namespace!r})\n"
        "dramatiq.set_broker(broker)\n"
        f"dramatiq_unique.setup(broker, database={database_url!r}, redis={REDIS_URL!r}, key_prefix={key_prefix!r},"
        " redriver=False)\n"
        "@dramatiq.actor(unique_args=['user'], unique_lock='until_executing')\ndef report(user):\n    pass\n"
    )
    root = Path(__file__).parents[3]
    done = subprocess.run(
        [sys.executable, "-m", "dramatiq_unique", "job", "e2e_app", message.message_id, "--path", str(tmp_path)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "user=7" in done.stdout and "queued since" in done.stdout


def test_a_select_only_database_role_reads_from_the_environment(broker, pg_url, key_prefix):
    """The environment's suite creates nothing: a role that may only SELECT reads the jobs."""
    import io
    import uuid
    from urllib.parse import urlparse

    import dramatiq
    import peewee as pw

    import dramatiq_unique
    from dramatiq_unique.cli import main
    from dramatiq_unique.cli.context import Context
    from tests.conftest import PG_URL, REDIS_URL

    suite = dramatiq_unique.setup(broker, database=pg_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)

    @dramatiq.actor(track=True)
    def later(n):
        pass

    later.send_with_options(args=(1,), delay=60_000)
    schema = pg_url.rsplit("%3D", 1)[1]
    role = f"du_ro_{uuid.uuid4().hex[:8]}"
    parsed = urlparse(PG_URL)
    admin = pw.PostgresqlDatabase(parsed.path.lstrip("/"), host=parsed.hostname, port=parsed.port or 5432,
                                  user=parsed.username)
    admin.execute_sql(f'CREATE ROLE "{role}" LOGIN')
    try:
        admin.execute_sql(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        admin.execute_sql(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
        reader = pg_url.replace(f"//{parsed.username}@", f"//{role}@", 1)
        out, err = io.StringIO(), io.StringIO()
        env = {DATABASE_ENV: reader, REDIS_ENV: REDIS_URL, PREFIX_ENV: key_prefix}
        try:
            code = main(["jobs", "--json"], context=Context(out=out, err=err, env=env))
            assert code == 0, err.getvalue()
            assert [r["actor"] for r in json.loads(out.getvalue())["rows"]] == ["later"]
        finally:
            dramatiq_unique.suite.current().close()
            dramatiq_unique.suite.set_current(suite)
    finally:
        admin.execute_sql(f'REVOKE ALL ON ALL TABLES IN SCHEMA "{schema}" FROM "{role}"')
        admin.execute_sql(f'REVOKE ALL ON SCHEMA "{schema}" FROM "{role}"')
        admin.execute_sql(f'DROP ROLE "{role}"')
        admin.close()
        suite.db.close()

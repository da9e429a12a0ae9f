"""The bulk commands, retry-all and cancel-all: they count, ask, then act (or not)."""

from __future__ import annotations

import json

from dramatiq_unique import JobModel


def _status(job_id: int) -> str:
    return str(JobModel.get_by_id(job_id).status)


def test_retry_all_asks_first_and_does_nothing_unless_told_yes(run, app, scene):
    code, out, err = run(["retry-all", app], answer="n\n")
    assert code == 1 and "Retry 1 dead jobs? [y/N]" in err and "not confirmed" in err, err
    assert _status(scene.dead) == "failed"
    code, _, err = run(["retry-all", app])  # no answer at all (a script): no
    assert code == 1 and _status(scene.dead) == "failed"

    code, out, err = run(["retry-all", app, "--actor", "broken"], answer="yes\n")
    assert code == 0 and "retried 1 dead jobs of broken" in out and "re-drive" in out, (out, err)
    assert _status(scene.dead) == "pending"
    code, out, _ = run(["retry-all", app, "--yes", "--json"])
    assert code == 0 and json.loads(out)["done"] == 0  # nothing left: nothing asked

    assert run(["retry-all", app, "--actor", "no_such_actor", "--yes"])[0] == 2
    assert run(["retry-all", app, "--key", "user=7", "--yes"])[0] == 0  # report's key: no dead job has it
    assert run(["retry-all", app, "--key", "customer=42", "--actor", "deliver_webhook", "--yes"])[0] == 2  # a slot key
    assert run(["retry-all", app, "--since", "then", "--yes"])[0] == 2


def test_cancel_all_of_a_status_and_an_actor(run, app, scene):
    code, out, err = run(["cancel-all", app, "--actor", "report", "--status", "pending"], answer="y\n")
    assert code == 0 and "Cancel 2 pending jobs of report?" in err and "cancelled 2" in out, (out, err)
    assert [_status(i) for i in scene.lock_waiters] == ["cancelled", "cancelled"]
    assert _status(scene.lock_holder) == "running"
    assert [_status(i) for i in scene.slot_waiters] == ["pending"] * 3
    assert run(["cancel-all", app, "--status", "failed", "--yes"])[0] == 2
    code, _, err = run(["cancel-all", "--yes"], env=True)
    assert code == 1 and "read-only" in err
    assert [_status(i) for i in scene.slot_waiters] == ["pending"] * 3

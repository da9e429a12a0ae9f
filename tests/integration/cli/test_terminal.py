"""A job's arguments and error are anyone's data: ``jobs``, ``dead`` and ``job`` print none of their
control characters raw (a terminal would act on them: clear the screen, set its title, write the
clipboard, overwrite a line)."""

from __future__ import annotations

import json

import dramatiq

from tests.durable import running_worker
from tests.helpers import job_of, wait_until

#: CSI (clear), OSC 0 (title), OSC 52 (clipboard), OSC 8 (hyperlink), 8-bit CSI, CR, BEL, bidi override.
EVIL = "\x1b[2J\x1b]0;owned\x07\x1b]52;c;ZXZpbA==\x07\x1b]8;;http://evil.example\x1b\\x\x9b31m\rok\u202e"
RAW = ("\x1b", "\x07", "\x9b", "\r", "\u202e")


def test_jobs_dead_and_job_print_no_control_character_raw(run, app, suite, broker):
    @dramatiq.actor(track=True, max_retries=0)
    def hostile(text):
        raise RuntimeError(text)

    message = hostile.send(EVIL)
    with running_worker(broker, threads=1):
        wait_until(lambda: job_of(message).status == "failed", what="the job fails")
    job_id = str(job_of(message).id)
    for words in (["jobs", app], ["dead", app], ["job", app, job_id], ["job", app, message.message_id],
                  ["jobs", app, "--json"], ["dead", app, "--json"], ["job", app, job_id, "--json"]):
        code, out, err = run(words)
        assert code == 0, (words, err)
        assert job_id in out, words
        assert not [c for c in RAW if c in out + err], (words, out)
    code, out, _ = run(["job", app, job_id])
    assert "\\x1b[2J" in out and "\\u202e" in out  # shown, written out
    code, out, _ = run(["job", app, job_id, "--json"])
    view = json.loads(out)
    assert view["args"] == [EVIL] and EVIL in view["last_error"]  # JSON keeps the data exactly

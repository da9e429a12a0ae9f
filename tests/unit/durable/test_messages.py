"""Unit tests of dramatiq_unique.durable.messages: rebuilding a woken job's message from its row (no services)."""

from __future__ import annotations

from dramatiq_unique import JobModel
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable.messages import job_options, rebuild
from dramatiq_unique.parking.groups import unique_key_of


def test_a_woken_job_is_its_own_message_again():
    row = JobModel(
        id=7, revision=2, message_id="m-7", actor_name="sync", queue_name="default", args=[1, "a"],
        kwargs={"full": True},
        options={"max_retries": 3, "retries": 1, "redis_message_id": "old", "eta": 1, MARKER: {"qt": "q", "id": 7}},
    )
    message = rebuild(row, {"wake": {"g": "lock:sync:x", "t": "tok"}})
    assert (message.message_id, message.actor_name, message.queue_name) == ("m-7", "sync", "default")
    assert message.args == (1, "a") and message.kwargs == {"full": True}
    assert message.options == {
        "max_retries": 3, "retries": 1,
        MARKER: {"qt": "q", "id": 7, "rev": 2, "wake": {"g": "lock:sync:x", "t": "tok"}},
    }


def test_job_options_drop_what_belongs_to_one_delivery():
    options = {"retries": 2, "traceback": "...", "requeue_timestamp": 1, "redis_message_id": "r", MARKER: {"id": 1}}
    assert job_options(options) == {"retries": 2, MARKER: {"id": 1}}
    assert job_options(options, {"id": 2}) == {"retries": 2, MARKER: {"id": 2}}


def test_a_lock_group_names_its_unique_key():
    assert unique_key_of("lock:report:0a1b") == "report:0a1b"

"""The dashboard's actions: retry, cancel, set a limit, halt; and what refuses them
(CSRF, read-only, the host's hook, basic auth, another suite)."""

from __future__ import annotations

import base64

import dramatiq
import pytest

import dramatiq_unique
from dramatiq_unique.web import make_app
from tests.durable import running_worker
from tests.helpers import job_of, wait_until
from tests.integration.web.conftest import Dash

FAILS_ONCE: set[str] = set()


@pytest.fixture
def flaky(suite):
    @dramatiq.actor(max_retries=0, track=True)
    def flaky(name):
        if name not in FAILS_ONCE:
            FAILS_ONCE.add(name)
            raise RuntimeError("first time")

    return flaky


def _dead(broker, actor, name):
    message = actor.send(name)
    with running_worker(broker, threads=1):
        wait_until(lambda: job_of(message).status == "failed", what="the job dies")
    return message


def test_retry_from_the_dead_set_and_cancel_a_waiting_job(suite, broker, dash, flaky, key_prefix):
    message = _dead(broker, flaky, key_prefix)
    response = dash.post(f"/jobs/{message.message_id}/retry", {"next": "/dead"})
    assert response.status_code == 303 and response.headers["Location"].endswith("/dead?done=retried")
    assert "The job was sent again." in dash.page("/dead?done=retried")
    assert job_of(message).status == "queued"
    assert dash.post(f"/jobs/{message.message_id}/retry").status_code == 409  # not failed any more
    with running_worker(broker, threads=1):
        wait_until(lambda: job_of(message).status == "succeeded", what="the retried job succeeds")

    later = flaky.send_with_options(args=("later",), delay=60_000)
    response = dash.post(f"/jobs/{job_of(later).id}/cancel", {"next": "//evil.example/x"})
    assert response.status_code == 303 and response.headers["Location"].startswith(f"/jobs/{job_of(later).id}")
    assert job_of(later).status == "cancelled"
    assert dash.post(f"/jobs/{job_of(later).id}/cancel").status_code == 409
    assert dash.post("/jobs/424242/retry").status_code == 404
    assert dash.post("/jobs/" + "z" * 500 + "/cancel").status_code == 404


def test_slot_limits_are_set_reset_and_halted_from_the_slots_page(suite, broker, dash):
    @dramatiq.actor(concurrency_limit=2, concurrency_key=["customer"])
    def deliver(customer):
        pass

    dramatiq_unique.set_concurrency_limit("deliver", 0, key=42)  # halted: its jobs stay parked
    message = deliver.send(42)
    with running_worker(broker, threads=1):
        wait_until(lambda: job_of(message).parked_on, what="a parked job")
    html = dash.page("/slots")
    assert "customer=42" in html and "halted" in html
    dash.token("/slots")
    group = {"actor": "deliver", "key": "customer=42", "group": f"deliver:{_digest(42)}"}
    assert dash.post("/slots/limit", {**group, "limit": "5"}).status_code == 303
    assert dramatiq_unique.concurrency_status("deliver", key=42).override == 5
    assert dash.post("/slots/halt", group).status_code == 303
    assert dramatiq_unique.concurrency_status("deliver", key=42).limit == 0
    assert dash.post("/slots/limit", {**group, "limit": "default"}).status_code == 303
    assert dramatiq_unique.concurrency_status("deliver", key=42).limit == 2
    for bad in ("-1", "x", "1e9", "", "99999999"):
        assert dash.post("/slots/limit", {**group, "limit": bad}).status_code == 400, bad
    assert dash.post("/slots/limit", {**group, "actor": "nobody", "limit": "1"}).status_code == 400
    assert dash.post("/slots/limit", {**group, "key": "customer=43", "limit": "1"}).status_code == 400
    assert dash.post("/slots/halt", {"actor": ""}).status_code == 400


def _digest(value) -> str:
    from dramatiq_unique.unique.keys import canonical, digest

    return digest(canonical({"customer": value}))


def test_a_post_without_the_right_csrf_token_or_from_another_site_is_refused(suite, broker, dash, flaky, key_prefix):
    message = _dead(broker, flaky, key_prefix)
    path = f"/jobs/{message.message_id}/retry"
    token = dash.token()
    assert dash.client.post(path, data={}).status_code == 403
    assert dash.post(path, token="0" * 64).status_code == 403
    for origin in ("https://evil.example", "null", "http://localhost.evil.example"):
        assert dash.post(path, token=token, headers={"Origin": origin}).status_code == 403, origin
    other = Dash(make_app(suite).test_client())  # another browser: its own cookie, so not this token
    assert other.post(path, token=token).status_code == 403
    assert job_of(message).status == "failed"
    assert dash.client.get(path).status_code == 405  # an action is never a GET
    behind_proxy = {"Origin": "https://ops.example", "X-Forwarded-Host": "ops.example"}
    assert dash.post(path, token=token, headers=behind_proxy).status_code == 303  # the host the browser saw


def test_read_only_shows_no_button_and_refuses_every_post(suite, broker, flaky, key_prefix):
    message = _dead(broker, flaky, key_prefix)
    dash = Dash(make_app(suite, read_only=True).test_client())
    html = dash.page("/dead")
    assert f'data-job="{message.message_id}"' in html and "csrf_token" not in html and "read-only" in html
    for path in (f"/jobs/{message.message_id}/retry", f"/jobs/{message.message_id}/cancel", "/slots/limit",
                 "/slots/halt", "/jobs"):
        assert dash.client.post(path, data={"csrf_token": "x"}).status_code == 403, path
    assert job_of(message).status == "failed"


def test_the_host_hook_decides_who_sees_and_who_acts(suite, broker, flaky, key_prefix):
    message = _dead(broker, flaky, key_prefix)
    asked = []

    def auth(request, action):
        asked.append(action)
        role = request.headers.get("X-Role")
        return role == "admin" or (role == "viewer" and action is None)

    dash = Dash(make_app(suite, auth=auth).test_client())
    assert dash.get("/dead").status_code == 403
    assert dash.get("/static/style.css").status_code == 403  # nothing is reachable around it
    viewer = {"X-Role": "viewer"}
    html = dash.page("/dead", headers=viewer)
    assert f'data-job="{message.message_id}"' in html and 'data-action="retry"' not in html
    cookie_token = _token_for(dash, headers={"X-Role": "admin"})
    assert dash.post(f"/jobs/{message.message_id}/retry", token=cookie_token, headers=viewer).status_code == 403
    assert job_of(message).status == "failed"
    assert "retry" in asked
    asked.clear()
    dash.page("/dead", headers=viewer)
    assert sorted(asked, key=str) == sorted([None, "retry", "cancel", "limit", "halt", "retry_all", "cancel_all"],
                                            key=str)  # once each
    # A hook may grant one action and not the others: only its buttons show.
    only_retry = Dash(make_app(suite, auth=lambda request, action: action in (None, "retry")).test_client())
    html = only_retry.page("/dead")
    assert 'data-action="retry"' in html and 'data-action="cancel"' not in html
    assert dash.post(f"/jobs/{message.message_id}/retry", token=cookie_token,
                     headers={"X-Role": "admin"}).status_code == 303


def _token_for(dash: Dash, **kwargs) -> str:
    from tests.integration.web.conftest import TOKEN

    return TOKEN.search(dash.page("/dead", **kwargs)).group(1)


def test_basic_auth_guards_every_request(suite, broker, flaky, key_prefix):
    message = _dead(broker, flaky, key_prefix)
    dash = Dash(make_app(suite, basic_auth=("ops", "s3cret")).test_client())
    for path in ("/", "/dead", "/static/style.css"):
        response = dash.get(path)
        assert response.status_code == 401 and response.headers["WWW-Authenticate"].startswith("Basic")
    wrong = {"Authorization": "Basic " + base64.b64encode(b"ops:nope").decode()}
    assert dash.get("/", headers=wrong).status_code == 401
    assert dash.get("/", headers={"Authorization": "Basic !!!"}).status_code == 401
    right = {"Authorization": "Basic " + base64.b64encode(b"ops:s3cret").decode()}
    token = _token_for(dash, headers=right)
    assert dash.post(f"/jobs/{message.message_id}/retry", token=token).status_code == 401
    assert dash.post(f"/jobs/{message.message_id}/retry", token=token, headers=right).status_code == 303

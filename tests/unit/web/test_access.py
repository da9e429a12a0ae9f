"""What the dashboard refuses before any view runs (no service: no suite is reached)."""

from __future__ import annotations

import base64

import pytest

from dramatiq_unique import InvalidOption
from dramatiq_unique import suite as suite_module
from dramatiq_unique.web import make_app, make_server


def test_bad_settings_are_refused_when_the_app_is_made():
    for bad in ({"auth": "yes"}, {"basic_auth": ("only-user",)}, {"basic_auth": ("u", 1)}, {"basic_auth": ("", "")},
                {"page_size": 0}, {"page_size": True}):
        with pytest.raises(InvalidOption):
            make_app(**bad)
    with pytest.raises(InvalidOption, match="basic_auth"):
        make_server(host="10.1.2.3", port=0)


def test_posts_are_refused_without_auth_token_or_when_read_only():
    client = make_app(basic_auth=("u", "p")).test_client()
    assert client.post("/jobs/1/retry").status_code == 401
    right = {"Authorization": "Basic " + base64.b64encode(b"u:p").decode()}
    assert client.post("/jobs/1/retry", headers=right).status_code == 403  # no CSRF token
    assert client.post("/jobs/1/retry", headers=right, data={"csrf_token": "f" * 64}).status_code == 403
    assert client.post("/nowhere", headers=right).status_code == 404
    assert make_app(read_only=True).test_client().post("/slots/halt").status_code == 403
    hook = make_app(auth=lambda request, action: action is None).test_client()
    assert hook.post("/slots/halt").status_code == 403
    big = make_app().test_client().post("/slots/halt", data={"csrf_token": "x" * 200_000})
    assert big.status_code == 413  # forms are small: a huge body is refused before it is parsed


def test_without_a_suite_the_pages_say_so(monkeypatch):
    monkeypatch.setattr(suite_module, "_current", None)
    response = make_app().test_client().get("/jobs")
    assert response.status_code == 503 and b"setup() has not been called" in response.data


def _basic(user: str, password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_a_basic_auth_callable_lets_in_only_on_true():
    class Inactive:  # a user row, truthy, that the check returned instead of a verdict
        active = False

    for answer in ("no", 1, [False], Inactive(), {"ok": False}):
        client = make_app(basic_auth=lambda user, password, answer=answer: answer).test_client()
        assert client.get("/static/style.css", headers=_basic("u", "p")).status_code == 401, answer

    def broken(user, password):
        raise RuntimeError("the password store is down")

    failing = make_app(basic_auth=broken).test_client()
    assert failing.get("/static/style.css", headers=_basic("u", "p")).status_code == 401
    right = make_app(basic_auth=lambda user, password: (user, password) == ("u", "p")).test_client()
    assert right.get("/static/style.css", headers=_basic("u", "p")).status_code == 200
    assert right.get("/static/style.css", headers=_basic("u", "x")).status_code == 401

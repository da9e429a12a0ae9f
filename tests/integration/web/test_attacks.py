"""What an attacker tries: markup in what the pages reflect, a hook that fails, forged outcomes."""

from __future__ import annotations

import dramatiq

import dramatiq_unique
from dramatiq_unique.web import make_app
from tests.helpers import job_of
from tests.integration.web.conftest import Dash

XSS = '"><script>alert(1)</script>'


def test_nothing_a_request_sends_comes_back_as_markup(suite, dash):
    @dramatiq.actor(track=True)
    def noted(n):
        pass

    noted.send(1)
    for path in (f"/jobs?key={XSS}", f"/jobs?actor={XSS}", f"/jobs/{XSS}", f"/dead?actor={XSS}",
                 f"/jobs?status={XSS}", f"/?done={XSS}", "/jobs?key=%3Cb%3E=1"):
        html = dash.get(path).get_data(as_text=True)
        assert "<script>alert(1)" not in html and "<b>" not in html, path
    assert "The job was sent again." not in dash.page("/?done=anything") + "x"  # only known words
    response = dash.get("/")
    assert "script-src" not in response.headers["Content-Security-Policy"]  # default-src 'none': no script at all
    assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_a_hook_that_raises_or_answers_other_than_true_lets_nothing_through(suite, broker):
    @dramatiq.actor(track=True)
    def later(n):
        pass

    message = later.send_with_options(args=(1,), delay=60_000)

    def broken(request, action):
        raise RuntimeError("the host's session store is down")

    dash = Dash(make_app(suite, auth=broken).test_client())
    assert dash.get("/").status_code == 403
    assert Dash(make_app(suite, auth=lambda request, action: "no").test_client()).get("/").status_code == 403
    assert dash.client.post(f"/jobs/{job_of(message).id}/cancel", data={"csrf_token": "x"}).status_code == 403
    assert job_of(message).status == "queued"


def test_a_hook_that_refuses_halt_is_asked_halt_for_every_form_that_halts(suite, broker):
    @dramatiq.actor(concurrency_limit=2, concurrency_key=["customer"])
    def deliver(customer):
        pass

    @dramatiq.actor(track=True)
    def tracked_only(n):
        pass

    asked = []

    def no_halting(request, action):
        asked.append(action)
        return action != "halt"

    dash = Dash(make_app(suite, auth=no_halting).test_client())
    dramatiq_unique.set_concurrency_limit("deliver", 1, key=42)  # the group shows, with its buttons
    dash.token("/slots")
    group = {"actor": "deliver", "key": "customer=42"}

    def post(path, **form):
        asked.clear()
        status = dash.post(path, {**group, **form}).status_code
        return status, asked[0] if asked else None  # the action's own question comes first

    def limit():
        return dramatiq_unique.concurrency_status("deliver", key=42).limit

    assert post("/slots/limit", limit="3") == (303, "limit") and limit() == 3
    # A limit of 0 halts, whichever form sends it and however it is written.
    for zero in ("0", "00", " 0 ", "000000"):
        assert post("/slots/limit", limit=zero) == (403, "halt"), zero
    assert post("/slots/halt") == (403, "halt")
    for not_a_number in ("\u0660", "\u00b2", "\uff10", "0x0", "-0", "1" * 5000):  # int("\u0660") == 0
        assert post("/slots/limit", limit=not_a_number)[0] == 400, ascii(not_a_number)
    for other in ({"actor": "nobody"}, {"actor": "tracked_only"}):  # refused, not a 500
        assert post("/slots/limit", limit="default", **other)[0] == 400, other
    assert limit() == 3
    # Back to the default is a halt when the default it falls back to is 0 (the actor halted as a whole).
    assert post("/slots/limit", limit="default") == (303, "limit") and limit() == 2
    dramatiq_unique.set_concurrency_limit("deliver", 5, key=42)
    dramatiq_unique.set_concurrency_limit("deliver", 0)
    assert post("/slots/limit", limit="default") == (403, "halt") and limit() == 5
    # The redirect after an action never leaves the site, whatever the form says.
    response = dash.post("/slots/limit", {**group, "limit": "4", "next": "/\t/evil.example"})
    assert response.headers["Location"] == "/slots?done=limit"

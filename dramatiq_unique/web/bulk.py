"""The bulk actions of the dashboard: retry the dead set (or one actor's dead jobs), cancel the waiting
jobs a filter of the jobs page matches.

Two steps, as the command line asks before it acts: a page (GET) that counts what would be done and
shows a form to confirm it, then the action (POST), which the app's ``before_request`` has checked
like any other (basic auth, CSRF, read-only, and the host's hook, asked ``"retry_all"`` or
``"cancel_all"``: a hook may allow one job's retry and not the whole dead set's).  The confirmation
page is offered only to whom the hook allows the action.  The action goes through the ops layer
(:mod:`dramatiq_unique.ops.actions`): one UPDATE per job table and store.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, abort, current_app, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from dramatiq_unique.durable.bulk_actions import CANCEL, RETRY, Selection
from dramatiq_unique.ops import actions
from dramatiq_unique.storage.models import utcnow
from dramatiq_unique.web import security
from dramatiq_unique.web.pages import MAX_FILTER, SINCE
from dramatiq_unique.web.state import current_suite

#: The action each step names to the host's hook.
ACTION = {RETRY: "retry_all", CANCEL: "cancel_all"}
#: The filters each action takes from the page it is started on.
FIELDS = {RETRY: ("actor", "error"), CANCEL: ("actor", "key", "status", "since")}


def _filters(action: str, source: Any) -> dict[str, str]:
    found = {}
    for name in FIELDS[action]:
        value = str(source.get(name, "")).strip()
        if len(value) > MAX_FILTER:
            abort(400, f"{name} is too long")
        if value:
            found[name] = value
    if "since" in found and found["since"] not in SINCE:
        abort(400, f"since must be one of {', '.join(SINCE)}")
    return found


def _selection(action: str, filters: dict[str, str]) -> Selection:
    since = utcnow() - SINCE[filters["since"]] if "since" in filters else None
    try:
        return actions.selection(current_suite(), action, actor=filters.get("actor"), key=filters.get("key"),
                              since=since, error=filters.get("error"), status=filters.get("status"))
    except ValueError as e:
        abort(400, str(e))


def _allowed(action: str) -> None:
    if not security.can(current_app.config["DU_ACCESS"], ACTION[action]):
        abort(403, f"not allowed to {ACTION[action]}")


def confirm(action: str) -> str:
    _allowed(action)
    filters = _filters(action, request.args)
    sel = _selection(action, filters)
    found = actions.preview(current_suite(), None, action, sel)
    return render_template("bulk.html", verb=action, endpoint=ACTION[action], found=found, filters=filters,
                           what=actions.described(action, sel, filters.get("key")),
                           back=_url("dead" if action == RETRY else "jobs", filters), down=found.down)


def act(action: str) -> Response:
    filters = _filters(action, request.form)
    done = actions.act(current_suite(), None, action, _selection(action, filters))
    page, word = ("dead", "retried_all") if action == RETRY else ("jobs", "cancelled_all")
    values: dict[str, Any] = {name: value for name, value in filters.items() if name != "error"}  # no such filter there
    values.update(done=word, n=done.done)
    if done.blocked:
        values["blocked"] = done.blocked
    return redirect(_url(page, values), code=303)


def _url(endpoint: str, values: dict[str, Any]) -> str:
    return url_for(endpoint, **values)


def retry_all_confirm() -> str:
    return confirm(RETRY)


def cancel_all_confirm() -> str:
    return confirm(CANCEL)


def retry_all() -> Response:
    return act(RETRY)


def cancel_all() -> Response:
    return act(CANCEL)


def register(app: Flask) -> None:
    app.add_url_rule("/dead/retry-all", "retry_all_confirm", retry_all_confirm, methods=["GET"])
    app.add_url_rule("/dead/retry-all", "retry_all", retry_all, methods=["POST"])
    app.add_url_rule("/jobs/cancel-all", "cancel_all_confirm", cancel_all_confirm, methods=["GET"])
    app.add_url_rule("/jobs/cancel-all", "cancel_all", cancel_all, methods=["POST"])

"""The actions (POST): retry or cancel a job, set or halt a slot group's limit, retry the dead set or
cancel what a filter matches (after a page that counts it), each through the suite's own functions, so
nothing its rules refuse.  Access was checked before (``before_request``); a success redirects."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Union
from urllib.parse import unquote

from flask import abort, current_app, redirect, render_template, request, url_for
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response

from dramatiq_unique import ops
from dramatiq_unique.durable import bulk_actions
from dramatiq_unique.durable.bulk_actions import CANCEL, RETRY, Selection
from dramatiq_unique.durable.dead import cancel_job, retry_job
from dramatiq_unique.errors import AmbiguousJobId, DuplicateJob, InvalidOption, JobNotFound, JobStateError
from dramatiq_unique.ops import actions as ops_actions
from dramatiq_unique.slots.limits import concurrency_status, set_group_limit
from dramatiq_unique.web import pages, security
from dramatiq_unique.web.pages import current_suite, since

#: The largest limit a form may set (a typo of many digits is refused, not stored).
MAX_LIMIT = 1_000_000
#: The longest ``next`` kept (a page's own path and query are far shorter).
MAX_NEXT = 2_000


def _path_ok(path: str) -> bool:
    """Whether ``path`` (no query) is an absolute path of this site that no browser reads as another's:
    printable ASCII, no backslash (read as ``/``), no empty, ``.`` or ``..`` segment (``/.//evil``)."""
    if not path.startswith("/") or "\\" in path or not all("!" <= c <= "~" for c in path):
        return False
    segments = path.split("/")[1:]
    return all(s not in ("", ".", "..") for s in segments[:-1]) and segments[-1] not in (".", "..")


def local_target(target: str) -> Optional[str]:
    """``target`` if it is a path (and query) of this site that no browser can read as another site's,
    else None.  The path is checked as sent and percent-decoded (a proxy or a later redirect may
    decode ``%2F``, ``%5C``, ``%09``), to the bottom of any double encoding."""
    if not target or len(target) > MAX_NEXT or not all("!" <= c <= "~" for c in target):
        return None
    path = target.split("?", 1)[0]
    for _ in range(4):
        if not _path_ok(path):
            return None
        decoded = unquote(path)
        if decoded == path:
            return target
        path = decoded
    return None  # encoded more deeply than any page of ours


def _back(done: str, fallback: str) -> Response:
    """Back to the page the form was on (a path of this app only, see :func:`local_target`), with the
    outcome's word; else to ``fallback`` (a path the app built)."""
    local = local_target(request.form.get("next", ""))
    target = fallback if local is None else (request.script_root or "") + local
    path, _, query = target.split("#", 1)[0].partition("?")
    kept = [part for part in query.split("&") if part and not part.startswith("done=")]
    return redirect(path + "?" + "&".join([*kept, f"done={done}"]), code=303)


def _refused(call: Callable[[], Any]) -> Any:
    """Runs the action; its refusals as HTTP errors (a dependency down: 503, by the app's handler)."""
    try:
        return call()
    except JobNotFound as e:
        abort(404, str(e))
    except DuplicateJob as e:
        holder = getattr(e.job, "id", None)
        abort(409, f"{e}" + (f" (job {holder} holds its key)" if holder is not None else ""))
    except (JobStateError, AmbiguousJobId) as e:
        abort(409, str(e))
    except (InvalidOption, ValueError, TypeError) as e:
        abort(400, str(e))


def one_job(action: str, ref: str) -> Response:
    if not ref or len(ref) > 64 or not ref.isprintable():  # what cannot be a job's id is no job (404, not 400)
        abort(404, "no such job")
    if action == "retry":
        job = _refused(lambda: retry_job(ref, suite=current_suite()))
        return _back("retried", url_for("job", ref=job.message_id))  # its number may be another store's too
    _refused(lambda: cancel_job(ref, suite=current_suite()))
    return _back("cancelled", url_for("job", ref=ref))


def _group_key() -> tuple[str, Any]:
    actor = request.form.get("actor", "").strip()
    if not actor or len(actor) > 200:
        abort(400, "which actor?")
    words, group = request.form.get("key", ""), request.form.get("group", "")
    return actor, _refused(lambda: ops.limit_target(current_suite(), actor, words, group))


def requested_limit() -> Optional[int]:
    """The form's limit (None: ``default``), read alike by the view and :func:`_limit_action`."""
    return ops_actions.limit_value(request.form.get("limit", ""), MAX_LIMIT)


def _limit_action() -> str:
    """What a limit form does: "halt" for a limit of 0, or for removing an override when what the group falls
    back to is 0 (the actor's override or declared limit, for a group; the declared limit, for the actor)."""
    try:
        value = requested_limit()
    except ValueError:  # refused by the view (400): nothing is done
        return "limit"
    if value is None:
        try:
            actor, key = _group_key()
            whole = concurrency_status(actor, None, suite=current_suite())
        except (HTTPException, InvalidOption):  # a form the view refuses (400): nothing is done
            return "limit"
        value = whole.limit if key.group else whole.default
    return "halt" if value == 0 else "limit"


def limit(halt: bool = False) -> Response:
    actor, key = _group_key()
    value = 0 if halt else _refused(requested_limit)
    _refused(lambda: set_group_limit(actor, key.group, value, suite=current_suite(), words=key.words, key=key.key))
    return _back("default" if value is None else ("halted" if value == 0 else "limit"), url_for("slots"))


#: The filters each bulk action takes from the page it is started on.
FIELDS = {RETRY: ("actor", "error"), CANCEL: ("actor", "key", "status", "since")}


def _selection(action: str, found: dict[str, Any]) -> Selection:
    return _refused(lambda: ops_actions.selection(current_suite(), action, **{**found, "since": since(found)}))


def confirm(action: str) -> str:
    """The page that counts what a bulk action would do, offered only to whom the hook allows it."""
    if not security.can(current_app.config["DU_ACCESS"], f"{action}_all"):
        abort(403, f"not allowed to {action}_all")
    filters = pages.filters(FIELDS[action], request.args)
    sel = _selection(action, filters)
    found = bulk_actions.preview(current_suite(), current_suite().broker, action, sel)
    return render_template("bulk.html", verb=action, endpoint=f"{action}_all", found=found, filters=filters,
                           what=ops_actions.described(action, sel, filters.get("key")),
                           back=url_for("dead" if action == RETRY else "jobs", **filters), down=found.down)


def act(action: str) -> Response:
    filters = pages.filters(FIELDS[action], request.form)
    done = ops_actions.BULK[action](current_suite(), current_suite().broker, _selection(action, filters))
    page, word = ("dead", "retried_all") if action == RETRY else ("jobs", "cancelled_all")
    kept = {name: value for name, value in filters.items() if name != "error"}  # no such filter there
    # url_for leaves a None out of the query: ``blocked`` is said only when some were.
    return redirect(url_for(page, **kept, done=word, n=done.done, blocked=done.blocked or None), code=303)


#: (rule, endpoint, view, method, the action the auth hook is asked about, or what tells it) of every
#: action, and of the pages that confirm a bulk one.  The action is decided by what the request does, not
#: by its route (a limit of 0 is a halt, whichever form sends it), and asked after the CSRF check, before
#: the view; an endpoint without one cannot be POSTed to (404).
ROUTES: list[tuple[str, str, Any, str, Union[str, Callable[[], str], None]]] = [
    ("/jobs/<ref>/retry", "retry", functools.partial(one_job, "retry"), "POST", "retry"),
    ("/jobs/<ref>/cancel", "cancel", functools.partial(one_job, "cancel"), "POST", "cancel"),
    ("/slots/limit", "limit", limit, "POST", _limit_action),
    ("/slots/halt", "halt", functools.partial(limit, halt=True), "POST", "halt"),
    ("/dead/retry-all", "retry_all_confirm", functools.partial(confirm, RETRY), "GET", None),
    ("/dead/retry-all", "retry_all", functools.partial(act, RETRY), "POST", "retry_all"),
    ("/jobs/cancel-all", "cancel_all_confirm", functools.partial(confirm, CANCEL), "GET", None),
    ("/jobs/cancel-all", "cancel_all", functools.partial(act, CANCEL), "POST", "cancel_all"),
]
ACTION_OF = {endpoint: action_of for _, endpoint, _, _, action_of in ROUTES if action_of is not None}

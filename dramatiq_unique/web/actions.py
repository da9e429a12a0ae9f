"""The actions (POST): retry and cancel a job, set a slot group's limit, halt a group.

Each goes through the ops layer to the public function a user's code would
call (``retry_job``, ``cancel_job``, ``set_concurrency_limit``), for the
dashboard's suite, so the dashboard changes nothing the suite's own rules would
refuse.  The app's ``before_request`` has already
checked basic auth, the host's hook, read-only and the CSRF token by the time a
view here runs.  A success redirects (POST, redirect, GET: a reload does not
repeat it); a refusal renders the error page with the status that says why.
"""

from __future__ import annotations

from typing import Any, Callable, Optional
from urllib.parse import unquote

from flask import Flask, abort, redirect, request, url_for
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response

from dramatiq_unique import ops
from dramatiq_unique.durable.cancel import cancel_job
from dramatiq_unique.durable.dead import retry_job
from dramatiq_unique.errors import AmbiguousJobId, DuplicateJob, InvalidOption, JobNotFound, JobStateError
from dramatiq_unique.slots.limits import concurrency_status
from dramatiq_unique.web import data
from dramatiq_unique.web.state import current_suite

#: The largest limit a form may set (a typo of many digits is refused, not stored).
MAX_LIMIT = 1_000_000


def job_ref(ref: str) -> str:
    """A job's id or message id from the URL; what cannot be one is no job (404, not 400)."""
    if not ref or len(ref) > 64 or not ref.isprintable():
        abort(404, "no such job")
    return ref


#: The longest ``next`` kept (a page's own path and query are far shorter).
MAX_NEXT = 2_000


def _path_ok(path: str) -> bool:
    """Whether ``path`` (no query) is an absolute path of this site that reads as nothing else.

    Printable ASCII only, no backslash, no empty, ``.`` or ``..`` segment: browsers drop tabs and
    newlines anywhere in a URL and read ``\\`` as ``/``, so ``/<TAB>/evil.example`` and ``/\\evil.example``
    become ``//evil.example``, another site; and ``/.//evil.example`` is ``//evil.example`` once
    its dot segments are removed.  The pages' own paths (``request.full_path``) are none of these.
    """
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


def retry(ref: str) -> Response:
    job = _refused(lambda: retry_job(job_ref(ref), suite=current_suite()))
    return _back("retried", url_for("job", ref=job.message_id))  # its number may be another store's too


def cancel(ref: str) -> Response:
    _refused(lambda: cancel_job(job_ref(ref), suite=current_suite()))
    return _back("cancelled", url_for("job", ref=ref))


def _group_key() -> tuple[str, Any]:
    actor = request.form.get("actor", "").strip()
    if not actor or len(actor) > 200:
        abort(400, "which actor?")
    words, group = request.form.get("key", ""), request.form.get("group", "")
    return actor, _refused(lambda: data.slot_target(current_suite(), actor, words, group))


def requested_limit() -> Optional[int]:
    """The limit the form asks for (None: ``default``); ValueError for anything else.  The view and
    the action's name (:func:`_limit_action`) read it through this one function, so what the hook is
    asked about is what is done.  ASCII digits only: ``"\\u0660"`` is a digit to ``int()`` (a zero)."""
    raw = request.form.get("limit", "").strip()
    if raw == "default":
        return None
    if raw.isascii() and raw.isdigit() and len(raw) <= len(str(MAX_LIMIT)) and int(raw) <= MAX_LIMIT:
        return int(raw)
    raise ValueError(f"a limit is a whole number from 0 to {MAX_LIMIT}, or default")


def _default_halts() -> bool:
    """Whether removing the form's override leaves its group halted: what it falls back to (the actor's
    override or declared limit, for a group; the declared limit, for the actor) is 0."""
    try:
        actor, key = _group_key()
        whole = concurrency_status(actor, None, suite=current_suite())
    except (HTTPException, InvalidOption):  # a form the view refuses (400): nothing is done
        return False
    return (whole.limit if key.group else whole.default) == 0


def _limit_action() -> str:
    try:
        value = requested_limit()
    except ValueError:  # refused by the view (400): nothing is done
        return "limit"
    return "halt" if value == 0 or (value is None and _default_halts()) else "limit"


#: The action each endpoint that changes state does, as the auth hook is asked about it: decided by what
#: the request does, not by its route (a limit of 0 is a halt, whichever form sends it).  Called after
#: the CSRF check, before the view.  An endpoint missing here cannot be POSTed to (404).
ACTION_OF: dict[str, Callable[[], str]] = {
    "retry": lambda: "retry",
    "cancel": lambda: "cancel",
    "limit": _limit_action,
    "halt": lambda: "halt",
    "retry_all": lambda: "retry_all",
    "cancel_all": lambda: "cancel_all",
}


def limit() -> Response:
    actor, key = _group_key()
    try:
        value = requested_limit()
    except ValueError as e:
        abort(400, str(e))
    _refused(lambda: ops.set_group_limit(current_suite(), actor, key.group, value, words=key.words, key=key.key))
    return _back("default" if value is None else ("halted" if value == 0 else "limit"), url_for("slots"))


def halt() -> Response:
    actor, key = _group_key()
    _refused(lambda: ops.set_group_limit(current_suite(), actor, key.group, 0, words=key.words, key=key.key))
    return _back("halted", url_for("slots"))


def register(app: Flask) -> None:
    app.add_url_rule("/jobs/<ref>/retry", "retry", retry, methods=["POST"])
    app.add_url_rule("/jobs/<ref>/cancel", "cancel", cancel, methods=["POST"])
    app.add_url_rule("/slots/limit", "limit", limit, methods=["POST"])
    app.add_url_rule("/slots/halt", "halt", halt, methods=["POST"])

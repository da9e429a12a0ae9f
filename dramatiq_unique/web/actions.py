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

from flask import Flask, abort, redirect, request, url_for
from werkzeug.wrappers import Response

from dramatiq_unique import ops
from dramatiq_unique.errors import DuplicateJob, InvalidOption, JobNotFound, JobStateError
from dramatiq_unique.web import data
from dramatiq_unique.web.state import current_suite

#: The largest limit a form may set (a typo of many digits is refused, not stored).
MAX_LIMIT = 1_000_000


def job_ref(ref: str) -> str:
    """A job's id or message id from the URL; what cannot be one is no job (404, not 400)."""
    if not ref or len(ref) > 64 or not ref.isprintable():
        abort(404, "no such job")
    return ref


def _back(done: str, fallback: str) -> Response:
    """Back to the page the form was on (a path of this app only), with the outcome's word."""
    target = request.form.get("next", "")
    # Only a path of ours: "//host" or "/\\host" would leave the site (an open redirect).
    if not target.startswith("/") or target.startswith(("//", "/\\")) or "\n" in target or "\r" in target:
        target = fallback
    else:
        target = (request.script_root or "") + target
    path, _, query = target.partition("?")
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
    except JobStateError as e:
        abort(409, str(e))
    except (InvalidOption, ValueError, TypeError) as e:
        abort(400, str(e))


def retry(ref: str) -> Response:
    job = _refused(lambda: ops.retry(current_suite(), job_ref(ref)))
    return _back("retried", url_for("job", ref=str(job.id) if job.id is not None else ref))


def cancel(ref: str) -> Response:
    _refused(lambda: ops.cancel(current_suite(), job_ref(ref)))
    return _back("cancelled", url_for("job", ref=ref))


def _group_key() -> tuple[str, Any]:
    actor = request.form.get("actor", "").strip()
    if not actor or len(actor) > 200:
        abort(400, "which actor?")
    words, group = request.form.get("key", ""), request.form.get("group", "")
    return actor, _refused(lambda: data.slot_target(current_suite(), actor, words, group))


def limit() -> Response:
    actor, key = _group_key()
    raw = request.form.get("limit", "").strip()
    if raw == "default":
        value: Optional[int] = None
    elif raw.isdigit() and int(raw) <= MAX_LIMIT:
        value = int(raw)
    else:
        abort(400, f"a limit is a whole number from 0 to {MAX_LIMIT}, or default")
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

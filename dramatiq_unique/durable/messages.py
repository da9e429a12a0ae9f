"""Between a job's row and its messages: what a job keeps of a message, and its message rebuilt from the row.

Arguments and options the JSON columns cannot hold (an app with another encoder) are stored in the app's
encoding and come back as the very value.
"""

from __future__ import annotations

import base64
import calendar
from typing import TYPE_CHECKING, Any, Optional

import dramatiq
from dramatiq import Message
from dramatiq.common import current_millis
from dramatiq.encoder import JSONEncoder

from dramatiq_unique.broker.refs import REDIS_MESSAGE_ID
from dramatiq_unique.context import MARKER
from dramatiq_unique.errors import JobRejected

if TYPE_CHECKING:
    from dramatiq_unique.storage.models import JobModel

#: Message options that belong to one delivery, not to the job.
TRANSIENT_OPTIONS = frozenset({REDIS_MESSAGE_ID, "eta", "traceback", "requeue_timestamp"})
#: The job marker's entry holding the attempts a failed job had when retry_job sent it again:
#: Retries counts only the failed attempts after it.
RETRY_BASE = "rb"

#: The key that marks an argument stored in the app's encoding: ``{ENCODED: base64 of its bytes, "repr": ...}``.
ENCODED = "__dramatiq_unique_encoded__"
#: How much of an encoded argument's repr its row keeps for a reader.
REPR_LENGTH = 200

_SCALARS = frozenset({str, int, bool, type(None), float})


def _fits(value: Any, strict: bool) -> bool:
    """Whether the JSON column gives ``value`` back as the app's encoder would: exact types only (an IntEnum
    would come back plain); ``strict`` (an encoder other than JSON) keeps tuples and non-str dict keys."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is list or (kind is tuple and not strict):
        return all(_fits(item, strict) for item in value)
    if kind is dict:
        keys = (str,) if strict else _SCALARS
        return all(type(k) in keys and _fits(v, strict) for k, v in value.items())
    return False


def _stored(value: Any, strict: bool, where: str) -> Any:  # itself, or its bytes in the app's encoding
    if _fits(value, strict):
        return value
    encoder = dramatiq.get_encoder()
    try:
        data = encoder.encode(value)
    except Exception as e:
        raise JobRejected(f"{where} ({type(value).__name__}) cannot be stored: "
                          f"neither JSON nor {type(encoder).__name__} encodes it: {e}") from e
    return {ENCODED: base64.b64encode(data).decode("ascii"), "repr": repr(value)[:REPR_LENGTH]}


def args_to_row(args: Any, kwargs: dict) -> tuple[list, dict]:
    strict = not isinstance(dramatiq.get_encoder(), JSONEncoder)
    return ([_stored(a, strict, f"argument {i}") for i, a in enumerate(args)],
            {k: _stored(v, strict, f"argument {k}") for k, v in kwargs.items()})


def _decode(value: Any) -> Any:
    if type(value) is dict and ENCODED in value:
        return dramatiq.get_encoder().decode(base64.b64decode(value[ENCODED]))
    return value


def options_to_row(options: dict) -> dict:
    strict = not isinstance(dramatiq.get_encoder(), JSONEncoder)
    if all(_fits(v, strict) for v in options.values()):
        return options  # the common case: nothing to copy
    return {k: _stored(v, strict, f"option {k}") for k, v in options.items()}


def args_from_row(args: Any, kwargs: Any) -> tuple[tuple, dict]:
    return tuple(_decode(a) for a in args or ()), {k: _decode(v) for k, v in (kwargs or {}).items()}


def job_options(options: dict, marker: Optional[dict] = None) -> dict:
    """A message's options as a job keeps them: no per-delivery ones; ``marker`` replaces the suite's."""
    kept = {k: v for k, v in options.items() if k not in TRANSIENT_OPTIONS}
    if marker is not None:
        kept[MARKER] = marker
    return kept


def rebuild(row: "JobModel", marker: Optional[dict] = None, *, timestamp: Optional[int] = None) -> Message:
    """The job's message from its row, marked as the row's current revision, with ``marker``'s entries."""
    options = {k: _decode(v) for k, v in job_options(row.options or {}).items()}
    options[MARKER] = {**(options.get(MARKER) or {}), "id": row.id, "rev": row.revision, **(marker or {})}
    args, kwargs = args_from_row(row.args, row.kwargs)
    return Message(queue_name=row.queue_name, actor_name=row.actor_name, args=args, kwargs=kwargs, options=options,
                   message_id=row.message_id, message_timestamp=current_millis() if timestamp is None else timestamp)


def build_message(row: "JobModel") -> Message:
    """The job's message rebuilt to be sent again, stamped with its creation time, its Retries count kept."""
    created = row.created_at  # naive UTC, as Dramatiq's timestamp
    message = rebuild(row, timestamp=calendar.timegm(created.utctimetuple()) * 1000 + created.microsecond // 1000)
    if row.attempts:
        # Retries counts failed attempts in the message; every attempt so far failed.
        message.options["retries"] = retries_so_far(row)
    return message


def retries_so_far(row: "JobModel") -> int:
    """The failed attempts Dramatiq's Retries counts: those since :func:`dramatiq_unique.retry_job` last
    sent the job again, if it did."""
    base = ((row.options or {}).get(MARKER) or {}).get(RETRY_BASE, 0)
    return max(row.attempts - int(base), 0)

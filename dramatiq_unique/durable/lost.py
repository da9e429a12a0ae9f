"""What the re-drive asks about a lost job: its actor's options, and whether Retries would give up."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dramatiq
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import Retries

from dramatiq_unique.durable import claims
from dramatiq_unique.errors import DramatiqUniqueError

if TYPE_CHECKING:
    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import Suite


class JobLost(DramatiqUniqueError):
    """The job's message is in none of the broker's queues"""


def actor_options(suite: "Suite", broker: dramatiq.Broker, actor_name: str) -> dict:
    """The actor's options, as this process's suite or ``broker`` knows them ({} if neither does)."""
    config = suite.actor_config(actor_name)
    if config is not None:
        return config.options
    try:
        return broker.get_actor(actor_name).options
    except ActorNotFound:
        return {}


def retries_exhausted(suite: "Suite", broker: dramatiq.Broker, row: "JobModel") -> bool:
    """Whether Dramatiq's Retries would give up after this (lost) attempt, decided as it decides."""
    retries_mw = next((m for m in broker.middleware if isinstance(m, Retries)), None)
    if retries_mw is None:
        return True  # without Retries a failed attempt is final
    options, row_options = actor_options(suite, broker, row.actor_name), row.options or {}
    retries = max(claims.retries_so_far(row) - 1, 0)  # a retry_job() restarts the count
    retry_when = options.get("retry_when", retries_mw.retry_when)
    if retry_when is not None:
        return not retry_when(retries, JobLost(row.message_id))
    max_retries = row_options.get("max_retries", options.get("max_retries", retries_mw.max_retries))
    return max_retries is not None and retries >= max_retries

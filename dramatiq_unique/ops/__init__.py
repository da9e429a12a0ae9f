"""What an operator sees and does, for the command line and the dashboard alike.

Every function takes the suite first and returns plain dataclasses
(:mod:`dramatiq_unique.ops.views`, each with ``as_dict()`` for JSON)::

    jobs(suite, *, status=None, actor=None, key=None, since=None, limit=50, cursor=None) -> Page
    job(suite, id_or_message_id) -> JobView
    locks(suite) -> list[LockView]
    slots(suite, *, actor=None) -> list[SlotGroupView]
    stats(suite, *, minutes=15) -> Stats
    dead(suite, *, actor=None, since=None, limit=100) -> list[JobRow]
    prune(suite, broker) -> int
    retry(suite, id_or_message_id) / cancel(suite, id_or_message_id) -> JobModel
    set_limit(suite, actor, limit, key=None) / limit_status(suite, actor, key=None) -> ConcurrencyStatus
    limits(suite, *, actor=None) -> list[OverrideView]
    limit_target(suite, config, text) -> Target; set_group_limit(suite, actor, group, limit, ...) -> ConcurrencyStatus

Nothing below this package imports it.
"""

from dramatiq_unique.ops.actions import cancel, dead, limit_status, prune, retry, set_group_limit, set_limit
from dramatiq_unique.ops.detail import job
from dramatiq_unique.ops.held import limits, locks, slots
from dramatiq_unique.ops.labels import limit_key
from dramatiq_unique.ops.limitkeys import resolve as limit_target
from dramatiq_unique.ops.listing import jobs
from dramatiq_unique.ops.stats import stats
from dramatiq_unique.ops.views import (
    Attempt,
    JobRow,
    JobView,
    LockView,
    OverrideView,
    Page,
    SlotGroupView,
    Stats,
    Waiting,
)
from dramatiq_unique.ops.words import why

__all__ = [
    "Attempt", "JobRow", "JobView", "LockView", "OverrideView", "Page", "SlotGroupView", "Stats", "Waiting",
    "cancel", "dead", "job", "jobs", "limit_key", "limit_status", "limit_target", "limits", "locks", "prune", "retry",
    "set_group_limit", "set_limit", "slots", "stats", "why",
]

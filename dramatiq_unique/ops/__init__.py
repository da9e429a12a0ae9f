"""What an operator sees and does, for the command line and the dashboard alike: functions that take
the suite first and return plain dataclasses (:mod:`dramatiq_unique.ops.views`), which both only present.
Nothing below this package imports it."""

from dramatiq_unique.ops.actions import dead, prune
from dramatiq_unique.ops.detail import job
from dramatiq_unique.ops.held import limits, locks, slots
from dramatiq_unique.ops.keys import limit_target
from dramatiq_unique.ops.listing import jobs
from dramatiq_unique.ops.stats import stats

__all__ = ["dead", "job", "jobs", "limit_target", "limits", "locks", "prune", "slots", "stats"]

"""Rows in a combination of columns that no state allows: found by the re-drive, and set right.

A row is in one state at a time, and every state has a way out that a waker or the
re-drive takes:

* ``pending`` and parked (``parked_on`` set): woken when its gate has no holder (parking/lot.py);
* ``pending``, not parked: sent once due (``process_after``);
* ``queued`` or ``retrying``: sent once due if it never reached the broker, else looked
  for in the broker once overdue (``process_after``, ``enqueued_at``);
* ``running``: looked for once its lease (``lease_until``) ran out;
* finished: pruned after ``retention``.

A row outside these has no way out: a parked row that is not ``pending`` (wakers take
only ``pending`` rows, and the sends skip parked ones), a ``running`` row without a
lease, a waiting row without a due time, a ``queued`` row without the time it was sent.
No path of the suite writes one, as far as its tests know; should one all the same (a
path nobody thought of, a row edited by hand), the job would wait for ever, silently.
So each pass of the re-drive looks for them, at most once per ``lost_after``: each is
set right (see :data:`REPAIRS`) with an ERROR logged, and then takes the way out of its
state.  A repair only adds what the state lacks; it never runs or fails a job itself.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable

from dramatiq_unique.observe import events
from dramatiq_unique.storage.models import WAITING, JobModel, JobStatus, utcnow

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

PENDING, QUEUED, RUNNING = JobStatus.PENDING.value, JobStatus.QUEUED.value, JobStatus.RUNNING.value

#: (what is wrong, the rows, the fields that set them right), each a function of the table.
REPAIRS: tuple[tuple[str, Callable[[Any], Any], Callable[[Any], dict]], ...] = (
    # Not pending: no waker takes it.  Out of the group, the row's own state has its way out.
    ("parked but not pending", lambda m: m.parked_on.is_null(False) & (m.status != PENDING),
     lambda m: {m.parked_on: None}),
    # The lost-message check waits for a lease that ran out: one that runs out now.
    ("running without a lease", lambda m: (m.status == RUNNING) & m.lease_until.is_null(),
     lambda m: {m.lease_until: utcnow()}),
    # The sends and the lost-message check wait until it is due: due since it was sent.
    ("waiting without a due time", lambda m: m.status.in_(WAITING) & m.process_after.is_null(),
     lambda m: {m.process_after: m.created_at}),
    # The lost-message check waits until its message is overdue: sent now, as far as it can tell.
    ("queued without the time it was sent", lambda m: (m.status == QUEUED) & m.enqueued_at.is_null(),
     lambda m: {m.enqueued_at: utcnow()}),
)

_last: "weakref.WeakKeyDictionary[Suite, dict[type[JobModel], float]]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def due(suite: "Suite", model: type[JobModel]) -> bool:
    """Whether this process's last look at ``model`` is ``lost_after`` old (and take this one).

    The looks are not free (a parked backlog or a queued one is read through), and a
    repaired row waits ``lost_after`` for the lost-message check anyway."""
    now = time.monotonic()
    with _lock:
        seen = _last.setdefault(suite, {})
        last = seen.get(model)
        if last is not None and (now - last) * 1000 < float(suite.settings.lost_after):
            return False
        seen[model] = now
        return True


def repair(model: type[JobModel], scope: Any) -> int:
    """Set right the rows of ``model`` (of ``scope``, a :meth:`Scope.where` condition) found in a
    combination no state allows; returns how many.  Each is one conditional UPDATE: a row that
    moved on meanwhile no longer matches."""
    repaired = 0
    for what, rows, fields in REPAIRS:
        cond = rows(model) & scope
        found = list(
            model.update(fields(model)).where(cond)
            .returning(model.id, model.message_id, model.actor_name, model.status, model.unique_key).execute()
        )
        for row in found:
            logger.error("Job %s (%s, row %s) was %s (status %s), a state nothing takes it out of; the re-drive "
                         "repaired its row.  A path of the suite left it so: please report it.",
                         row.message_id, row.actor_name, row.id, what, row.status,
                         extra=events.fields(row.message_id, row.actor_name, row.unique_key))
        repaired += len(found)
    return repaired

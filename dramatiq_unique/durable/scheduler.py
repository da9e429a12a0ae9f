"""The re-drive on a timer: an APScheduler ``BackgroundScheduler`` that calls :func:`redrive`.

Every process may run one (workers do, through the :class:`Redriver`
middleware): the pass lock in Redis lets one pass run at a time across
the cluster, and a process that finds it taken skips that tick.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Optional

from apscheduler.schedulers.background import BackgroundScheduler

from dramatiq_unique import suite as _config
from dramatiq_unique.durable.redrive import redrive
from dramatiq_unique.errors import DependencyUnavailable, InvalidOption
from dramatiq_unique.logs import QuietTicks

if TYPE_CHECKING:
    import dramatiq
    from apscheduler.schedulers.base import BaseScheduler

    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

#: Id of the re-drive job in the scheduler (suffixed with the suite's key prefix).
JOB_ID = "dramatiq_unique.redrive"


def start_redriver(
    interval: Optional[float] = None,
    *,
    suite: Optional["Suite"] = None,
    broker: Optional["dramatiq.Broker"] = None,
    scheduler: Optional["BaseScheduler"] = None,
) -> "BaseScheduler":
    """Run :func:`redrive` every ``interval`` ms (default: the ``redrive_interval`` setting).

    Starts and returns a new ``BackgroundScheduler``, or adds the job to
    ``scheduler`` if one is given (the caller starts and stops that one).
    Stop the returned scheduler with ``scheduler.shutdown()``.  The first
    pass runs at once.
    """
    suite = suite or _config.current()
    interval = suite.settings.redrive_interval if interval is None else interval
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
        raise InvalidOption(f"interval must be a positive number of milliseconds, not {interval!r}")
    QuietTicks.install()
    own = scheduler is None
    if scheduler is None:
        scheduler = BackgroundScheduler(timezone=timezone.utc, daemon=True)
    scheduler.add_job(
        _tick,
        "interval",
        seconds=interval / 1000,
        args=(suite, broker),
        id=f"{JOB_ID}:{suite.keys.prefix}",
        name="dramatiq_unique re-drive",
        replace_existing=True,
        # A pass slower than the interval: skip the ticks it overlapped, never pile them up.
        max_instances=1,
        coalesce=True,
        misfire_grace_time=None,
        next_run_time=datetime.now(timezone.utc),
    )
    if own:
        scheduler.start()
    return scheduler


def _tick(suite: "Suite", broker: Optional["dramatiq.Broker"]) -> None:
    try:
        counts = redrive(broker, suite=suite)
        busy = {k: v for k, v in counts.as_dict().items() if k != "ran" and v}
        if busy:
            logger.info("Re-drive pass: %s.", ", ".join(f"{k}={v}" for k, v in busy.items()))
    except DependencyUnavailable as e:
        logger.warning("Re-drive pass skipped: %s", e)
    except Exception:
        logger.exception("Re-drive pass failed.")
    finally:
        suite.close()  # this scheduler thread's database connection

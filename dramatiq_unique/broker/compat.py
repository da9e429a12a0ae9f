"""The Dramatiq versions whose internals this package was written against, checked once.

What :mod:`dramatiq_unique.broker` relies on that Dramatiq does not publish as API:

* the Redis broker's key layout and the semantics of its ``dispatch.lua``
  (:mod:`~dramatiq_unique.broker.keys`): the queue list, the ``.msgs`` hash, the
  ``__acks__`` sets, ``__heartbeats__``, the ``.DQ``/``.XQ`` queues.  Our own scripts
  write them for tracked messages as ``enqueue``/``ack`` would
  (:mod:`~dramatiq_unique.broker.publish`, :mod:`~dramatiq_unique.broker.acks`,
  :mod:`~dramatiq_unique.broker.delivery`), the lost-message check reads them and calls
  the broker's maintenance with 2.x's arguments (:mod:`~dramatiq_unique.broker.presence`);
* ``RedisBroker.do_enqueue``/``do_ack``, which it builds in ``__getattr__`` from
  ``_dispatch``, and ``_should_do_maintenance`` (publish.py, acks.py);
* the worker's ``consumers``, ``work_queue`` and ``_WorkQueueItem`` (delivery.py);
* the ``redis_message_id`` option (:mod:`~dramatiq_unique.broker.refs`).

All of them were written and tested against :data:`SUPPORTED`.  On another
major version of Dramatiq the Redis broker may lay its keys out otherwise,
and our scripts would then write tracked messages where no consumer reads
them: jobs lost without a word.  So a Redis broker under an untested major
version is refused at set-up, with an error that names the versions,
rather than warned about in a log nobody reads (the contract's "a broken
dependency gives a clear error").  Other brokers touch none of this and
are never refused.  setup.cfg requires the same versions; the check
catches an install that got around it (``pip install --no-deps``, an
upgraded Dramatiq next to this package).
"""

from __future__ import annotations

import re
from typing import Any, Optional

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from dramatiq_unique.errors import UnsupportedVersion

#: The Dramatiq versions the internals above were written against, as a requirement.
SUPPORTED = "dramatiq>=2,<3"
#: Its major versions, as ``range`` bounds.
MAJOR_VERSIONS = range(2, 3)


def major(version: str) -> Optional[int]:
    """The major version of a version string, or None if it has none."""
    match = re.match(r"\s*(\d+)", version)
    return int(match.group(1)) if match else None


def supported(version: str) -> bool:
    return major(version) in MAJOR_VERSIONS


def check(broker: Any, version: Optional[str] = None) -> None:
    """Refuse a Redis broker under a Dramatiq these internals were not written for (see the
    module's docstring); called once per broker, when the suite wraps its enqueue.  ``version``:
    the installed Dramatiq's by default."""
    version = dramatiq.__version__ if version is None else version
    if isinstance(broker, RedisBroker) and not supported(version):
        raise UnsupportedVersion(
            f"dramatiq {version}: the suite writes the Redis broker's keys itself, as {SUPPORTED} lays "
            f"them out, and has not been checked against this version; use {SUPPORTED} "
            f"(or RabbitmqBroker, which needs none of this)"
        )

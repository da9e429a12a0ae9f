"""Which INSERT a unique send makes: chosen by how often its actor's keys were found held lately.

Two ways to insert a row holding a key on PostgreSQL, measured on this project's machine
(docs/discussions/benchmarks.md):

* a plain INSERT, which the unique index refuses on a clash; the holder is then read by a
  second statement: a refused duplicate costs two round trips;
* one statement that inserts with ``ON CONFLICT DO NOTHING`` and reads the holder unless it
  inserted (:func:`dramatiq_unique.storage.jobs.insert_or_holder`): a refused duplicate
  costs one round trip, but every new row about 23 us more of the server's CPU (35 us of wall
  time a send) for the speculative insertion.

New keys are the common case and want the first; a burst of duplicates from other processes
(keys this process never sent, so :mod:`dramatiq_unique.unique.recent` cannot answer them)
wants the second.  So each actor keeps a moving share of its unique inserts that met a holder,
and an actor whose share is above :data:`THRESHOLD` uses the one statement.  The share is this
process's own and approximate (updated without a lock); either way the unique index decides.
"""

from __future__ import annotations

#: Share of recent unique inserts that met a holder above which the one-statement insert is
#: used: the break-even of its extra cost per new row (~35 us) against the round trip a refused
#: duplicate saves (~250 us), about 0.14.
THRESHOLD = 0.15
#: Weight of the newest insert in the moving share: about the last 20 count.  Four refused
#: sends in a row switch an actor to the one statement; a run of new keys switches it back.
WEIGHT = 0.05

_share: dict[str, float] = {}


def expect_holder(actor_name: str) -> bool:
    """Whether a unique insert of ``actor_name`` should read the holder in the same statement."""
    return _share.get(actor_name, 0.0) > THRESHOLD


def record(actor_name: str, held: bool) -> None:
    """A unique insert of ``actor_name`` met a holder (``held``) or inserted its row."""
    share = _share.get(actor_name, 0.0)
    _share[actor_name] = share + WEIGHT * ((1.0 if held else 0.0) - share)


def forget() -> None:
    """Every actor back to the plain INSERT (tests)."""
    _share.clear()

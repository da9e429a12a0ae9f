"""A committed transaction's held sends, claimed and published in batches (:mod:`dramatiq_unique.durable.outbox`).

One by one, each held send costs three round trips after the commit: its claim (``pending`` ->
``queued``, a committed UPDATE), its publish, and the UPDATE of its broker id; measured, a
transaction of 5,000 sends published about 400 jobs a second on PostgreSQL, a tenth of plain
Dramatiq's per-message send.  Here a batch of up to ``send_many_batch`` rows of one store is
claimed in one statement, which writes each row's broker id with its claim (the Redis broker's
message ids are drawn first, as ``RedisBroker.enqueue`` draws one), and the rows claimed are
published in one MULTI/EXEC (:meth:`dramatiq_unique.broker.publish.Publisher.publish_many`): all or
nothing, so a failure hands every row of the batch back to ``pending`` for the re-drive.

The claim is conditional as a single one is: a row a re-drive pass claimed first (between the
commit and this publish) is left to it, and nothing is sent twice; a row that a later send
wrote (a replace, stamped with another id) is left to that send.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any, Optional

from dramatiq_unique.broker.refs import REDIS_MESSAGE_ID
from dramatiq_unique.storage import jobs, queries
from dramatiq_unique.storage.database import is_postgres, is_psycopg3
from dramatiq_unique.storage.models import JobStatus, utcnow

if TYPE_CHECKING:
    from dramatiq import Message

    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

#: A held send: (its row's id, the row's revision at the send, the stamp a replace wrote into the row's
#: ``broker_ref`` or None (durable/outbox.py), its message as held).
Held = tuple[int, int, Optional[str], "Message"]


def claim_and_publish(suite: "Suite", model: type["JobModel"], held: list[Held]) -> list["Message"]:
    """Claim ``held``'s rows in ``model``'s table and publish the ones claimed, in one round trip each;
    returns the messages published, as the broker published them.  If the publish fails, the rows
    claimed go back to ``pending`` (the re-drive sends them) and the error is raised."""
    publisher = suite.publisher
    assert publisher is not None  # outbox.Outbox batches only where there is one
    # Each held send its own broker id, which the claim returns: a row is claimed by at most one of
    # them (the one it is still as that send left it), not always the last one held for it.
    sent = [message.copy(options={REDIS_MESSAGE_ID: str(uuid.uuid4())}) for _, _, _, message in held]
    claimed = _claim(model, held, [m.options[REDIS_MESSAGE_ID] for m in sent])
    messages = [m for m in sent if m.options[REDIS_MESSAGE_ID] in claimed]
    if not messages:
        return []
    try:
        publisher.publish_many([(m.queue_name, m.options[REDIS_MESSAGE_ID], m.encode(), None) for m in messages])
    except BaseException:
        try:
            jobs.unclaim_sends(model, sorted(set(claimed.values())), JobStatus.PENDING.value,
                               ref=[m.options[REDIS_MESSAGE_ID] for m in messages])
        except Exception:
            # Left queued with a broker id the broker never had: the lost-message check sends them again.
            logger.exception("Could not put %d jobs back to pending after their publish failed.", len(claimed))
        raise
    return messages


def _claim(model: type["JobModel"], held: list[Held], refs: list[str]) -> dict[str, int]:
    """``pending`` -> ``queued`` with each row's broker id (``refs``, one per held send), for the rows still
    as the send left them (the ``claim_held`` query); {broker id: row id} of the sends that claimed one."""
    db = model._meta.database
    values: dict[str, Any] = {"queued": JobStatus.QUEUED.value, "pending": JobStatus.PENDING.value,
                              "now": model.enqueued_at.db_value(utcnow())}
    if is_postgres(db):
        query = queries.statement(model, "claim_held")
        values.update(ids=[row_id for row_id, _, _, _ in held], message_ids=[m.message_id for _, _, _, m in held],
                      revisions=[revision for _, revision, _, _ in held], stamps=[stamp for _, _, stamp, _ in held],
                      refs=refs)
        if is_psycopg3(db):  # once per batch: a plan kept for it only costs (see the query's comment)
            cursor = db.cursor()
            cursor.execute(query.sql, values, prepare=False)
        else:
            cursor = db.execute_sql(query.sql, values)
        return {ref: row_id for (row_id, ref) in cursor.fetchall()}
    query = queries.statement(model, "claim_one_held")
    claimed: dict[str, int] = {}
    with db.atomic():
        for (row_id, revision, stamp, message), ref in zip(held, refs, strict=True):
            values.update(id=row_id, message_id=message.message_id, revision=revision, stamp=stamp, ref=ref)
            if db.execute_sql(query.sql, values).rowcount:
                claimed[ref] = row_id
    return claimed

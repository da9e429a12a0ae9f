-- The suite's SQL, by name: each statement written out in full, once, or once per dialect where
-- PostgreSQL and SQLite differ.  File format (read by dramatiq_unique/storage/queries.py):
--
--   -- name: statement_name --                 one statement for both dialects, or
--   -- name: statement_name (postgresql) --    that dialect's own (then the other has its own too)
--   -- What it does, on comment lines under the header.
--   SQL, with %(name)s parameters and these identifiers, substituted per job table:
--     {jobs}      the job table, quoted, in its schema      {fences}   the fencing-token table
--     {columns}   every column of the model, qualified by the table's name (a model may add columns)
--     {order_by}  the column a group's queue is served by: "created_at" or "process_after"
--     {fields}, {values}, {assignments}: the columns the call writes; their %(column)s parameters;
--                 "column" = %(column)s for each
--     {rows}      (insert_many) one ({values}) per row of a batch
--
-- Some entries are expressions, not statements, for peewee queries to embed: now, history_append and
-- those of the bulk actions.
-- A statement that repeats another's text (a start's SET list, a group's queue head, a move
-- committed without the WAL flush wait) repeats it exactly: tests/unit/storage/test_queries.py
-- checks.  Column and table names are those of deployed databases: change none.


-- == job rows ==========================================================================

-- name: insert --
-- One row, with the columns the call gives (field defaults filled in by the caller).
INSERT INTO {jobs} ({fields}) VALUES ({values}) RETURNING "id"

-- name: insert_or_holder (postgresql) --
-- A row holding a unique key, or, when a row of its app holds the key already, that holder: the new row's
-- id with NULLs, or the holder's columns as "holder" reads them.  A duplicate refused in one round trip
-- instead of a failed INSERT and a SELECT.  A holder committed after the statement began is outside its
-- snapshot: no row at all.  The WHERE lets the conflict be inferred from the holds' partial index, and from
-- the whole one of schema versions 4 and earlier while it stands.
WITH inserted AS (INSERT INTO {jobs} ({fields}) VALUES ({values})
ON CONFLICT ("app", "unique_hold") WHERE "unique_hold" IS NOT NULL DO NOTHING RETURNING "id")
SELECT "id", NULL, NULL, NULL, NULL FROM inserted
UNION ALL
SELECT "id", "message_id", "revision", "status", "created_at" FROM {jobs}
WHERE "app" = %(app)s AND "unique_hold" = %(unique_hold)s AND NOT EXISTS (SELECT 1 FROM inserted)

-- name: insert_many --
-- A batch's rows in one statement; a row whose hold (or idempotency key) another job holds is left out.
INSERT INTO {jobs} ({fields}) VALUES {rows} ON CONFLICT DO NOTHING RETURNING "id", "message_id"

-- name: holder --
-- The row of an app that holds a unique key: the few columns a skipped send needs.
SELECT "id", "message_id", "revision", "status", "created_at" FROM {jobs}
WHERE "app" = %(app)s AND "unique_hold" = %(hold)s

-- name: start_attempt --
-- Mark an attempt running, if it may start: the message's revision, not finished, and no other attempt
-- running under a live lease (a running row whose lease ran out is a crashed attempt's; one a waker's claim
-- started is its woken delivery's).  The attempt's token: the one drawn beforehand (SQLite), or the next.
UPDATE {jobs} SET "status" = %(running)s, "attempts" = "attempts" + 1, "started_at" = %(started_at)s,
"lease_until" = %(lease_until)s, "worker" = %(worker)s, "fencing_token" = COALESCE(%(token)s, "fencing_token" + 1),
"parked_on" = NULL, "unique_hold" = CASE WHEN %(release_hold)s = 1 THEN NULL ELSE "unique_hold" END
WHERE "id" = %(id)s AND "revision" = %(revision)s AND "status" NOT IN (%(succeeded)s, %(failed)s)
AND ("status" <> %(running)s OR "lease_until" IS NULL OR "lease_until" <= %(live_after)s
OR "worker" LIKE %(woken_by)s)
RETURNING "message_id", "actor_name", "attempts", "unique_key", "fencing_token", "checkpoints"

-- name: start_attempt_fenced (postgresql) --
-- start_attempt after the key's next fencing token is drawn (draw_token, as "drawn"), and the key's
-- older running attempts fenced out, in one statement.  The starting row itself is left to the main UPDATE
-- (PostgreSQL does not update a row twice in a statement); the revocation is joined to it ("me") to keep
-- to its app's rows.
WITH drawn AS (INSERT INTO {fences} ("key", "token") VALUES (%(key)s, 1)
ON CONFLICT ("key") DO UPDATE SET "token" = {fences}."token" + 1 RETURNING "token"),
revoked AS (UPDATE {jobs} SET "fencing_token" = (SELECT "token" FROM drawn) FROM {jobs} AS me
WHERE {jobs}."unique_key" = %(key)s AND {jobs}."status" = 'running'
AND {jobs}."fencing_token" < (SELECT "token" FROM drawn) AND me."id" = %(id)s AND {jobs}."id" <> me."id"
AND {jobs}."app" = me."app")
UPDATE {jobs} SET "status" = %(running)s, "attempts" = "attempts" + 1, "started_at" = %(started_at)s,
"lease_until" = %(lease_until)s, "worker" = %(worker)s, "fencing_token" = (SELECT "token" FROM drawn),
"parked_on" = NULL, "unique_hold" = CASE WHEN %(release_hold)s = 1 THEN NULL ELSE "unique_hold" END
WHERE "id" = %(id)s AND "revision" = %(revision)s AND "status" NOT IN (%(succeeded)s, %(failed)s)
AND ("status" <> %(running)s OR "lease_until" IS NULL OR "lease_until" <= %(live_after)s
OR "worker" LIKE %(woken_by)s)
RETURNING "message_id", "actor_name", "attempts", "unique_key", "fencing_token", "checkpoints"

-- name: start_fetched (postgresql) --
-- start_attempt for fetched jobs (durable/fetched.py), in one statement and one commit: the rows by id, each
-- with its message's revision, its own lease and whether its start frees its key.  A row listed twice starts once.
UPDATE {jobs} SET "status" = %(running)s, "attempts" = {jobs}."attempts" + 1, "started_at" = %(started_at)s,
"lease_until" = fetched."lease_until", "worker" = %(worker)s, "fencing_token" = {jobs}."fencing_token" + 1,
"parked_on" = NULL, "unique_hold" = CASE WHEN fetched."release_hold" THEN NULL ELSE {jobs}."unique_hold" END
FROM unnest(CAST(%(ids)s AS bigint[]), CAST(%(revisions)s AS integer[]), CAST(%(leases)s AS timestamp[]),
CAST(%(releases)s AS boolean[])) AS fetched ("id", "revision", "lease_until", "release_hold")
WHERE {jobs}."id" = fetched."id" AND {jobs}."revision" = fetched."revision"
AND {jobs}."status" NOT IN (%(succeeded)s, %(failed)s)
AND ({jobs}."status" <> %(running)s OR {jobs}."lease_until" IS NULL OR {jobs}."lease_until" <= %(live_after)s)
RETURNING {jobs}."id", "message_id", "actor_name", "attempts", "unique_key", {jobs}."fencing_token", "checkpoints"

-- name: renew_fetched --
-- A row its fetch started, taken up late by its worker thread: its lease and start counted from now, if
-- that start still owns the row (no other attempt can have started under the same token).
UPDATE {jobs} SET "started_at" = %(started_at)s, "lease_until" = %(lease_until)s
WHERE "id" = %(id)s AND "status" = %(running)s AND "worker" = %(worker)s AND "fencing_token" = %(token)s

-- name: unstart_fetched (postgresql) --
-- Rows their fetch started whose messages no worker thread took up (the worker stopped, or a middleware
-- refused them first): queued again, the attempt not counted, if that start still owns each.
UPDATE {jobs} SET "status" = %(queued)s, "attempts" = {jobs}."attempts" - 1, "worker" = NULL, "lease_until" = NULL
FROM unnest(CAST(%(ids)s AS bigint[]), CAST(%(tokens)s AS bigint[])) AS fetched ("id", "token")
WHERE {jobs}."id" = fetched."id" AND {jobs}."fencing_token" = fetched."token" AND {jobs}."status" = %(running)s
AND {jobs}."worker" = %(worker)s

-- name: hold_again (postgresql) --
-- Unstarted rows whose start had freed their key (unstart_fetched) take it again, where no other row of
-- their app took it meanwhile (a job sent while they counted as started keeps it).
UPDATE {jobs} SET "unique_hold" = "unique_key"
WHERE "id" = ANY(CAST(%(ids)s AS bigint[])) AND "status" = %(queued)s AND "unique_hold" IS NULL
AND "unique_key" IS NOT NULL
AND NOT EXISTS (SELECT 1 FROM {jobs} AS other WHERE other."app" = {jobs}."app" AND other."unique_hold" = {jobs}."unique_key")

-- name: startable --
-- Whether start_attempt would take the row now (its conditions, read only).
SELECT 1 FROM {jobs}
WHERE "id" = %(id)s AND "revision" = %(revision)s AND "status" NOT IN (%(succeeded)s, %(failed)s)
AND ("status" <> %(running)s OR "lease_until" IS NULL OR "lease_until" <= %(live_after)s
OR "worker" LIKE %(woken_by)s)

-- name: update_fenced --
-- Write the columns the call gives to a row whose fencing token is still the attempt's.
UPDATE {jobs} SET {assignments} WHERE "id" = %(row_id)s AND "fencing_token" = %(attempt_token)s

-- name: update_fenced_with_history (postgresql) --
-- update_fenced, the attempt's %(entry)s appended to the row's history and only the last %(keep)s entries
-- kept: jsonb concatenation, trimmed by a jsonpath slice, cast back to text.  A job's first outcome (most
-- jobs have one) finds no history: a text of one entry, with no JSON parsed.
UPDATE {jobs} SET {assignments}, "history" = CASE WHEN "history" IS NULL THEN '[' || CAST(%(entry)s AS text) || ']'
ELSE CAST(jsonb_path_query_array(CAST("history" AS jsonb) || jsonb_build_array(CAST(%(entry)s AS jsonb)),
'$[last - $n + 1 to last]', jsonb_build_object('n', CAST(%(keep)s AS integer))) AS text) END
WHERE "id" = %(row_id)s AND "fencing_token" = %(attempt_token)s

-- name: finish_succeeded (postgresql) --
-- update_fenced_with_history for several succeeded attempts (durable/successes.py), in one statement and one
-- commit: each row by id and its attempt's token, with its own finish time, result, history entry and whether
-- it frees its key.  The history is appended as update_fenced_with_history appends it.
UPDATE {jobs} SET "status" = %(succeeded)s, "finished_at" = done."finished_at", "result" = done."result",
"last_error" = NULL, "lease_until" = NULL,
"unique_hold" = CASE WHEN done."release_hold" THEN NULL ELSE {jobs}."unique_hold" END,
"history" = CASE WHEN {jobs}."history" IS NULL THEN '[' || done."entry" || ']'
ELSE CAST(jsonb_path_query_array(CAST({jobs}."history" AS jsonb) || jsonb_build_array(CAST(done."entry" AS jsonb)),
'$[last - $n + 1 to last]', jsonb_build_object('n', CAST(%(keep)s AS integer))) AS text) END
FROM unnest(CAST(%(ids)s AS bigint[]), CAST(%(tokens)s AS bigint[]), CAST(%(finished)s AS timestamp[]),
CAST(%(results)s AS text[]), CAST(%(entries)s AS text[]), CAST(%(releases)s AS boolean[]))
AS done ("id", "token", "finished_at", "result", "entry", "release_hold")
WHERE {jobs}."id" = done."id" AND {jobs}."fencing_token" = done."token"
RETURNING {jobs}."id"

-- name: update_fenced_with_history (sqlite) --
-- update_fenced, the attempt's %(entry)s appended to the row's history; the oldest entry goes when %(keep)s
-- are there.  A job's first outcome finds no history: a text of one entry, with no JSON parsed.
UPDATE {jobs} SET {assignments}, "history" = CASE WHEN "history" IS NULL THEN '[' || %(entry)s || ']'
WHEN json_array_length("history") >= %(keep)s
THEN json_insert(json_remove("history", '$[0]'), '$[#]', json(%(entry)s))
ELSE json_insert("history", '$[#]', json(%(entry)s)) END
WHERE "id" = %(row_id)s AND "fencing_token" = %(attempt_token)s

-- name: history_append (postgresql) --
-- An expression: the row's history with %(entry)s appended, the last %(keep)s kept (for the re-drive's
-- peewee writes; update_fenced_with_history writes the same).
CASE WHEN "history" IS NULL THEN '[' || CAST(%(entry)s AS text) || ']'
ELSE CAST(jsonb_path_query_array(CAST("history" AS jsonb) || jsonb_build_array(CAST(%(entry)s AS jsonb)),
'$[last - $n + 1 to last]', jsonb_build_object('n', CAST(%(keep)s AS integer))) AS text) END

-- name: history_append (sqlite) --
-- An expression: the row's history with %(entry)s appended, the oldest going when %(keep)s are there.
CASE WHEN "history" IS NULL THEN '[' || %(entry)s || ']'
WHEN json_array_length("history") >= %(keep)s
THEN json_insert(json_remove("history", '$[0]'), '$[#]', json(%(entry)s))
ELSE json_insert("history", '$[#]', json(%(entry)s)) END

-- name: record_refs (postgresql) --
-- Record the broker's ids of sent rows (%(refs)s: a JSON list of [id, ref] pairs); a ref set meanwhile is kept.
UPDATE {jobs} SET "broker_ref" = sent.ref
FROM (SELECT CAST(value ->> 0 AS bigint) AS id, value ->> 1 AS ref FROM json_array_elements(CAST(%(refs)s AS json))) AS sent
WHERE {jobs}."id" = sent.id AND {jobs}."broker_ref" IS NULL

-- name: record_refs (sqlite) --
-- Record the broker's ids of sent rows (%(refs)s: a JSON list of [id, ref] pairs); a ref set meanwhile is kept.
UPDATE {jobs} SET "broker_ref" = sent.ref
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS ref FROM json_each(%(refs)s)) AS sent
WHERE {jobs}."id" = sent.id AND {jobs}."broker_ref" IS NULL

-- name: claim_held (postgresql) --
-- The outbox's claim of a committed transaction's held sends (durable/outbox.py), one statement a
-- batch: each row pending -> queued with the broker id drawn for its message, if still as its send left
-- it (the message id tells a reused id apart; a re-drive pass may have claimed it first; a replace's send
-- claims only the row that its own stamp is in, durable/outbox.py).  Arrays, not a CASE and an IN list of
-- a thousand entries each (docs/discussions/benchmarks.md).  "id" = ANY(ids) as well, for the planner.
-- Never prepared: a generic plan, made on a small table's statistics, scans every pending row for each
-- held one.
UPDATE {jobs} SET "status" = %(queued)s, "enqueued_at" = %(now)s, "broker_ref" = held.ref
FROM unnest(%(ids)s::bigint[], %(message_ids)s::text[], %(revisions)s::integer[], %(stamps)s::text[],
%(refs)s::text[]) AS held (id, message_id, revision, stamp, ref)
WHERE {jobs}."id" = ANY(%(ids)s::bigint[])
AND {jobs}."id" = held.id AND {jobs}."message_id" = held.message_id AND {jobs}."revision" = held.revision
AND (held.stamp IS NULL OR {jobs}."broker_ref" = held.stamp)
AND {jobs}."status" = %(pending)s AND {jobs}."parked_on" IS NULL
RETURNING {jobs}."id", held.ref

-- name: claim_held (sqlite) --
-- claim_held with the batch as one JSON list (%(held)s: [id, message id, revision, stamp, ref] each).
-- RETURNING names the updated table's columns alone: the ref written, which is the claiming send's.
UPDATE {jobs} SET "status" = %(queued)s, "enqueued_at" = %(now)s, "broker_ref" = held.ref
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS message_id,
json_extract(value, '$[2]') AS revision, json_extract(value, '$[3]') AS stamp,
json_extract(value, '$[4]') AS ref FROM json_each(%(held)s)) AS held
WHERE {jobs}."id" = held.id AND {jobs}."message_id" = held.message_id AND {jobs}."revision" = held.revision
AND (held.stamp IS NULL OR {jobs}."broker_ref" = held.stamp)
AND {jobs}."status" = %(pending)s AND {jobs}."parked_on" IS NULL
RETURNING "id", "broker_ref"


-- == fencing tokens (storage/jobs.py) ================================================

-- name: draw_token --
-- The key's next token: one statement on SQLite (3.35 and later) and PostgreSQL (whose fenced start
-- draws it in its own, start_attempt_fenced).
INSERT INTO {fences} ("key", "token") VALUES (%(key)s, 1)
ON CONFLICT ("key") DO UPDATE SET "token" = {fences}."token" + 1 RETURNING "token"

-- name: revoke_older --
-- After draw_token: rows of the key still running under an older token lose their attempt (their token
-- moves on to %(token)s); the drawing job's own row stops being parked (it runs now).  Only rows of the
-- drawing job's app: another app's job of the same key is not ours to fence.
UPDATE {jobs} SET
"fencing_token" = CASE WHEN "id" = %(own)s THEN "fencing_token" ELSE %(token)s END,
"parked_on" = CASE WHEN "id" = %(own)s THEN NULL ELSE "parked_on" END
WHERE "unique_key" = %(key)s
AND (("status" = %(running)s AND "fencing_token" < %(token)s AND "id" <> %(own)s)
OR ("id" = %(own)s AND "parked_on" IS NOT NULL))
AND "app" = COALESCE((SELECT me."app" FROM {jobs} AS me WHERE me."id" = %(own)s), "app")


-- == parking ===========================================================================
--
-- A group's next job (its queue head) is the first due, unreserved row of an app parked on it, in
-- serving order ({order_by}); the same subquery in every claim and reservation.  The moves named
-- *_no_flush_wait are the move above them, committed without waiting for the WAL flush
-- (storage/jobs.py: _move says when that is safe): set_config(..., true) sets
-- synchronous_commit for that statement's own (implicit) transaction, which reads it at its commit;
-- the session's setting is untouched.  One statement, so psycopg 3 prepares it too (a
-- "SET LOCAL ...; UPDATE" string is two, which its server-side binding refuses).

-- name: now (postgresql) --
-- An expression: the database's clock, in the job table's time format (naive UTC).
(statement_timestamp() AT TIME ZONE 'UTC')

-- name: now (sqlite) --
-- An expression: the database's clock, in the job table's time format (naive UTC); SQLite's is the machine's.
strftime('%Y-%m-%d %H:%M:%f', 'now')

-- name: park --
-- Park a waiting job on a group; a running row whose lease ran out counts as waiting.  Such a row's
-- attempt is over (its worker stalled or died) and the job waits again: its worker and lease go, so
-- jobs.finish_revoked no longer takes it for the row's attempt.  The token moves on whatever the status:
-- no earlier attempt's fenced write (heartbeat, checkpoints, retry, outcome) may land on a parked row,
-- which only a waker's claim takes out of its wait; that of an attempt the re-drive found lost and sent
-- again (the row queued, the attempt stalled, not dead) would otherwise leave it parked and retrying.
-- "parked_at" keeps when the job was first parked in this wait: a job woken and parked again before it
-- started keeps it, one parked after an attempt started (a retry, a crashed attempt's re-delivery) gets
-- now ("attempts" moved on).  SET reads the row as it was: the CASEs see the old status.
UPDATE {jobs} SET "status" = %(pending)s, "parked_on" = %(group)s, "options" = %(options)s,
"parked_at" = CASE WHEN "parked_attempt" = "attempts" THEN "parked_at" ELSE %(now)s END,
"parked_attempt" = "attempts",
"fencing_token" = "fencing_token" + 1,
"worker" = CASE WHEN "status" = %(running)s THEN NULL ELSE "worker" END,
"lease_until" = CASE WHEN "status" = %(running)s THEN NULL ELSE "lease_until" END
WHERE "id" = %(id)s AND "revision" = %(revision)s AND ("status" IN (%(pending)s, %(queued)s, %(retrying)s)
OR ("status" = %(running)s AND "lease_until" < %(now)s)) RETURNING "created_at", "process_after"

-- name: park_no_flush_wait (postgresql) --
-- park, committed without waiting for the WAL flush.
WITH moved AS (UPDATE {jobs} SET "status" = %(pending)s, "parked_on" = %(group)s, "options" = %(options)s,
"parked_at" = CASE WHEN "parked_attempt" = "attempts" THEN "parked_at" ELSE %(now)s END,
"parked_attempt" = "attempts",
"fencing_token" = "fencing_token" + 1,
"worker" = CASE WHEN "status" = %(running)s THEN NULL ELSE "worker" END,
"lease_until" = CASE WHEN "status" = %(running)s THEN NULL ELSE "lease_until" END
WHERE "id" = %(id)s AND "revision" = %(revision)s AND ("status" IN (%(pending)s, %(queued)s, %(retrying)s)
OR ("status" = %(running)s AND "lease_until" < %(now)s)) RETURNING "created_at", "process_after")
SELECT moved.* FROM moved, (SELECT set_config('synchronous_commit', 'off', true)) AS no_flush_wait

-- name: claim_parked (postgresql) --
-- Claim a group's next job (pending to queued), out of the group, due for delivery under %(broker_ref)s.
-- A join on the locked head, so the update finds its row by primary key (with "id = (subquery)" the
-- planner may scan the status index for it instead).
UPDATE {jobs} SET "status" = %(queued)s,
"parked_on" = NULL, "enqueued_at" = %(now)s, "broker_ref" = %(broker_ref)s, "missing_since" = NULL
FROM (SELECT "id" FROM {jobs} WHERE "app" = %(app)s AND "parked_on" = %(group)s AND "status" = %(pending)s
AND ("lease_until" IS NULL OR "lease_until" <= (statement_timestamp() AT TIME ZONE 'UTC'))
AND ("process_after" IS NULL OR "process_after" <= %(due)s)
ORDER BY {order_by}, "id" LIMIT 1
FOR UPDATE SKIP LOCKED) AS head WHERE {jobs}."id" = head."id"
RETURNING {columns}

-- name: claim_parked_no_flush_wait (postgresql) --
-- claim_parked, committed without waiting for the WAL flush.
WITH moved AS (UPDATE {jobs} SET "status" = %(queued)s,
"parked_on" = NULL, "enqueued_at" = %(now)s, "broker_ref" = %(broker_ref)s, "missing_since" = NULL
FROM (SELECT "id" FROM {jobs} WHERE "app" = %(app)s AND "parked_on" = %(group)s AND "status" = %(pending)s
AND ("lease_until" IS NULL OR "lease_until" <= (statement_timestamp() AT TIME ZONE 'UTC'))
AND ("process_after" IS NULL OR "process_after" <= %(due)s)
ORDER BY {order_by}, "id" LIMIT 1
FOR UPDATE SKIP LOCKED) AS head WHERE {jobs}."id" = head."id"
RETURNING {columns})
SELECT moved.* FROM moved, (SELECT set_config('synchronous_commit', 'off', true)) AS no_flush_wait

-- name: claim_parked (sqlite) --
-- Claim a group's next job (pending to queued).  No row locks: the head is checked again as it is updated.
UPDATE {jobs} SET "status" = %(queued)s,
"parked_on" = NULL, "enqueued_at" = %(now)s, "broker_ref" = %(broker_ref)s, "missing_since" = NULL
WHERE "id" = (SELECT "id" FROM {jobs} WHERE "app" = %(app)s AND "parked_on" = %(group)s AND "status" = %(pending)s
AND ("lease_until" IS NULL OR "lease_until" <= strftime('%Y-%m-%d %H:%M:%f', 'now'))
AND ("process_after" IS NULL OR "process_after" <= %(due)s)
ORDER BY {order_by}, "id" LIMIT 1
) AND "parked_on" = %(group)s AND "status" = %(pending)s
RETURNING {columns}

-- name: claim_and_start (postgresql) --
-- claim_parked, the attempt started in the same statement (as start_attempt does, with the row's next
-- token), unless the row's options name a unique option of its own: such a row is left queued, as a
-- plain claim leaves it, for its delivery's own start.
UPDATE {jobs} SET
"status" = CASE WHEN COALESCE(strpos("options", '"unique_'), 0) = 0 THEN %(running)s ELSE %(queued)s END,
"attempts" = CASE WHEN COALESCE(strpos("options", '"unique_'), 0) = 0 THEN "attempts" + 1 ELSE "attempts" END,
"started_at" = CASE WHEN COALESCE(strpos("options", '"unique_'), 0) = 0 THEN %(started_at)s ELSE "started_at" END,
"lease_until" = CASE WHEN COALESCE(strpos("options", '"unique_'), 0) = 0 THEN %(lease_until)s ELSE "lease_until" END,
"worker" = CASE WHEN COALESCE(strpos("options", '"unique_'), 0) = 0 THEN %(worker)s ELSE "worker" END,
"fencing_token" = CASE WHEN COALESCE(strpos("options", '"unique_'), 0) = 0
THEN "fencing_token" + 1 ELSE "fencing_token" END,
"unique_hold" = CASE WHEN COALESCE(strpos("options", '"unique_'), 0) = 0 AND %(release_hold)s = 1
THEN NULL ELSE "unique_hold" END,
"parked_on" = NULL, "enqueued_at" = %(now)s, "broker_ref" = %(broker_ref)s, "missing_since" = NULL
FROM (SELECT "id" FROM {jobs} WHERE "app" = %(app)s AND "parked_on" = %(group)s AND "status" = %(pending)s
AND ("lease_until" IS NULL OR "lease_until" <= (statement_timestamp() AT TIME ZONE 'UTC'))
AND ("process_after" IS NULL OR "process_after" <= %(due)s)
ORDER BY {order_by}, "id" LIMIT 1
FOR UPDATE SKIP LOCKED) AS head WHERE {jobs}."id" = head."id"
RETURNING {columns}

-- name: claim_and_start (sqlite) --
-- claim_and_start as on PostgreSQL, its head checked again as it is updated (no row locks).
UPDATE {jobs} SET
"status" = CASE WHEN COALESCE(instr("options", '"unique_'), 0) = 0 THEN %(running)s ELSE %(queued)s END,
"attempts" = CASE WHEN COALESCE(instr("options", '"unique_'), 0) = 0 THEN "attempts" + 1 ELSE "attempts" END,
"started_at" = CASE WHEN COALESCE(instr("options", '"unique_'), 0) = 0 THEN %(started_at)s ELSE "started_at" END,
"lease_until" = CASE WHEN COALESCE(instr("options", '"unique_'), 0) = 0 THEN %(lease_until)s ELSE "lease_until" END,
"worker" = CASE WHEN COALESCE(instr("options", '"unique_'), 0) = 0 THEN %(worker)s ELSE "worker" END,
"fencing_token" = CASE WHEN COALESCE(instr("options", '"unique_'), 0) = 0
THEN "fencing_token" + 1 ELSE "fencing_token" END,
"unique_hold" = CASE WHEN COALESCE(instr("options", '"unique_'), 0) = 0 AND %(release_hold)s = 1
THEN NULL ELSE "unique_hold" END,
"parked_on" = NULL, "enqueued_at" = %(now)s, "broker_ref" = %(broker_ref)s, "missing_since" = NULL
WHERE "id" = (SELECT "id" FROM {jobs} WHERE "app" = %(app)s AND "parked_on" = %(group)s AND "status" = %(pending)s
AND ("lease_until" IS NULL OR "lease_until" <= strftime('%Y-%m-%d %H:%M:%f', 'now'))
AND ("process_after" IS NULL OR "process_after" <= %(due)s)
ORDER BY {order_by}, "id" LIMIT 1
) AND "parked_on" = %(group)s AND "status" = %(pending)s
RETURNING {columns}

-- name: reserve (postgresql) --
-- Reserve a group's next job for a process's deck, until the database's clock passes %(lease_ms)s from now.
UPDATE {jobs} SET "worker" = %(marker)s, "broker_ref" = %(broker_ref)s, "lease_until" =
((statement_timestamp() AT TIME ZONE 'UTC') + CAST(%(lease_ms)s AS double precision) * INTERVAL '1 millisecond')
FROM (SELECT "id" FROM {jobs} WHERE "app" = %(app)s AND "parked_on" = %(group)s AND "status" = %(pending)s
AND ("lease_until" IS NULL OR "lease_until" <= (statement_timestamp() AT TIME ZONE 'UTC'))
AND ("process_after" IS NULL OR "process_after" <= %(due)s)
ORDER BY {order_by}, "id" LIMIT 1
FOR UPDATE SKIP LOCKED) AS head WHERE {jobs}."id" = head."id"
RETURNING {jobs}."id", {jobs}."message_id", {jobs}."actor_name", {jobs}."queue_name", {jobs}."args",
{jobs}."kwargs", {jobs}."options", {jobs}."status", {jobs}."revision", {jobs}."attempts",
{jobs}."unique_key", {jobs}."fencing_token", {jobs}."checkpoints", {jobs}."broker_ref",
{jobs}."created_at", {jobs}."process_after"

-- name: reserve_no_flush_wait (postgresql) --
-- reserve, committed without waiting for the WAL flush.
WITH moved AS (UPDATE {jobs} SET "worker" = %(marker)s, "broker_ref" = %(broker_ref)s, "lease_until" =
((statement_timestamp() AT TIME ZONE 'UTC') + CAST(%(lease_ms)s AS double precision) * INTERVAL '1 millisecond')
FROM (SELECT "id" FROM {jobs} WHERE "app" = %(app)s AND "parked_on" = %(group)s AND "status" = %(pending)s
AND ("lease_until" IS NULL OR "lease_until" <= (statement_timestamp() AT TIME ZONE 'UTC'))
AND ("process_after" IS NULL OR "process_after" <= %(due)s)
ORDER BY {order_by}, "id" LIMIT 1
FOR UPDATE SKIP LOCKED) AS head WHERE {jobs}."id" = head."id"
RETURNING {jobs}."id", {jobs}."message_id", {jobs}."actor_name", {jobs}."queue_name", {jobs}."args",
{jobs}."kwargs", {jobs}."options", {jobs}."status", {jobs}."revision", {jobs}."attempts",
{jobs}."unique_key", {jobs}."fencing_token", {jobs}."checkpoints", {jobs}."broker_ref",
{jobs}."created_at", {jobs}."process_after")
SELECT moved.* FROM moved, (SELECT set_config('synchronous_commit', 'off', true)) AS no_flush_wait

-- name: reserve (sqlite) --
-- Reserve a group's next job for a process's deck; SQLite checks the head again as it is updated.
UPDATE {jobs} SET "worker" = %(marker)s, "broker_ref" = %(broker_ref)s, "lease_until" =
strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || (CAST(%(lease_ms)s AS REAL) / 1000.0) || ' seconds')
WHERE "id" = (SELECT "id" FROM {jobs} WHERE "app" = %(app)s AND "parked_on" = %(group)s AND "status" = %(pending)s
AND ("lease_until" IS NULL OR "lease_until" <= strftime('%Y-%m-%d %H:%M:%f', 'now'))
AND ("process_after" IS NULL OR "process_after" <= %(due)s)
ORDER BY {order_by}, "id" LIMIT 1
) AND "parked_on" = %(group)s AND "status" = %(pending)s
AND ("lease_until" IS NULL OR "lease_until" <= strftime('%Y-%m-%d %H:%M:%f', 'now'))
RETURNING "id", "message_id", "actor_name", "queue_name", "args", "kwargs", "options", "status",
"revision", "attempts", "unique_key", "fencing_token", "checkpoints", "broker_ref", "created_at",
"process_after"

-- name: start_reserved --
-- Start a row this process reserved, if it is still as its reservation read it (a compare-and-set), as
-- start_attempt starts one, with the row's next token.
UPDATE {jobs} SET "status" = %(running)s, "attempts" = "attempts" + 1, "started_at" = %(started_at)s,
"lease_until" = %(lease_until)s, "worker" = %(worker)s, "fencing_token" = "fencing_token" + 1,
"parked_on" = NULL, "enqueued_at" = %(started_at)s, "missing_since" = NULL
WHERE "id" = %(id)s AND "status" = %(pending)s AND "worker" = %(marker)s AND "revision" = %(revision)s
AND "fencing_token" = %(reserved_token)s AND "broker_ref" = %(broker_ref)s
RETURNING "id", "message_id", "actor_name", "queue_name", "args", "kwargs", "options", "status",
"revision", "attempts", "unique_key", "fencing_token", "checkpoints", "broker_ref", "created_at",
"process_after"


-- == bulk actions (durable/bulk_actions.py): expressions of a row's options ============

-- name: unique_lock_option (postgresql) --
-- An expression: the lock type the row's message names itself (its unique_lock option), if any.
CAST("options" AS jsonb) ->> 'unique_lock'

-- name: unique_lock_option (sqlite) --
-- An expression: the lock type the row's message names itself (its unique_lock option), if any.
json_extract("options", '$.unique_lock')

-- name: restarted_count (postgresql) --
-- An expression: the row's options with Retries' count restarted at its attempts (the marker's "rb", as
-- retry_job writes it) and the message's own count dropped (build_message gives it one).
CAST(jsonb_set(CAST("options" AS jsonb) - 'retries', ARRAY['dramatiq_unique'],
COALESCE(CAST("options" AS jsonb) -> 'dramatiq_unique', jsonb_build_object())
|| jsonb_build_object('rb', "attempts")) AS text)

-- name: restarted_count (sqlite) --
-- An expression: restarted_count as on PostgreSQL.  json_patch merges objects (RFC 7396): the marker's
-- other entries stay, a missing marker is made.
json_patch(json_remove("options", '$.retries'), json_object('dramatiq_unique', json_object('rb', "attempts")))

-- name: queue_lock_token (postgresql) --
-- An expression: the token of the row's Redis queue lock, as its send wrote it in the marker ("qt").
CAST("options" AS jsonb) -> 'dramatiq_unique' ->> 'qt'

-- name: queue_lock_token (sqlite) --
-- An expression: the token of the row's Redis queue lock, as its send wrote it in the marker ("qt").
json_extract("options", '$.dramatiq_unique.qt')

-- == the job table's schema (storage/schema.py, storage/migrations.py) =====================

-- name: add_app_column (postgresql) --
-- Add the app column to a job table of an earlier version: a constant default, so no rewrite of the table.
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS "app" VARCHAR(255) NOT NULL DEFAULT ''

-- name: add_app_column (sqlite) --
-- Add the app column to a job table of an earlier version: a constant default, so no rewrite of the table.
ALTER TABLE {jobs} ADD COLUMN "app" VARCHAR(255) NOT NULL DEFAULT ''

-- name: current_schema (postgresql) --
-- The schema the job table is in: its own, or the first of the search_path, which peewee's reads of the
-- catalog (get_columns, get_indexes) do not default to.
SELECT COALESCE(%(schema)s, current_schema())

-- name: current_schema (sqlite) --
-- The schema the job table is in: its own, if it names one.
SELECT %(schema)s

-- name: versions_table (postgresql) --
-- Whether the table of schema versions exists, in the schema the search_path resolves (peewee's
-- table_exists looks in 'public').
SELECT 1 WHERE to_regclass('dramatiq_unique_schema') IS NOT NULL

-- name: versions_table (sqlite) --
-- Whether the table of schema versions exists.
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'dramatiq_unique_schema'

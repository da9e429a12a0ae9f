-- The suite's raw SQL: the statements of the hot paths, by name.
-- Rendered per table and dialect by dramatiq_unique/storage/queries.py, whose docstring
-- explains {placeholders}, "identifiers" and %(parameters)s.  Column and table names are
-- those of deployed databases: change none.


-- == job rows (storage/statements.py) ===================================================

-- name: holder
-- The row of an app that holds a unique key: the few columns a skipped send needs.
SELECT "id", "message_id", "revision", "status", "created_at" FROM {jobs}
WHERE "app" = %(app)s AND "unique_hold" = %(hold)s

-- name: holder_unless_inserted (postgresql)
-- Follows "WITH inserted AS (INSERT ... ON CONFLICT ("app", "unique_hold") DO NOTHING RETURNING "id")"
-- (statements.insert_or_holder; the INSERT's columns vary by call, so it is built there): the new row's
-- id, with NULLs; or, when the INSERT met another row of the app holding the key, that holder's columns, as
-- the holder block reads them.  A duplicate refused in one round trip instead of a failed INSERT and a SELECT.
-- A holder committed after the statement began is outside its snapshot: no row at all.
SELECT "id", NULL, NULL, NULL, NULL FROM inserted
UNION ALL
SELECT "id", "message_id", "revision", "status", "created_at" FROM {jobs}
WHERE "app" = %(app)s AND "unique_hold" = %(hold)s AND NOT EXISTS (SELECT 1 FROM inserted)

-- name: claim_held (postgresql)
-- The outbox's claim of a committed transaction's held sends (durable/outbox_batch.py), one statement a
-- batch: each row pending -> queued with the broker id drawn for its message, if still as its send left
-- it (the message id tells a reused id apart; a re-drive pass may have claimed it first; a replace's send
-- claims only the row that its own stamp is in, durable/outbox.py).  Arrays, not a
-- CASE and an IN list of a thousand entries each, which cost the server more than the rows (measured).
-- "id" = ANY(ids) as well, for the planner.  Never prepared (outbox_batch.py): a generic plan, made on a
-- small table's statistics, scanned every pending row for each held one (measured on psycopg 3, which
-- prepares what a connection runs often: the outbox slowed run by run, 5,500 to 1,200 jobs/s).
UPDATE {jobs} SET "status" = %(queued)s, "enqueued_at" = %(now)s, "broker_ref" = held.ref
FROM unnest(%(ids)s::bigint[], %(message_ids)s::text[], %(revisions)s::integer[], %(stamps)s::text[],
%(refs)s::text[]) AS held (id, message_id, revision, stamp, ref)
WHERE {jobs}."id" = ANY(%(ids)s::bigint[])
AND {jobs}."id" = held.id AND {jobs}."message_id" = held.message_id AND {jobs}."revision" = held.revision
AND (held.stamp IS NULL OR {jobs}."broker_ref" = held.stamp)
AND {jobs}."status" = %(pending)s AND {jobs}."parked_on" IS NULL
RETURNING {jobs}."id", held.ref

-- name: claim_one_held (sqlite)
-- claim_held a row at a time: SQLite has no round trip to save, and no arrays.
UPDATE {jobs} SET "status" = %(queued)s, "enqueued_at" = %(now)s, "broker_ref" = %(ref)s
WHERE "id" = %(id)s AND "message_id" = %(message_id)s AND "revision" = %(revision)s
AND (%(stamp)s IS NULL OR "broker_ref" = %(stamp)s)
AND "status" = %(pending)s AND "parked_on" IS NULL

-- name: start_attempt
-- Mark an attempt running, if it may start; {token}: given_or_next_token, or drawn_token after a draw.
UPDATE {jobs} SET {start_set}, "parked_on" = NULL, {hold_release}
WHERE {startable_row}
RETURNING "message_id", "actor_name", "attempts", "unique_key", "fencing_token", "checkpoints"

-- name: start_attempt_fenced (postgresql)
-- start_attempt after the key's next fencing token is drawn, and older attempts fenced out, in the same statement.
WITH drawn AS ({draw_token}), revoked AS ({revoke_for_start}) {start_attempt}

-- name: startable
-- Whether start_attempt would take the row now (read only).
SELECT 1 FROM {jobs} WHERE {startable_row}

-- name: startable_row
-- The row may start: the message's revision, not finished, and no other attempt running under a live lease
-- (a running row whose lease ran out is a crashed attempt's; one a waker's claim started is its woken delivery's).
"id" = %(id)s AND "revision" = %(revision)s AND "status" NOT IN (%(succeeded)s, %(failed)s)
AND ("status" <> %(running)s OR "lease_until" IS NULL OR "lease_until" <= %(live_after)s
OR "worker" LIKE %(woken_by)s)

-- name: start_set
-- What every start of an attempt writes: start_attempt, claim_and_start and start_reserved must agree.
-- [a | b]: a claim_and_start (guard: unique_free) leaves a row with unique options queued, as b says.
"status" = [%(running)s | %(queued)s], "attempts" = ["attempts" + 1 | "attempts"],
"started_at" = [%(started_at)s | "started_at"], "lease_until" = [%(lease_until)s | "lease_until"],
"worker" = [%(worker)s | "worker"], "fencing_token" = [{token} | "fencing_token"]

-- name: hold_release
-- A start's release of the unique hold, when the lock type frees the key as the job starts.
"unique_hold" = [CASE WHEN %(release_hold)s = 1 THEN NULL ELSE "unique_hold" END | "unique_hold"]

-- name: given_or_next_token
-- The attempt's token: the one drawn beforehand (SQLite), or the row's next one.
COALESCE(%(token)s, "fencing_token" + 1)

-- name: next_token
-- The attempt's token: the row's next one.
"fencing_token" + 1

-- name: record_refs
-- Record the broker's ids of sent rows ({ref_rows}: ref_row, once per row); a ref set meanwhile is kept.
WITH v(id, ref) AS (VALUES {ref_rows})
UPDATE {jobs} SET "broker_ref" = (SELECT v.ref FROM v WHERE v.id = {jobs}."id")
WHERE "id" IN (SELECT v.id FROM v) AND "broker_ref" IS NULL

-- name: ref_row
-- One row of record_refs' VALUES.
(%(id)s, %(ref)s)


-- name: history_append (postgresql)
-- The row's history (storage/history.py) with %(entry)s appended and only the last %(keep)s entries kept:
-- jsonb concatenation, trimmed by a jsonpath slice, cast back to text.  A job's first outcome (most jobs
-- have one) finds no history: a text of one entry, with no JSON parsed.
CASE WHEN "history" IS NULL THEN '[' || CAST(%(entry)s AS text) || ']'
ELSE CAST(jsonb_path_query_array(CAST("history" AS jsonb) || jsonb_build_array(CAST(%(entry)s AS jsonb)),
'$[last - $n + 1 to last]', jsonb_build_object('n', CAST(%(keep)s AS integer))) AS text) END

-- name: history_append (sqlite)
-- The row's history (storage/history.py) with %(entry)s appended; the oldest entry goes when %(keep)s are there.
-- A job's first outcome finds no history: a text of one entry, with no JSON parsed.
CASE WHEN "history" IS NULL THEN '[' || %(entry)s || ']'
WHEN json_array_length("history") >= %(keep)s
THEN json_insert(json_remove("history", '$[0]'), '$[#]', json(%(entry)s))
ELSE json_insert("history", '$[#]', json(%(entry)s)) END

-- == fencing tokens (storage/fencing.py) ================================================

-- name: draw_token
-- The key's next token: one statement on SQLite (3.35 and later) and PostgreSQL.
INSERT INTO {fences} ("key", "token") VALUES (%(key)s, 1)
ON CONFLICT ("key") DO UPDATE SET "token" = {fences}."token" + 1 RETURNING "token"

-- name: revoke_older
-- Rows of the key still running under an older token lose their attempt (their token moves on to
-- {token}); the drawing job's own row stops being parked (it runs now).  Only rows of the drawing
-- job's app: another app's job of the same key is not ours to fence.
UPDATE {jobs} SET
"fencing_token" = CASE WHEN "id" = %(own)s THEN "fencing_token" ELSE {token} END,
"parked_on" = CASE WHEN "id" = %(own)s THEN NULL ELSE "parked_on" END
WHERE "unique_key" = %(key)s
AND (("status" = %(running)s AND "fencing_token" < {token} AND "id" <> %(own)s)
OR ("id" = %(own)s AND "parked_on" IS NOT NULL))
AND "app" = COALESCE((SELECT me."app" FROM {jobs} AS me WHERE me."id" = %(own)s), "app")

-- name: drawn_token
-- The token a draw_token in a CTE named "drawn" handed out.
(SELECT "token" FROM drawn)

-- name: given_token
-- A token drawn by a statement of its own (SQLite).
%(token)s

-- name: draw_and_revoke (postgresql)
-- draw_token, then revoke_older, as one statement (the revocation in a data-modifying CTE).
WITH drawn AS ({draw_token}), revoked AS ({revoke_older}) SELECT "token" FROM drawn

-- name: revoke_for_start (postgresql)
-- The revocation of start_attempt_fenced: older running attempts of the key fenced out.  The starting
-- row itself is left to the main statement (PostgreSQL does not update one row twice in a statement);
-- joined to it ("me") to keep to its app's rows without another parameter.
UPDATE {jobs} SET "fencing_token" = {token} FROM {jobs} AS me
WHERE {jobs}."unique_key" = %(key)s AND {jobs}."status" = 'running'
AND {jobs}."fencing_token" < {token} AND me."id" = %(id)s AND {jobs}."id" <> me."id"
AND {jobs}."app" = me."app"

-- name: current_token
-- The newest token handed out for a key.
SELECT "token" FROM {fences} WHERE "key" = %(key)s


-- == parking (storage/parking_statements.py) ============================================

-- name: now (postgresql)
-- The database's clock, in the job table's time format (naive UTC).
(statement_timestamp() AT TIME ZONE 'UTC')

-- name: now (sqlite)
-- The database's clock, in the job table's time format (naive UTC); SQLite's is the machine's.
strftime('%Y-%m-%d %H:%M:%f', 'now')

-- name: now_plus_lease (postgresql)
-- The database's clock, %(lease_ms)s later.
((statement_timestamp() AT TIME ZONE 'UTC') + CAST(%(lease_ms)s AS double precision) * INTERVAL '1 millisecond')

-- name: now_plus_lease (sqlite)
-- The database's clock, %(lease_ms)s later.
strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || (CAST(%(lease_ms)s AS REAL) / 1000.0) || ' seconds')

-- name: queue_head
-- A group's next due, unreserved parked row of one app, in serving order ({order}: by_created_at or
-- by_process_after).  The one definition of "next" for claims and reservations.
SELECT "id" FROM {jobs} WHERE "app" = %(app)s AND "parked_on" = %(group)s AND "status" = %(pending)s
AND ("lease_until" IS NULL OR "lease_until" <= {now})
AND ("process_after" IS NULL OR "process_after" <= %(due)s)
ORDER BY {order}, "id" LIMIT 1

-- name: by_created_at
-- Serving order: happens-before.
"created_at"

-- name: by_process_after
-- Serving order: first ready, first served.
"process_after"

-- name: claim_parked (postgresql)
-- Claim a group's next job (pending to queued).  A join on the locked head, so the update finds its
-- row by primary key (with "id = (subquery)" the planner may scan the status index for it instead).
UPDATE {jobs} SET "status" = %(queued)s, {claimed}
FROM ({queue_head} FOR UPDATE SKIP LOCKED) AS head WHERE {jobs}."id" = head."id"
RETURNING {jobs_columns}

-- name: claim_parked (sqlite)
-- Claim a group's next job (pending to queued).  No row locks: the head is checked again as it is updated.
UPDATE {jobs} SET "status" = %(queued)s, {claimed}
WHERE "id" = ({queue_head}) AND "parked_on" = %(group)s AND "status" = %(pending)s
RETURNING {columns}

-- name: claim_and_start (postgresql)
-- claim_parked, the attempt started in the same statement (guard: unique_free) unless the row's options name a unique option.
UPDATE {jobs} SET {start_set}, {hold_release}, {claimed}
FROM ({queue_head} FOR UPDATE SKIP LOCKED) AS head WHERE {jobs}."id" = head."id"
RETURNING {jobs_columns}

-- name: claim_and_start (sqlite)
-- claim_parked, the attempt started in the same statement (guard: unique_free) unless the row's options name a unique option.
UPDATE {jobs} SET {start_set}, {hold_release}, {claimed}
WHERE "id" = ({queue_head}) AND "parked_on" = %(group)s AND "status" = %(pending)s
RETURNING {columns}

-- name: claimed
-- What every claim of a parked row writes besides its status: out of the group, due for delivery.
"parked_on" = NULL, "enqueued_at" = %(now)s, "broker_ref" = %(broker_ref)s, "missing_since" = NULL

-- name: unique_free (postgresql)
-- The row's options name no unique option of its own.
COALESCE(strpos("options", '"unique_'), 0) = 0

-- name: unique_free (sqlite)
-- The row's options name no unique option of its own.
COALESCE(instr("options", '"unique_'), 0) = 0

-- name: no_flush_wait (postgresql)
-- {statement}, a parking move's UPDATE ... RETURNING (storage/parking_statements.py), committed without
-- waiting for the WAL flush: set_config(..., true) sets synchronous_commit for this statement's own
-- (implicit) transaction, which reads it at its commit; the session's setting is untouched.  One
-- statement, so psycopg 3 prepares it (a "SET LOCAL ...; UPDATE" string is two, which its server-side
-- binding refuses).  A move that updates nothing may skip the set_config: it has nothing to flush.
WITH moved AS ({statement})
SELECT moved.* FROM moved, (SELECT set_config('synchronous_commit', 'off', true)) AS no_flush_wait

-- name: park
-- Park a waiting job on a group; a running row whose lease ran out counts as waiting.  Such a row's
-- attempt is over (its worker stalled or died) and the job waits again: its token moves on, so the
-- attempt's fenced writes (heartbeat, checkpoints, retry, outcome) are refused should it wake, and
-- its worker and lease go, so jobs.finish_revoked no longer takes it for the row's attempt.
-- "parked_at" keeps when the job was first parked in this wait: a job woken and parked again before it
-- started keeps it, one parked after an attempt started (a retry, a crashed attempt's re-delivery) gets
-- now ("attempts" moved on).  SET reads the row as it was: the CASEs see the old status.
UPDATE {jobs} SET "status" = %(pending)s, "parked_on" = %(group)s, "options" = %(options)s,
"parked_at" = CASE WHEN "parked_attempt" = "attempts" THEN "parked_at" ELSE %(now)s END,
"parked_attempt" = "attempts",
"fencing_token" = CASE WHEN "status" = %(running)s THEN "fencing_token" + 1 ELSE "fencing_token" END,
"worker" = CASE WHEN "status" = %(running)s THEN NULL ELSE "worker" END,
"lease_until" = CASE WHEN "status" = %(running)s THEN NULL ELSE "lease_until" END
WHERE "id" = %(id)s AND "revision" = %(revision)s AND ("status" IN (%(pending)s, %(queued)s, %(retrying)s)
OR ("status" = %(running)s AND "lease_until" < %(now)s)) RETURNING "created_at", "process_after"

-- name: reserve (postgresql)
-- Reserve a group's next job for a process's deck, until the database's clock passes the lease.
UPDATE {jobs} SET "worker" = %(marker)s, "lease_until" = {now_plus_lease}, "broker_ref" = %(broker_ref)s
FROM ({queue_head} FOR UPDATE SKIP LOCKED) AS head WHERE {jobs}."id" = head."id"
RETURNING {jobs}."id", {jobs}."message_id", {jobs}."actor_name", {jobs}."queue_name", {jobs}."args",
{jobs}."kwargs", {jobs}."options", {jobs}."status", {jobs}."revision", {jobs}."attempts",
{jobs}."unique_key", {jobs}."fencing_token", {jobs}."checkpoints", {jobs}."broker_ref",
{jobs}."created_at", {jobs}."process_after"

-- name: reserve (sqlite)
-- Reserve a group's next job for a process's deck; SQLite checks the head again as it is updated.
UPDATE {jobs} SET "worker" = %(marker)s, "lease_until" = {now_plus_lease}, "broker_ref" = %(broker_ref)s
WHERE "id" = ({queue_head}) AND "parked_on" = %(group)s AND "status" = %(pending)s
AND ("lease_until" IS NULL OR "lease_until" <= {now})
RETURNING "id", "message_id", "actor_name", "queue_name", "args", "kwargs", "options", "status",
"revision", "attempts", "unique_key", "fencing_token", "checkpoints", "broker_ref", "created_at",
"process_after"

-- name: start_reserved
-- Start a row this process reserved, if it is still as its reservation read it (a compare-and-set).
UPDATE {jobs} SET {start_set}, "parked_on" = NULL, "enqueued_at" = %(started_at)s, "missing_since" = NULL
WHERE "id" = %(id)s AND "status" = %(pending)s AND "worker" = %(marker)s AND "revision" = %(revision)s
AND "fencing_token" = %(reserved_token)s AND "broker_ref" = %(broker_ref)s
RETURNING "id", "message_id", "actor_name", "queue_name", "args", "kwargs", "options", "status",
"revision", "attempts", "unique_key", "fencing_token", "checkpoints", "broker_ref", "created_at",
"process_after"


-- == the job table's schema (storage/schema.py) =========================================

-- name: add_app_column (postgresql)
-- Add the app column to a job table of an earlier version: a constant default, so no rewrite of the table.
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS "app" VARCHAR(255) NOT NULL DEFAULT ''

-- name: add_app_column (sqlite)
-- Add the app column to a job table of an earlier version: a constant default, so no rewrite of the table.
ALTER TABLE {jobs} ADD COLUMN "app" VARCHAR(255) NOT NULL DEFAULT ''

-- name: table_columns (postgresql)
-- A table's column names, in the schema given ({schema}: named_schema) or that the search_path resolves.
SELECT column_name FROM information_schema.columns WHERE table_name = %(table)s AND table_schema = {schema}

-- name: named_schema (postgresql)
-- The schema a model names.
%(schema)s

-- name: current_schema (postgresql)
-- The first schema of the connection's search_path.
current_schema()

-- slot_enter: a job enters its slot group: takes up the slot reserved for it when it was
-- woken, or a free slot.
--
-- KEYS[1]  the group's holders: a sorted set of tokens scored with when their lease runs out,
--          ms of Redis server time (<prefix>:slots:<group key>)
-- KEYS[2]  the group's limit override: a string (<prefix>:limit:<group key>)
-- KEYS[3]  the actor's limit override: a string (<prefix>:actor-limit:<actor name>)
-- KEYS[4]  the limit the group's last message brought: a string
--          (<prefix>:message-limit:<group key>)
-- KEYS[5]  set while Redis holds every run-time limit: a string (<prefix>:limits-loaded)
-- ARGV[1]  the declared limit (-1: none); the first of KEYS[2..4] that is set comes before it
-- ARGV[2]  the job's token
-- ARGV[3]  the lease, ms
-- ARGV[4]  the token of the slot reserved for the job, or ""
-- ARGV[5]  the limit the job's message brought (send_with_options), or "": written to
--          KEYS[4], kept a day, for the decisions taken without the message
--
-- Returns {1, 0} when entered, else {0, ms until a holder's lease runs out (-1: the group
-- is halted, limit 0)}.
--
-- Safe to repeat: a token that already holds a slot entered before (a call sent again
-- after its reply was lost): it is in, with no second slot.

if ARGV[5] ~= '' then redis.call('set', KEYS[4], ARGV[5], 'PX', 86400000) end
-- #include _slot_prelude.lua
if not loaded then return unknown() end
if redis.call('zscore', KEYS[1], ARGV[2]) then hold(ARGV[2], tonumber(ARGV[3])) return {1, 0} end
if ARGV[4] ~= '' and redis.call('zrem', KEYS[1], ARGV[4]) == 1 then held = held - 1 end
if full(held) then return {0, wait()} end
hold(ARGV[2], tonumber(ARGV[3]))
return {1, 0}

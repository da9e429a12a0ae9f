-- slot_pass: hand a held slot on to a new token, unless the group is over its limit
-- without it (then it is given up).
--
-- KEYS[1]  the group's holders: a sorted set of tokens scored with when their lease runs out,
--          ms of Redis server time (<prefix>:slots:<group key>)
-- KEYS[2]  the group's limit override: a string (<prefix>:limit:<group key>)
-- KEYS[3]  the actor's limit override: a string (<prefix>:actor-limit:<actor name>)
-- KEYS[4]  the limit the group's last message brought: a string
--          (<prefix>:message-limit:<group key>)
-- KEYS[5]  set while Redis holds every run-time limit: a string (<prefix>:limits-loaded)
-- ARGV[1]  the declared limit (-1: none); the first of KEYS[2..4] that is set comes before it
-- ARGV[2]  the token that holds the slot
-- ARGV[3]  the new token
-- ARGV[4]  the new token's lease, ms
--
-- Returns 1 when handed on, 0 when not (not held, or given up).
--
-- Safe to repeat: a repeat finds the new token in: 1.

-- #include _slot_prelude.lua
if not loaded then return unknown() end
if redis.call('zscore', KEYS[1], ARGV[3]) then return 1 end
if redis.call('zrem', KEYS[1], ARGV[2]) == 0 then return 0 end
if full(held - 1) then return 0 end
hold(ARGV[3], tonumber(ARGV[4]))
return 1

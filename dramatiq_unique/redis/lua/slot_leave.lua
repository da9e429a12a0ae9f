-- slot_leave: a holder leaves its slot, unless someone waits and could have it: then the
-- slot is kept for them, re-issued at once to the new token if one is given (the woken
-- job's: one round trip fewer on every hand-over).
--
-- KEYS[1]  the group's holders: a sorted set of tokens scored with when their lease runs out,
--          ms of Redis server time (<prefix>:slots:<group key>)
-- KEYS[2]  the group's limit override: a string (<prefix>:limit:<group key>)
-- KEYS[3]  the actor's limit override: a string (<prefix>:actor-limit:<actor name>)
-- KEYS[4]  the limit the group's last message brought: a string
--          (<prefix>:message-limit:<group key>)
-- KEYS[5]  set while Redis holds every run-time limit: a string (<prefix>:limits-loaded)
-- KEYS[6]  the parking wake-up flags: a sorted set of parking group names (<prefix>:wakeups)
-- ARGV[1]  the declared limit (-1: none); the first of KEYS[2..4] that is set comes before it
-- ARGV[2]  the token that holds the slot
-- ARGV[3]  the group's parking name (slot:<group key>), looked up in KEYS[6]
-- ARGV[4]  the new token, or ""
-- ARGV[5]  the new token's lease, ms
--
-- Returns 1 released, 2 kept or handed on, 0 not held (its lease ran out).
--
-- Safe to repeat: a repeat after a release answers 0, which is harmless (the caller only
-- looks whether someone waits); a repeat that finds the new token in answers 2.

-- #include _slot_prelude.lua
if not loaded then return unknown() end
if ARGV[4] ~= '' and redis.call('zscore', KEYS[1], ARGV[4]) then return 2 end
if not redis.call('zscore', KEYS[1], ARGV[2]) then return 0 end
if redis.call('zscore', KEYS[6], ARGV[3]) and not full(held - 1) then
  if ARGV[4] ~= '' then
    redis.call('zrem', KEYS[1], ARGV[2])
    hold(ARGV[4], tonumber(ARGV[5]))
  end
  return 2
end
redis.call('zrem', KEYS[1], ARGV[2])
return 1

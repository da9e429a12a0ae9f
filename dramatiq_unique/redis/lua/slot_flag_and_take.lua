-- slot_flag_and_take: a job has just parked: flag its group (its waiters are due for a look
-- in a while), then look at the slots once more and take one if free.
--
-- KEYS[1]  the group's holders: a sorted set of tokens scored with when their lease runs out,
--          ms of Redis server time (<prefix>:slots:<group key>)
-- KEYS[2]  the group's limit override: a string (<prefix>:limit:<group key>)
-- KEYS[3]  the actor's limit override: a string (<prefix>:actor-limit:<actor name>)
-- KEYS[4]  the limit the group's last message brought: a string
--          (<prefix>:message-limit:<group key>)
-- KEYS[5]  set while Redis holds every run-time limit: a string (<prefix>:limits-loaded)
-- KEYS[6]  the parking wake-up flags: a sorted set of parking group names scored with when
--          to look at them, ms of Redis server time (<prefix>:wakeups)
-- ARGV[1]  the declared limit (-1: none); the first of KEYS[2..4] that is set comes before it
-- ARGV[2]  the token to take a slot for
-- ARGV[3]  the lease, ms
-- ARGV[4]  the group's parking name (slot:<group key>), flagged in KEYS[6]
-- ARGV[5]  the delay, ms: the group is due that long from now (an earlier due time is kept)
--
-- Returns 1 when a slot was taken, 0 when not.
--
-- Safe to repeat: a repeat finds its token in: 1 (and the flag keeps the earlier due time).

-- #include _slot_prelude.lua
if not loaded then return unknown() end
-- #include _wakeup_flag.lua
flag(KEYS[6], ARGV[4], now + tonumber(ARGV[5]))
if redis.call('zscore', KEYS[1], ARGV[2]) then return 1 end
if full(held) then return 0 end
hold(ARGV[2], tonumber(ARGV[3]))
return 1

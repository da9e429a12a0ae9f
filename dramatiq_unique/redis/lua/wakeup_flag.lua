-- wakeup_flag: flag a parking group as having waiters, due for a look in a while.
--
-- KEYS[1]  the wake-up flags: a sorted set of parking group names (lock:<unique key>,
--          slot:<group key>) scored with when to look at them, ms of Redis server time
--          (<prefix>:wakeups)
-- ARGV[1]  the group's name
-- ARGV[2]  the delay, ms: the group is due that long from now (an earlier due time is kept)
--
-- Returns the due time asked for (ms of Redis server time).
--
-- Safe to repeat: a repeat keeps the earlier due time.

-- #include _wakeup_flag.lua
local t = redis.call('time')
local due = t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[2])
flag(KEYS[1], ARGV[1], due)
return due

-- wakeup_rescore: look at a flagged parking group again later (an unflagged one stays
-- unflagged).
--
-- KEYS[1]  the wake-up flags: a sorted set of parking group names scored with when to look
--          at them, ms of Redis server time (<prefix>:wakeups)
-- ARGV[1]  the group's name
-- ARGV[2]  the delay, ms: the group is due that long from now
--
-- Returns 0 (ZADD XX only updates; the reply is not used).
--
-- Safe to repeat: a repeat sets about the same due time again.

local t = redis.call('time')
return redis.call('zadd', KEYS[1], 'XX', t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[2]), ARGV[1])

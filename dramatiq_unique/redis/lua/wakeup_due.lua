-- wakeup_due: the flagged parking groups whose time came.
--
-- KEYS[1]  the wake-up flags: a sorted set of parking group names scored with when to look
--          at them, ms of Redis server time (<prefix>:wakeups)
-- ARGV[1]  how many groups to answer at most
--
-- Returns an array of group names, earliest due first.  Writes nothing.

local t = redis.call('time')
return redis.call('zrangebyscore', KEYS[1], '-inf', t[1] * 1000 + math.floor(t[2] / 1000), 'LIMIT', 0, ARGV[1])

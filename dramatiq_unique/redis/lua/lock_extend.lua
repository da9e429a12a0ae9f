-- lock_extend: renew a lock's lease if the token holds it.
--
-- KEYS[1]  the lock: a string holding its holder's token, with a TTL (redlock:<name>)
-- ARGV[1]  the token
-- ARGV[2]  the new lease, ms
--
-- Returns 1 when renewed, 0 when the token does not hold it.
--
-- Safe to repeat: a repeat renews again.

if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0

-- lock_transfer: re-issue a held lock under a new token, with a fresh lease.
--
-- KEYS[1]  the lock: a string holding its holder's token, with a TTL (redlock:<name>)
-- ARGV[1]  the token that holds it
-- ARGV[2]  the new token
-- ARGV[3]  the new lease, ms
--
-- Returns 1 when re-issued, 0 when neither token holds it.
--
-- Safe to repeat: a repeat finds the new token already there: done (its lease renewed).

local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] or holder == ARGV[2] then return redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) and 1 end
return 0

-- lock_release: release a lock if the token holds it.
--
-- KEYS[1]  the lock: a string holding its holder's token, with a TTL (redlock:<name>)
-- ARGV[1]  the token
--
-- Returns 1 when released, 0 when the token did not hold it.
--
-- Safe to repeat: a repeat answers 0, "not held", which its callers take as "look
-- whether someone waits": harmless.

if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0

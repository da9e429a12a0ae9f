-- lock_force: take a lock whoever holds it (the caller knows the holder is stale).
--
-- KEYS[1]  the lock: a string holding its holder's token, with a TTL (redlock:<name>)
-- ARGV[1]  the token to take it for
-- ARGV[2]  the lease, ms
--
-- Returns 1.
--
-- Safe to repeat: a repeat writes the same token again, with a fresh lease.

return redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) and 1

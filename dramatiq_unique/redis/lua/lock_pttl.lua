-- lock_pttl: the time left on a token's hold of a lock.
--
-- KEYS[1]  the lock: a string holding its holder's token, with a TTL (redlock:<name>)
-- ARGV[1]  the token
--
-- Returns the ms left on the token's hold; -3 if the token does not hold the lock.
-- Writes nothing.

if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pttl', KEYS[1]) end
return -3

-- lock_release_unless: release a lock unless a member is in a sorted set (someone may be
-- waiting for the lock: then its holder keeps it, to hand it on).
--
-- KEYS[1]  the lock: a string holding its holder's token, with a TTL (redlock:<name>)
-- KEYS[2]  the parking wake-up flags: a sorted set of group names (<prefix>:wakeups)
-- ARGV[1]  the token
-- ARGV[2]  the member: the lock's parking group name (lock:<unique key>)
--
-- Returns 1 released, 2 kept (the member is flagged), 0 not held.
--
-- Safe to repeat: a repeat after a release answers 0, as lock_release does: harmless.

if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('zscore', KEYS[2], ARGV[2]) then return 2 end
redis.call('del', KEYS[1])
return 1

-- lock_acquire: take a lock for a token, or answer who holds it.
--
-- KEYS[1]  the lock: a string holding its holder's token, with a TTL, as pottery writes it
--          (redlock:<name>: redlock:<prefix>:queue:<unique key> for a queue lock,
--          redlock:<prefix>:run:<unique key> for an execution lock)
-- ARGV[1]  the token to take it for
-- ARGV[2]  the lease, ms
--
-- Returns 1 when taken, else the holder's token (a string): flat replies, this is on
-- every send.
--
-- Safe to repeat: a lock that already holds the token is ours (a call sent again after
-- its reply was lost): its lease is renewed and it counts as taken.

local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]) return 1 end
if holder then return holder end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1

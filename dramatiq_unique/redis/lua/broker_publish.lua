-- broker_publish: publish a tracked message as Dramatiq's dispatch.lua does on "enqueue"
-- (the producer's heartbeat, the body in the queue's message hash, its id at the tail of
-- the queue), and write a unique send's queue lock in the same round trip
-- (broker/publish.py).
--
-- KEYS[1]  the broker processes: a sorted set of broker ids scored with their last call's
--          time, ms (<namespace>:__heartbeats__)
-- KEYS[2]  the queue: a list of message ids (<namespace>:<queue>)
-- KEYS[3]  the queue's message hash: message id -> body (<namespace>:<queue>.msgs)
-- KEYS[4]  optional: a queue lock, a string holding its holder's token, with a TTL
--          (redlock:<prefix>:queue:<unique key>)
-- ARGV[1]  the time, ms
-- ARGV[2]  the broker's id (the producer's)
-- ARGV[3]  the message's id (the broker's)
-- ARGV[4]  the message's body
-- ARGV[5]  with KEYS[4]: the lock's token
-- ARGV[6]  with KEYS[4]: the lock's lease, ms
--
-- Returns 1.
--
-- Safe to repeat: HSETNX, so a call sent again after a broken connection does not queue
-- the message twice (the lock is written again with the same token).

if KEYS[4] then redis.call('set', KEYS[4], ARGV[5], 'PX', ARGV[6]) end
redis.call('zadd', KEYS[1], ARGV[1], ARGV[2])
if redis.call('hsetnx', KEYS[3], ARGV[3], ARGV[4]) == 1 then redis.call('rpush', KEYS[2], ARGV[3]) end
return 1

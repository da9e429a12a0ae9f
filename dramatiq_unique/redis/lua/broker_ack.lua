-- broker_ack: ack a tracked message as Dramatiq's dispatch.lua does on "ack" (the worker's
-- heartbeat, the id out of its ack set and the body out of the queue's message hash), and
-- release an until_executing job's queue lock in the same round trip (broker/acks.py).
--
-- KEYS[1]  the broker processes: a sorted set of broker ids scored with their last call's
--          time, ms (<namespace>:__heartbeats__)
-- KEYS[2]  this worker's ack set for the queue: a set of message ids
--          (<namespace>:__acks__.<worker id>.<queue>)
-- KEYS[3]  the queue's message hash: message id -> body (<namespace>:<queue>.msgs)
-- KEYS[4]  optional: a queue lock, a string holding its holder's token
--          (redlock:<prefix>:queue:<unique key>)
-- ARGV[1]  the time, ms
-- ARGV[2]  the broker's id (this worker's)
-- ARGV[3]  the message's id (the broker's)
-- ARGV[4]  with KEYS[4]: the lock's token; released only if it still holds the lock (a send
--          of the key meanwhile overwrote it: the lock names another job, left alone)
--
-- Returns 1.
--
-- Safe to repeat: the id is gone from the ack set and the lock released: nothing to do again.

redis.call('zadd', KEYS[1], ARGV[1], ARGV[2])
if redis.call('srem', KEYS[2], ARGV[3]) > 0 then redis.call('hdel', KEYS[3], ARGV[3]) end
if KEYS[4] and redis.call('get', KEYS[4]) == ARGV[4] then redis.call('del', KEYS[4]) end
return 1

-- broker_claim: write a woken job's message as the broker's fetch would have left it for
-- this worker (body in the queue's message hash, id in this worker's ack set), so it is
-- acked, requeued and recovered as any fetched message (broker/publish.py).
--
-- KEYS[1]  the queue's message hash: message id -> body (<namespace>:<queue>.msgs)
-- KEYS[2]  this worker's ack set for the queue: a set of message ids
--          (<namespace>:__acks__.<worker id>.<queue>)
-- ARGV[1]  the message's id (the broker's)
-- ARGV[2]  the message's body
--
-- Returns 1.
--
-- Safe to repeat: a repeat writes the same body and id again.

redis.call('hset', KEYS[1], ARGV[1], ARGV[2])
redis.call('sadd', KEYS[2], ARGV[1])
return 1

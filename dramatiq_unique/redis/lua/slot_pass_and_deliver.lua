-- slot_pass_and_deliver: slot_pass, and when the slot was handed on, a local delivery of
-- the woken job's message, written as broker_claim.lua writes it (parking/deck.py): one
-- round trip for both.
--
-- KEYS[1]  the group's holders: a sorted set of tokens scored with when their lease runs out,
--          ms of Redis server time (<prefix>:slots:<group key>)
-- KEYS[2]  the group's limit override: a string (<prefix>:limit:<group key>)
-- KEYS[3]  the actor's limit override: a string (<prefix>:actor-limit:<actor name>)
-- KEYS[4]  the limit the group's last message brought: a string
--          (<prefix>:message-limit:<group key>)
-- KEYS[5]  set while Redis holds every run-time limit: a string (<prefix>:limits-loaded)
-- KEYS[6]  the woken message's queue's message hash: message id -> body
--          (<namespace>:<queue>.msgs)
-- KEYS[7]  this worker's ack set for that queue: a set of message ids
--          (<namespace>:__acks__.<worker id>.<queue>)
-- ARGV[1]  the declared limit (-1: none); the first of KEYS[2..4] that is set comes before it
-- ARGV[2]  the token that holds the slot
-- ARGV[3]  the new token (the woken job's)
-- ARGV[4]  the new token's lease, ms
-- ARGV[5]  the message's id (the broker's)
-- ARGV[6]  the message's body
--
-- Returns 1 when handed on (and the message written), 0 when not, with nothing written.
--
-- Safe to repeat: a repeat finds the new token in: 1, nothing written again (the message
-- may be taken by now).

-- #include _slot_prelude.lua
if not loaded then return unknown() end
if redis.call('zscore', KEYS[1], ARGV[3]) then return 1 end
if redis.call('zrem', KEYS[1], ARGV[2]) == 0 then return 0 end
if full(held - 1) then return 0 end
hold(ARGV[3], tonumber(ARGV[4]))
redis.call('hset', KEYS[6], ARGV[5], ARGV[6])
redis.call('sadd', KEYS[7], ARGV[5])
return 1

-- slot_renew: a holder's heartbeat() renews its lease; a holder whose lease lapsed gets
-- back in if there is room.
--
-- KEYS[1]  the group's holders: a sorted set of tokens scored with when their lease runs out,
--          ms of Redis server time (<prefix>:slots:<group key>)
-- KEYS[2]  the group's limit override: a string (<prefix>:limit:<group key>)
-- KEYS[3]  the actor's limit override: a string (<prefix>:actor-limit:<actor name>)
-- KEYS[4]  the limit the group's last message brought: a string
--          (<prefix>:message-limit:<group key>)
-- KEYS[5]  set while Redis holds every run-time limit: a string (<prefix>:limits-loaded)
-- ARGV[1]  the declared limit (-1: none); the first of KEYS[2..4] that is set comes before it
-- ARGV[2]  the holder's token
-- ARGV[3]  the new lease, ms
--
-- Returns 1 when renewed, 0 when the slot is lost (the lease lapsed and the group is full).
--
-- Safe to repeat: a repeat renews again.

-- #include _slot_prelude.lua
if not loaded then return unknown() end
if redis.call('zscore', KEYS[1], ARGV[2]) or not full(held) then
  hold(ARGV[2], tonumber(ARGV[3]))
  return 1
end
return 0

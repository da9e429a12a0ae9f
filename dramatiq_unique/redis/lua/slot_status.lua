-- slot_status: a slot group's state (concurrency_status()).
--
-- KEYS[1]  the group's holders: a sorted set of tokens scored with when their lease runs out,
--          ms of Redis server time (<prefix>:slots:<group key>)
-- KEYS[2]  the group's limit override: a string (<prefix>:limit:<group key>)
-- KEYS[3]  the actor's limit override: a string (<prefix>:actor-limit:<actor name>)
-- KEYS[4]  the limit the group's last message brought: a string
--          (<prefix>:message-limit:<group key>)
-- KEYS[5]  set while Redis holds every run-time limit: a string (<prefix>:limits-loaded)
-- KEYS[6]  the group's notes: a hash of token -> the message id of the job it was handed to
--          (<prefix>:slot-jobs:<group key>; slot_note.lua)
-- ARGV[1]  the declared limit (-1: none); the first of KEYS[2..4] that is set comes before it
--
-- Returns {holders, effective limit, group override or nil, actor override or nil, ms
-- until a holder's lease runs out (-1: halted), 1 if KEYS[5] is set else 0, the limit the
-- last message brought or nil, then the message id of each job noted in KEYS[6] whose token
-- still holds a slot}.  Unlike the other slot scripts it answers without KEYS[5] (the limit
-- is then the one Redis has left).  Writes nothing but the drop of the holders whose lease
-- ran out.

-- #include _slot_prelude.lua
local found = {held, limit, redis.call('get', KEYS[2]), redis.call('get', KEYS[3]), wait(), loaded and 1 or 0,
  redis.call('get', KEYS[4])}
local notes = redis.call('hgetall', KEYS[6])
for i = 1, #notes, 2 do
  if redis.call('zscore', KEYS[1], notes[i]) then found[#found + 1] = notes[i + 1] end
end
return found

-- slot_status: a slot group's state (concurrency_status()).
--
-- KEYS[1]  the group's holders: a sorted set of tokens scored with when their lease runs out,
--          ms of Redis server time (<prefix>:slots:<group key>)
-- KEYS[2]  the group's limit override: a string (<prefix>:limit:<group key>)
-- KEYS[3]  the actor's limit override: a string (<prefix>:actor-limit:<actor name>)
-- KEYS[4]  the limit the group's last message brought: a string
--          (<prefix>:message-limit:<group key>)
-- ARGV[1]  the declared limit (-1: none); the first of KEYS[2..4] that is set comes before it
--
-- Returns {holders, effective limit, group override or nil, actor override or nil, ms
-- until a holder's lease runs out (-1: halted)}.  Writes nothing but the drop of the
-- holders whose lease ran out.

-- #include _slot_prelude.lua
return {held, limit, redis.call('get', KEYS[2]), redis.call('get', KEYS[3]), wait()}

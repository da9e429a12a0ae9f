-- _slot_prelude: a fragment, not a script; included by every slot_*.lua script, which all
-- take the same first five keys and first argument:
--
-- KEYS[1]  the group's holders: a sorted set of holder tokens scored with when their lease
--          runs out, ms of Redis server time (<prefix>:slots:<group key>)
-- KEYS[2]  the group's limit override: a string (<prefix>:limit:<group key>)
-- KEYS[3]  the actor's limit override: a string (<prefix>:actor-limit:<actor name>)
-- KEYS[4]  the limit the group's last message brought: a string, kept a day
--          (<prefix>:message-limit:<group key>)
-- KEYS[5]  set while Redis holds every run-time limit of the app's database: a string
--          (<prefix>:limits-loaded; slots/overrides.py)
-- ARGV[1]  the declared limit (-1: none)
--
-- It drops the holders whose lease ran out (a holder that died stops counting when its
-- lease ends, whoever looks next) and defines: ``now`` (ms of Redis server time),
-- ``limit`` (the first of KEYS[2], KEYS[3], KEYS[4], ARGV[1] that is set; -1: none),
-- ``held`` (the holders left), ``full(n)`` (whether n holders fill the group), ``hold(token,
-- ttl)`` (hold a slot for ``token`` for ``ttl`` ms, the set kept at least that long),
-- ``wait()`` (ms until a holder's lease runs out; -1 if the group is halted, limit 0),
-- ``loaded`` (whether KEYS[5] is set) and ``unknown()`` (the error a script that decides
-- answers when it is not: Redis lost the run-time limits, and a halted group must not run
-- at its declared limit; the caller puts them back and asks again).

local t = redis.call('time')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
local limit = tonumber(redis.call('get', KEYS[2]) or redis.call('get', KEYS[3]) or redis.call('get', KEYS[4])
  or ARGV[1])
local held = redis.call('zcard', KEYS[1])
local function full(n) return limit >= 0 and n >= limit end
local function hold(token, ttl)
  redis.call('zadd', KEYS[1], now + ttl, token)
  if redis.call('pttl', KEYS[1]) < ttl then redis.call('pexpire', KEYS[1], ttl) end
end
local function wait()
  if limit == 0 then return -1 end
  local first = redis.call('zrange', KEYS[1], 0, 0, 'WITHSCORES')
  if #first == 0 then return 0 end
  return math.max(tonumber(first[2]) - now, 0)
end
local loaded = redis.call('exists', KEYS[5]) == 1
local function unknown() return redis.error_reply('LIMITS_UNKNOWN Redis holds no run-time limits') end

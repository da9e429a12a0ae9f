-- _wakeup_flag: a fragment, not a script; included by the scripts that flag a parking group
-- (wakeup_flag.lua, slot_flag_and_take.lua).
--
-- flag(key, member, due): flag ``member`` in the wake-up flags ``key`` (a sorted set of
-- parking group names scored with when to look at them, ms of Redis server time) as due at
-- ``due``; an earlier due time is kept.  Safe to repeat: a repeat changes nothing.

local function flag(key, member, due)
  local score = redis.call('zscore', key, member)
  if not score or tonumber(score) > due then redis.call('zadd', key, due, member) end
end

-- slot_note: a slot was handed to a job that waits in the broker for a worker thread: note
-- which job the token is for, so that the operator's views name it (slot_status reads the
-- notes); the notes of tokens no longer in the group are dropped.
--
-- KEYS[1]  the group's holders: a sorted set of tokens scored with when their lease runs out,
--          ms of Redis server time (<prefix>:slots:<group key>)
-- KEYS[2]  the group's notes: a hash of token -> the message id of the job it was handed to
--          (<prefix>:slot-jobs:<group key>), kept as long as the holders
-- ARGV[1]  the token
-- ARGV[2]  the job's message id
--
-- Returns 1 when noted, 0 when the token holds no slot (any more).
--
-- Safe to repeat: a repeat writes the same note again.

for _, token in ipairs(redis.call('hkeys', KEYS[2])) do
  if not redis.call('zscore', KEYS[1], token) then redis.call('hdel', KEYS[2], token) end
end
if not redis.call('zscore', KEYS[1], ARGV[1]) then return 0 end
redis.call('hset', KEYS[2], ARGV[1], ARGV[2])
redis.call('pexpire', KEYS[2], math.max(redis.call('pttl', KEYS[1]), 1))
return 1

-- Leave a lock once; the last exit deletes it and wakes waiters.
-- KEYS[1] lock hash
-- ARGV[1] owner id, ARGV[2] release channel
-- Returns -1 not ours (lost), 0 released, n > 0 still held n times.
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return -1
end
local left = redis.call('hincrby', KEYS[1], ARGV[1], -1)
if left > 0 then
  return left
end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[2], ARGV[1])
return 0

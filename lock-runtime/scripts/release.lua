-- End one acquisition: delete the lock if this owner holds it, and wake
-- waiters.
-- KEYS[1] lock
-- ARGV[1] owner id, ARGV[2] release channel, ARGV[3] '1' to publish also
-- when the lock is absent (Redlock: waiters may listen on a node where this
-- owner's lock never landed).
-- Returns 1 released, 0 not this owner's (expired, deleted, or released by
-- an earlier send of this same release).
local cur = redis.call('get', KEYS[1])
if cur == ARGV[1] then
  redis.call('del', KEYS[1])
  redis.call('publish', ARGV[2], '')
  return 1
end
if cur == false and ARGV[3] == '1' then
  redis.call('publish', ARGV[2], '')
end
return 0

-- End one acquisition: delete the lock if this owner holds it, and wake
-- waiters.
-- KEYS[1] lock
-- ARGV[1] owner id, ARGV[2] release channel, ARGV[3] when to wake waiters:
-- 'r' if this released the lock, 'a' also when the lock is absent (Redlock:
-- waiters may listen on a node where this owner's lock never landed), 'n'
-- never (taking back a partial Redlock grant frees nothing).
-- Returns 1 released, 0 absent (expired, deleted, or released by an earlier
-- send of this same release), -1 held by another owner.
local cur = redis.pcall('get', KEYS[1])
if cur ~= false and type(cur) ~= 'string' then
  -- Not a lock of this layout (an error reply): never this owner's.
  cur = '?'
end
if cur ~= false and string.sub(cur, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  redis.call('del', KEYS[1])
  if ARGV[3] ~= 'n' then
    redis.call('publish', ARGV[2], '')
  end
  return 1
end
if cur ~= false then
  return -1
end
if ARGV[3] == 'a' then
  redis.call('publish', ARGV[2], '')
end
return 0

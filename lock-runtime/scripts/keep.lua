-- End a hold that must stay taken a while longer (min_hold): the lock is
-- left to expire ARGV[2] ms from now instead of deleted, unrenewed.
-- KEYS[1] lock, KEYS[2] readers (see acquire.lua)
-- ARGV[1] owner id, ARGV[2] ms left
-- The hold is renamed "<owner>!" (a writer's value, or a reader's entry in
-- the readers), so that a renewal of this owner still on its way (sent
-- before, or sent again by a transport) finds no hold to extend, and a
-- repeat of this call finds its work done. The expiry only ever shrinks.
-- Returns 1 kept (also: kept by an earlier send), 0 not this owner's.
local owner, left = ARGV[1], tonumber(ARGV[2])
local kept = owner .. '!'
local cur = redis.pcall('get', KEYS[1])
if type(cur) ~= 'string' then
  return 0
end
if string.find(owner, ':r', 1, true) == nil then
  local holder = string.match(cur, '^(%S+)')
  if holder == kept then
    return 1
  end
  if holder ~= owner then
    return 0
  end
  redis.call('set', KEYS[1], kept .. string.sub(cur, #owner + 1), 'KEEPTTL')
  if redis.call('pttl', KEYS[1]) > left then
    redis.call('pexpire', KEYS[1], left)
  end
  return 1
end
if cur ~= '~r' and string.sub(cur, 1, 3) ~= '~r ' then
  return 0
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = tonumber(redis.call('zscore', KEYS[2], owner))
if not ends then
  return redis.call('zscore', KEYS[2], kept) and 1 or 0
end
if ends <= now then
  return 0
end
redis.call('zrem', KEYS[2], owner)
redis.call('zadd', KEYS[2], math.min(ends, now + left), kept)
-- The lock and its readers live exactly as long as the longest reader.
local longest = tonumber(redis.call('zrange', KEYS[2], -1, -1, 'WITHSCORES')[2])
redis.call('pexpire', KEYS[1], longest - now)
redis.call('pexpire', KEYS[2], longest - now)
return 1

-- End a permit that must stay taken a while longer (min_hold): it stays
-- counted until ARGV[2] ms from now, unrenewed (see keep.lua for locks).
-- KEYS[1] the semaphore (a hash, see permit.lua)
-- ARGV[1] owner id, ARGV[2] ms left
-- The field is renamed "<owner>!", so that a renewal of this owner still
-- on its way finds no permit to extend, and a repeat of this call finds
-- its work done. Its lease end only ever shrinks.
-- Returns 1 kept (also: kept by an earlier send), 0 not this owner's.
local sem, owner = KEYS[1], ARGV[1]
local kept = owner .. '!'
local cur = redis.pcall('hget', sem, owner)
if type(cur) ~= 'string' then
  if type(cur) ~= 'table' and redis.call('hexists', sem, kept) == 1 then
    return 1
  end
  return 0
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends, tok = string.match(cur, '^(%d+) (%S+)$')
if not ends or tonumber(ends) <= now then
  redis.call('hdel', sem, owner)
  return 0
end
-- Written before the owner's field goes, so that the hash never empties
-- (an emptied hash is deleted, and the field written then would live
-- without an expiry).
redis.call('hset', sem, kept, math.min(tonumber(ends), now + tonumber(ARGV[2])) .. ' ' .. tok)
redis.call('hdel', sem, owner)
return 1

-- Raise a granted permit to the token a Redlock acquisition chose, and the
-- slot's counter with it (see raise_fence.lua for locks).
-- KEYS[1] the semaphore (a hash, see permit.lua), KEYS[2] token counter
-- ARGV[1] owner id, ARGV[2] token, ARGV[3] how long the counter outlives
-- its last use, in ms
local token = tonumber(ARGV[2])
local cur = tonumber(redis.call('get', KEYS[2]) or '0')
if not cur or cur < token then
  redis.call('set', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
local value = redis.pcall('hget', KEYS[1], ARGV[1])
if type(value) == 'string' then
  local ends, held = string.match(value, '^(%d+) (%S+)$')
  if ends and (tonumber(held) or 0) < token then
    redis.call('hset', KEYS[1], ARGV[1], ends .. ' ' .. ARGV[2])
  end
end
return 1

-- Raise a granted hold to the token a Redlock acquisition chose, and the
-- slot's counter with it: every granted node learns the token handed out,
-- so that any later majority sees it.
-- KEYS[1] lock, KEYS[2] token counter (see acquire.lua)
-- ARGV[1] owner id, ARGV[2] token, ARGV[3] how long the counter outlives
-- its last use, in ms
local token = tonumber(ARGV[2])
local cur = tonumber(redis.call('get', KEYS[2]) or '0')
if not cur or cur < token then
  redis.call('set', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
local value = redis.pcall('get', KEYS[1])
if type(value) == 'string' then
  local holder, held, rest = string.match(value, '^(%S+) (%S+)(.*)$')
  if holder == ARGV[1] and (tonumber(held) or 0) < token then
    redis.call('set', KEYS[1], holder .. ' ' .. ARGV[2] .. rest, 'KEEPTTL')
  end
end
return 1

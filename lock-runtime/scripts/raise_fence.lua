-- Raise a granted hold to the token a Redlock acquisition chose, and the
-- slot's counter with it: every granted node learns the token handed out,
-- so that any later majority sees it.
-- KEYS[1] lock, KEYS[2] token counter (see acquire.lua)
-- ARGV[1] owner id, ARGV[2] token, ARGV[3] how long the counter outlives
-- its last use, in ms
-- Tokens are compared exactly at any length: as digit strings.
local token = string.match(ARGV[2], '^0*(%d+)$')
local function below(n)
  return #n < #token or (#n == #token and n < token)
end
local last = redis.call('get', KEYS[2])
local n = last and string.match(last, '^0*(%d+)$')
if last and not n then
  -- Refused as acquire.lua refuses it, and left as it was.
  return redis.error_reply('token counter ' .. KEYS[2] .. ' is not an integer')
end
if not n or below(n) then
  redis.call('set', KEYS[2], token, 'PX', ARGV[3])
end
local value = redis.pcall('get', KEYS[1])
if type(value) == 'string' then
  local holder, held, rest = string.match(value, '^(%S+) (%S+)(.*)$')
  local h = held and string.match(held, '^0*(%d+)$')
  if holder == ARGV[1] and (not h or below(h)) then
    redis.call('set', KEYS[1], holder .. ' ' .. token .. rest, 'KEEPTTL')
  end
end
return 1

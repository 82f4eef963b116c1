-- Raise a granted permit to the token a Redlock acquisition chose, and the
-- slot's counter with it (see raise_fence.lua for locks).
-- KEYS[1] the semaphore (a hash, see permit.lua), KEYS[2] token counter
-- ARGV[1] owner id, ARGV[2] token, ARGV[3] how long the counter outlives
-- its last use, in ms
-- Returns {1} raised (or nothing to raise), {0, counter} refused: another
-- permit here already carries that token. Permits overlap, so two
-- acquisitions that chose the same token from different nodes would hold
-- it at once; any two permit quorums share a node, and there the later
-- raise is refused and its acquirer raises again above the counter.
-- Tokens are compared exactly at any length: as digit strings. A counter
-- that is not an integer is refused, and left as it was.
local owner = ARGV[1]
local function digits(s)
  return s and string.match(s, '^0*(%d+)$')
end
local function below(n, t)
  return #n < #t or (#n == #t and n < t)
end
local token = digits(ARGV[2])
local last = redis.call('get', KEYS[2])
local cur = digits(last)
if last and not cur then
  return redis.error_reply('token counter ' .. KEYS[2] .. ' is not an integer')
end
local value = redis.pcall('hget', KEYS[1], owner)
if type(value) == 'string' then
  local ends, held = string.match(value, '^(%d+) (%S+)$')
  local h = digits(held)
  if ends and (not h or below(h, token)) then
    local all = redis.call('hgetall', KEYS[1])
    for i = 1, #all, 2 do
      if all[i] ~= owner and digits(string.match(all[i + 1], ' (%S+)$')) == token then
        if cur and below(token, cur) then
          return {0, cur}
        end
        return {0, token}
      end
    end
    redis.call('hset', KEYS[1], owner, ends .. ' ' .. token)
  end
end
if not cur or below(cur, token) then
  redis.call('set', KEYS[2], token, 'PX', ARGV[3])
end
return {1}

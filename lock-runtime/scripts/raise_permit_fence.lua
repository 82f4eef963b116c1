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
local owner, token = ARGV[1], tonumber(ARGV[2])
local value = redis.pcall('hget', KEYS[1], owner)
if type(value) == 'string' then
  local ends, held = string.match(value, '^(%d+) (%S+)$')
  if ends and (tonumber(held) or 0) < token then
    local all = redis.call('hgetall', KEYS[1])
    for i = 1, #all, 2 do
      if all[i] ~= owner and tonumber(string.match(all[i + 1], ' (%S+)$') or '') == token then
        local cur = tonumber(redis.call('get', KEYS[2]) or '0') or 0
        return {0, math.max(cur, token)}
      end
    end
    redis.call('hset', KEYS[1], owner, ends .. ' ' .. ARGV[2])
  end
end
local cur = tonumber(redis.call('get', KEYS[2]) or '0')
if not cur or cur < token then
  redis.call('set', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
return {1}

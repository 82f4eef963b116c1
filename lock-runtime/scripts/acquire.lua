-- Take a lock for one acquisition.
-- KEYS[1] lock, KEYS[2] fence counter
-- ARGV[1] owner id (unique per acquisition), ARGV[2] lease in ms,
-- ARGV[3] (optional) the token floor in microseconds; default: this
-- server's clock
-- The lock holds "<owner> <token>".
-- Returns {1, token} taken, {2, token} already taken by this very
-- acquisition (a repeat whose first reply was lost), {0, pttl} busy.
local last = redis.call('get', KEYS[2])
local n = tonumber(last or '0')
if n == nil then
  return redis.error_reply('fence counter ' .. KEYS[2] .. ' is not an integer')
end
-- Tokens never fall below the server clock in microseconds, so a counter
-- that lost increments (failover to a lagging replica, restart without
-- persistence, eviction) still hands out tokens above every earlier one.
local floor = tonumber(ARGV[3])
if floor == nil then
  local t = redis.call('time')
  floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local token = string.format('%.0f', math.max(n + 1, floor))
if redis.call('set', KEYS[1], ARGV[1] .. ' ' .. token, 'NX', 'PX', ARGV[2]) then
  redis.call('set', KEYS[2], token)
  return {1, tonumber(token)}
end
-- Anything but a string (a lock of another layout, foreign data) is busy.
local cur = redis.pcall('get', KEYS[1])
if type(cur) == 'string' and string.sub(cur, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {2, tonumber(string.sub(cur, #ARGV[1] + 2))}
end
return {0, redis.call('pttl', KEYS[1])}

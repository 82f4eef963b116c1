-- Take a lock for one acquisition.
-- KEYS[1] lock, KEYS[2] fence counter
-- ARGV[1] owner id (unique per acquisition), ARGV[2] lease in ms
-- Returns {1, token} taken, {2, token} already taken by this very
-- acquisition (a repeat whose first reply was lost), {0, pttl} busy.
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local last = redis.call('get', KEYS[2])
  local n = tonumber(last or '0')
  if n == nil then
    redis.call('del', KEYS[1])
    return redis.error_reply('fence counter ' .. KEYS[2] .. ' is not an integer')
  end
  -- Tokens never fall below the server clock in microseconds, so a counter
  -- that lost increments (failover to a lagging replica, restart without
  -- persistence, eviction) still hands out tokens above every earlier one.
  local t = redis.call('time')
  local token = math.max(n + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
  redis.call('set', KEYS[2], string.format('%.0f', token))
  return {1, token}
end
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {2, tonumber(redis.call('get', KEYS[2]) or '0')}
end
return {0, redis.call('pttl', KEYS[1])}

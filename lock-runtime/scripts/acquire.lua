-- Take or re-enter a lock.
-- KEYS[1] lock hash, KEYS[2] fence counter
-- ARGV[1] owner id, ARGV[2] lease in ms
-- Returns {1, fence} fresh, {2, fence} re-entered, {0, pttl} busy.
if redis.call('exists', KEYS[1]) == 0 then
  redis.call('hset', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, redis.call('incr', KEYS[2])}
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[1], 1)
  -- A nested holder may ask for a longer lease, never a shorter one.
  if redis.call('pttl', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('pexpire', KEYS[1], ARGV[2])
  end
  return {2, tonumber(redis.call('get', KEYS[2]) or '0')}
end
return {0, redis.call('pttl', KEYS[1])}

-- Extend many permits of one client at once (see renew.lua for the
-- arguments): KEYS[i] a semaphore (a hash, see permit.lua), ARGV[i + 2] the
-- rest of the permit's owner id. A permit whose lease ended is no longer
-- one, even if its entry is still there: it goes.
-- Returns one byte per key, '1' renewed, '0' no longer ours.
local out = {}
local lease, front = tonumber(ARGV[1]), ARGV[2]
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #KEYS do
  local sem, o = KEYS[i], front .. ARGV[i + 2]
  -- pcall: a key of another type (a lock's string) is simply not ours.
  local cur = redis.pcall('hget', sem, o)
  local ends, tok
  if type(cur) == 'string' then
    ends, tok = string.match(cur, '^(%d+) (%S+)$')
  end
  if ends and tonumber(ends) > now then
    -- Only lengthened: a renewal still on its way after a min_hold was
    -- stretched to leaves that permit's end as it is.
    if now + lease > tonumber(ends) then
      redis.call('hset', sem, o, (now + lease) .. ' ' .. tok)
    end
    if redis.call('pttl', sem) < lease then
      redis.call('pexpire', sem, lease)
    end
    out[i] = '1'
  else
    if type(cur) == 'string' then
      redis.call('hdel', sem, o)
    end
    out[i] = '0'
  end
end
return table.concat(out)

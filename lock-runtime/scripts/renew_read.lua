-- Extend many read holds of one client at once (see renew.lua for the
-- arguments): KEYS[2i - 1] a lock, KEYS[2i] its readers, ARGV[i + 2] the
-- rest of the reader's owner id. A reader's own lease is its entry in the
-- readers; the lock and its readers live exactly as long as the longest of
-- them (a lease may shrink: the release of a hold with min_hold left). A
-- reader whose own lease ran out is no longer one, even if others kept the
-- lock.
-- Returns one byte per hold, '1' renewed, '0' no longer ours.
local out = {}
local lease, front = tonumber(ARGV[1]), ARGV[2]
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #KEYS / 2 do
  local lock, readers = KEYS[2 * i - 1], KEYS[2 * i]
  local o = front .. ARGV[i + 2]
  local cur = redis.pcall('get', lock)
  local ends = type(cur) == 'string' and (cur == '~r' or string.sub(cur, 1, 3) == '~r ')
    and tonumber(redis.call('zscore', readers, o))
  if ends and ends > now then
    -- Only lengthened: a renewal still on its way after a min_hold was
    -- stretched to leaves that reader's end as it is.
    if now + lease > ends then
      redis.call('zadd', readers, now + lease, o)
    end
    local longest = tonumber(redis.call('zrange', readers, -1, -1, 'WITHSCORES')[2])
    redis.call('pexpire', lock, longest - now)
    redis.call('pexpire', readers, longest - now)
    out[i] = '1'
  else
    out[i] = '0'
  end
end
return table.concat(out)

-- Extend many read holds of one client at once (see renew.lua for the
-- arguments): KEYS[2i - 1] a lock, KEYS[2i] its readers, ARGV[i + 2] the
-- rest of the reader's owner id. A reader's own lease is its entry in the
-- readers; the lock and its readers live at least as long as it. A reader
-- whose own lease ran out is no longer one, even if others kept the lock.
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
    redis.call('zadd', readers, now + lease, o)
    for _, k in ipairs({lock, readers}) do
      if redis.call('pttl', k) < lease then
        redis.call('pexpire', k, lease)
      end
    end
    out[i] = '1'
  else
    out[i] = '0'
  end
end
return table.concat(out)

-- Extend many locks of one client at once: one call per watchdog tick and
-- node. ARGV[1] lease in ms, ARGV[2] the owner ids' common front (the
-- client id and ':'), both shared by the call; KEYS[i] a lock (holding
-- "<owner>" or "<owner> <mark>"), ARGV[i + 2] the rest of its owner id.
-- Returns one byte per key, '1' renewed, '0' no longer ours: a single
-- string is far cheaper to send and parse than an array of ints.
-- A renewal only lengthens: one still on its way when the TTL was raised
-- past its lease (a min_hold stretched to, a longer lease asked for by a
-- nested holder) lands as a no-op instead of cutting the lock short.
local out = {}
local lease, front = ARGV[1], ARGV[2]
local ms = tonumber(lease)
for i = 1, #KEYS do
  -- pcall: a key of another type (a lock of another layout) is simply
  -- not ours, and must not fail the renewal of every other lock.
  local cur = redis.pcall('get', KEYS[i])
  local o = front .. ARGV[i + 2]
  if type(cur) == 'string' and (cur == o or string.sub(cur, 1, #o + 1) == o .. ' ') then
    if redis.call('pttl', KEYS[i]) < ms then
      redis.call('pexpire', KEYS[i], lease)
    end
    out[i] = '1'
  else
    out[i] = '0'
  end
end
return table.concat(out)

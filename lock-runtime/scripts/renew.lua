-- Extend many locks at once: one call per watchdog tick and node.
-- ARGV[1] lease in ms (shared by the call); KEYS[i] lock (holding
-- "<owner> <token>"), ARGV[i + 1] its owner id. Returns one byte per key, '1' renewed, '0' no longer ours:
-- a single string is far cheaper to send and parse than an array of ints.
-- Only the owner's watchdog renews a lock, with a lease that never
-- shrinks, so renewal never shortens what another writer set.
local out = {}
local lease = ARGV[1]
for i = 1, #KEYS do
  -- pcall: a key of another type (a lock of another layout) is simply
  -- not ours, and must not fail the renewal of every other lock.
  local cur = redis.pcall('get', KEYS[i])
  if type(cur) == 'string' and string.sub(cur, 1, #ARGV[i + 1] + 1) == ARGV[i + 1] .. ' ' then
    redis.call('pexpire', KEYS[i], lease)
    out[i] = '1'
  else
    out[i] = '0'
  end
end
return table.concat(out)

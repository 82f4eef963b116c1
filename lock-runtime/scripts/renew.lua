-- Extend many locks at once: one call per watchdog tick and node.
-- ARGV[1] lease in ms (shared by the call); KEYS[i] lock hash, ARGV[i + 1]
-- its owner id. Returns one byte per key, '1' renewed, '0' no longer ours:
-- a single string is far cheaper to send and parse than an array of ints.
local out = {}
local lease = ARGV[1]
for i = 1, #KEYS do
  if redis.call('hexists', KEYS[i], ARGV[i + 1]) == 1 then
    redis.call('pexpire', KEYS[i], lease)
    out[i] = '1'
  else
    out[i] = '0'
  end
end
return table.concat(out)

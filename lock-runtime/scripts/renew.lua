-- Extend many locks at once: one call per watchdog tick and node.
-- KEYS[i] lock hash; ARGV[2i-1] owner id, ARGV[2i] lease in ms.
-- Returns one flag per key: 1 renewed, 0 no longer ours.
local out = {}
for i = 1, #KEYS do
  if redis.call('hexists', KEYS[i], ARGV[2 * i - 1]) == 1 then
    redis.call('pexpire', KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out

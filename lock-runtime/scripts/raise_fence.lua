-- Raise a fence counter to at least ARGV[1] (Redlock: every granted node
-- learns the token that was handed out, so later majorities see it).
-- KEYS[1] fence counter
local cur = tonumber(redis.call('get', KEYS[1]) or '0')
if cur < tonumber(ARGV[1]) then
  redis.call('set', KEYS[1], ARGV[1])
end
return 1

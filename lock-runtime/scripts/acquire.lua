-- Take a lock for one acquisition, or join its queue of waiters.
-- KEYS[1] lock, KEYS[2] fence counter, KEYS[3] queue (owner ids, FIFO),
-- KEYS[4] waiters (owner id -> "<lease ms> <queued until, server ms>")
-- ARGV[1] owner id ("<client id>:<n>", unique per acquisition)
-- ARGV[2] lease in ms
-- ARGV[3] the token floor in microseconds; '' = this server's clock
-- ARGV[4] if busy: '' = just say so; 'w' = mark the lock so that its
--         release publishes a wake-up (Redlock); else how many ms to stay
--         queued, after which a release skips this waiter
-- ARGV[5] '1' if an earlier attempt of this owner may have queued it
-- The lock holds "<owner>", or "<owner> q" once someone queued behind it
-- ("<owner> w" on Redlock), so that its release knows whom to serve
-- without reading anything else.
-- Returns {1, token} taken, {2, token} already this owner's (an earlier
-- send ran, or a release handed it over), {0, pttl, queued at (server ms,
-- 0 = not queued)} busy.
local owner = ARGV[1]
-- Tokens and clocks in microseconds have 16 digits, more than Lua's
-- number-to-string conversion keeps: they stay decimal strings here, and
-- are compared as such (no leading zeros: the longer one is larger).
local function above(a, b)
  return #a > #b or (#a == #b and a > b)
end
if redis.call('set', KEYS[1], owner, 'NX', 'PX', ARGV[2]) then
  -- Tokens never fall below the clock in microseconds, so a counter that
  -- lost increments (failover to a lagging replica, restart without
  -- persistence, eviction) still hands out tokens above every earlier one.
  local token = ARGV[3]
  if token == '' then
    local t = redis.call('time')
    token = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
  end
  local last = redis.call('set', KEYS[2], token, 'GET')
  if last and not above(token, last) then
    if not string.match(last, '^%d+$') then
      redis.call('set', KEYS[2], last)
      redis.call('del', KEYS[1])
      return redis.error_reply('fence counter ' .. KEYS[2] .. ' is not an integer')
    end
    token = string.format('%.0f', tonumber(last) + 1)
    redis.call('set', KEYS[2], token)
  end
  if ARGV[5] == '1' then
    -- Taken directly (the lock had expired) by a queued waiter: it leaves
    -- the queue, and if others still wait, this lock's release serves them.
    redis.call('hdel', KEYS[4], owner)
    redis.call('lrem', KEYS[3], 1, owner)
    if redis.call('llen', KEYS[3]) > 0 then
      redis.call('set', KEYS[1], owner .. ' q', 'KEEPTTL')
    end
  end
  return {1, token}
end
-- Anything but a string (a lock of another layout, foreign data) is busy.
local cur = redis.pcall('get', KEYS[1])
if type(cur) ~= 'string' then
  return {0, redis.call('pttl', KEYS[1]), 0}
end
local holder, mark = cur, ''
if string.sub(cur, -2, -2) == ' ' then
  holder, mark = string.sub(cur, 1, -3), string.sub(cur, -1)
end
if holder == owner then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {2, tonumber(redis.call('get', KEYS[2]))}
end
local pttl = redis.call('pttl', KEYS[1])
if ARGV[4] == '' then
  return {0, pttl, 0}
end
if ARGV[4] == 'w' then
  if mark ~= 'w' then
    redis.call('set', KEYS[1], holder .. ' w', 'KEEPTTL')
  end
  return {0, pttl, 0}
end
local stay = tonumber(ARGV[4])
local t = redis.call('time')
-- Milliseconds have 13 digits: exact as Lua numbers and in concatenation.
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('hset', KEYS[4], owner, ARGV[2] .. ' ' .. (now + stay)) == 1 then
  redis.call('rpush', KEYS[3], owner)
end
-- The queue lives as long as its longest-staying waiter.
for i = 3, 4 do
  if redis.call('pttl', KEYS[i]) < stay then
    redis.call('pexpire', KEYS[i], stay)
  end
end
if mark ~= 'q' then
  redis.call('set', KEYS[1], holder .. ' q', 'KEEPTTL')
end
return {0, pttl, now}

-- Take a lock for one acquisition, or join its queue of waiters.
-- KEYS[1] lock; KEYS[2] the token counter of the lock's hash slot (one per
-- slot, shared by every lock there; see key.rs); KEYS[3..5] the lock's
-- queue, waiters and readers, KEYS[1] .. ':queue', ':waiters', ':readers'
-- (same slot), declared on a Redis Cluster only: there a slot that is
-- moving must refuse the whole call (TRYAGAIN) before it runs, not stop it
-- halfway at a key that moved.
-- ARGV[1] owner id ("<client id>:<n>", a reader's "<client id>:r<n>",
--         unique per acquisition)
-- ARGV[2] lease in ms
-- ARGV[3] if busy: '' = just say so; '<ms>' = queue for that long (a
--         release skips a waiter past it); 'w<ms>' = Redlock: mark the lock
--         so that its release publishes a wake-up (a writer's mark on a
--         read-held lock, which holds back new readers, lapses after <ms>
--         unless the writer asks again)
-- ARGV[4] flags: 'f' hand out a fencing token; 'j' an earlier send of this
--         owner may have queued it (a queuing attempt is checked whatever
--         this says: a transport may send it twice unawares)
-- ARGV[5] how long the counter outlives its last use, in ms
-- ARGV[6] (Redlock) the token floor in microseconds; else the server's clock
-- Trailing arguments at their default are left out (the server pays
-- about 2 000 instructions for each): ARGV[3] '', ARGV[4] 'f', ARGV[5]
-- 86400000 (24 h, the default fence_ttl).
--
-- The lock holds "<holder> <token> <mark> <from>", the trailing fields
-- left out while empty: <token> is the hold's fencing token ('-': none,
-- `fence = false`), <mark> 'q' once someone queued behind it ('w' on
-- Redlock, '-' none), <from> the owner that handed it over (so that a
-- release sent twice knows it ran). An unmarked writer's lock is exactly
-- "<owner> <token>" (or "<owner>" without a token): what its release
-- compares and deletes, natively where the server can. <holder> is the
-- owner id, "~r" while readers share the lock (each reader's lease is its
-- score in the readers), or "<owner>!" after a release with min_hold left
-- (keep.lua; busy to everyone until it lapses).
-- Returns {1, token} taken, {2, token} already this owner's (an earlier
-- send ran, or a release handed it over), {0, pttl, queued at (server ms,
-- 0 = not queued)} busy. Token 0: none.
--
-- Tokens: the next of the lock's slot, raising its counter, never below
-- the clock in microseconds, so that a counter that lost increments
-- (failover, restart without persistence, eviction, expiry) still hands
-- out tokens above every earlier one. They stay strings (Lua writes
-- numbers with 14 digits, a token has 16), compared as strings while both
-- are 16 digits; anything else is compared as digit strings and raised
-- with a carry, exact at any length. A counter that is not an integer, or
-- whose next token would pass i64::MAX (the largest a reply carries), is
-- an error reply, and keeps its value.
-- A write the server refuses (READONLY on a demoted primary, OOM) is
-- answered with the server's own error, its code first, so that the
-- client knows to try again. The fast path runs no more Lua than
-- that: no closure, no number parsed or formatted.
local lock, owner, lease = KEYS[1], ARGV[1], ARGV[2]
local stay, flags = ARGV[3] or '', ARGV[4] or 'f'
local fenced = flags == 'f' or string.find(flags, 'f', 1, true) ~= nil
local reader = string.find(owner, ':r', 1, true) ~= nil
-- A queuing attempt, or one after an earlier send that may have queued:
-- taking the lock, it leaves the queue.
local may_be_queued = stay ~= '' or (flags ~= 'f' and string.find(flags, 'j', 1, true) ~= nil)

-- The fast path, straight through: a writer takes a free lock. The
-- counter is raised before the lock is tried, so that the token is in the
-- value the lock is set with: a busy attempt leaves a gap, which is
-- harmless.
local t, token
if fenced and not reader then
  token = ARGV[6]
  if not token then
    t = redis.call('time')
    local us = t[2]
    if #us < 6 then
      us = string.sub('00000' .. us, -6)
    end
    token = t[1] .. us
  end
  local counter, ttl = KEYS[2], ARGV[5] or '86400000'
  local last = redis.pcall('set', counter, token, 'PX', ttl, 'GET')
  if last and (type(last) ~= 'string' or #last ~= #token or last >= token or not string.find(last, '^%d*$')) then
    -- (The counter at or above the floor, or of another length.)
    if type(last) ~= 'string' then
      return redis.error_reply(tostring(last.err) .. ' (token counter ' .. counter .. ')')
    end
    local n = string.match(last, '^0*(%d+)$')
    if not n then
      redis.call('set', counter, last, 'PX', ttl)
      return redis.error_reply('token counter ' .. counter .. ' is not an integer')
    end
    -- Exact at any length: compared as strings, raised with a carry.
    if #n > #token or (#n == #token and n >= token) then
      local m = '0' .. n
      local i = #m
      while string.byte(m, i) == 57 do
        i = i - 1
      end
      token = string.match(string.sub(m, 1, i - 1) .. string.char(string.byte(m, i) + 1)
        .. string.rep('0', #m - i), '^0*(%d+)$')
      if #token > 19 or (#token == 19 and token > '9223372036854775807') then
        -- (Past i64, the largest token a reply carries: refused.)
        redis.call('set', counter, last, 'PX', ttl)
        return redis.error_reply('token counter ' .. counter .. ' is at the largest token')
      end
      redis.call('set', counter, token, 'PX', ttl)
    end
  end
end
if not reader then
  local value = owner
  if token then
    value = owner .. ' ' .. token
  end
  if redis.call('set', lock, value, 'NX', 'PX', lease) then
    if may_be_queued and redis.call('hdel', KEYS[4] or lock .. ':waiters', owner) == 1 then
      -- Taken directly (the lock had expired) by a queued waiter: it
      -- leaves the queue, and if others still wait, its release serves
      -- them.
      local queue = KEYS[3] or lock .. ':queue'
      redis.call('lrem', queue, 1, owner)
      if redis.call('llen', queue) > 0 then
        redis.call('set', lock, owner .. ' ' .. (token or '-') .. ' q', 'KEEPTTL')
      end
    end
    return {1, token or 0}
  end
end

-- Everything else: busy, a repeat, a reader.
local queue = KEYS[3] or lock .. ':queue'
local waiters = KEYS[4] or lock .. ':waiters'
local readers = KEYS[5] or lock .. ':readers'
-- The next token (as the fast path takes one); nil and an error reply if
-- the counter is not one.
local function next_token()
  local token = ARGV[6]
  if not token then
    t = t or redis.call('time')
    local us = t[2]
    if #us < 6 then
      us = string.sub('00000' .. us, -6)
    end
    token = t[1] .. us
  end
  local counter, ttl = KEYS[2], ARGV[5] or '86400000'
  local last = redis.pcall('set', counter, token, 'PX', ttl, 'GET')
  if last and (type(last) ~= 'string' or #last ~= #token or last >= token or not string.find(last, '^%d*$')) then
    if type(last) ~= 'string' then
      return nil, redis.error_reply(tostring(last.err) .. ' (token counter ' .. counter .. ')')
    end
    local n = string.match(last, '^0*(%d+)$')
    if not n then
      redis.call('set', counter, last, 'PX', ttl)
      return nil, redis.error_reply('token counter ' .. counter .. ' is not an integer')
    end
    -- Exact at any length, as the fast path's.
    if #n > #token or (#n == #token and n >= token) then
      local m = '0' .. n
      local i = #m
      while string.byte(m, i) == 57 do
        i = i - 1
      end
      token = string.match(string.sub(m, 1, i - 1) .. string.char(string.byte(m, i) + 1)
        .. string.rep('0', #m - i), '^0*(%d+)$')
      if #token > 19 or (#token == 19 and token > '9223372036854775807') then
        redis.call('set', counter, last, 'PX', ttl)
        return nil, redis.error_reply('token counter ' .. counter .. ' is at the largest token')
      end
      redis.call('set', counter, token, 'PX', ttl)
    end
  end
  return token
end
local function now_ms()
  if not t then
    t = redis.call('time')
  end
  -- Milliseconds have 13 digits: exact as Lua numbers.
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function leave_queue()
  if may_be_queued and redis.call('hdel', waiters, owner) == 1 then
    redis.call('lrem', queue, 1, owner)
    return true
  end
  return false
end
-- Anything but a string (a semaphore's hash, foreign data) is busy.
local cur = redis.pcall('get', lock)
if reader and cur == false then
  -- The first reader of a read hold: the hold's token is the counter's
  -- next, floored at the clock as a writer's is; the readers that join it
  -- share it, and the next writer's is above it.
  -- (Entries left by readers of a lock that was deleted under them go:
  -- those readers learn at their next renewal.)
  if fenced then
    local err
    token, err = next_token()
    if not token then
      return err
    end
  end
  redis.call('del', readers)
  redis.call('set', lock, '~r ' .. (token or '-'), 'PX', lease)
  redis.call('zadd', readers, now_ms() + tonumber(lease), owner)
  redis.call('pexpire', readers, lease)
  if leave_queue() and redis.call('llen', queue) > 0 then
    redis.call('set', lock, '~r ' .. (token or '-') .. ' q', 'KEEPTTL')
  end
  return {1, token or 0}
end
if type(cur) ~= 'string' then
  -- (Another error, such as a command the user may not run, is the
  -- caller's to see: it is no busy lock.)
  if type(cur) == 'table' and not string.find(cur.err, '^WRONGTYPE') then
    return redis.error_reply(cur.err .. ' (GET ' .. lock .. ')')
  end
  return {0, redis.call('pttl', lock), 0}
end
local holder, held_token, mark, from = string.match(cur, '^(%S+) ?(%S*) ?(%S*) ?(%S*)$')
if not holder then
  return {0, redis.call('pttl', lock), 0}
end
-- A hold's token as the reply carries it: the digits as they are (exact
-- at any length), 0 for none.
local function token_of(s)
  if s and string.find(s, '^%d+$') then
    return s
  end
  return 0
end
-- The lock's value with another holder, mark or from (nil: as it is).
local function value_with(h, tok, m, f)
  local v = h .. ' ' .. (tok ~= '' and tok or '-')
  m, f = m or mark, f or from
  if f ~= '' then
    return v .. ' ' .. (m ~= '' and m or '-') .. ' ' .. f
  elseif m ~= '' and m ~= '-' then
    return v .. ' ' .. m
  end
  return v
end

if holder == owner then
  -- An earlier send of this attempt ran, or a release handed it over.
  redis.call('pexpire', lock, lease)
  return {2, token_of(held_token)}
end

if reader and holder == '~r' then
  -- Readers share the lock unless a Redlock writer's mark holds them back,
  -- or a live writer waits in the queue.
  local ends = redis.call('zscore', readers, owner)
  -- (An entry whose lease ended is no longer a hold, even while other
  -- readers keep the lock.)
  local mine = ends ~= false and tonumber(ends) > now_ms()
  local blocked = false
  if not mine then
    if string.sub(mark, 1, 1) == 'w' then
      local untl = tonumber(string.sub(mark, 2))
      blocked = untl == nil or untl > now_ms()
    elseif mark == 'q' then
      for _, w in ipairs(redis.call('lrange', queue, 0, -1)) do
        if not string.find(w, ':r', 1, true) then
          local entry = redis.call('hget', waiters, w)
          local untl = entry and string.match(entry, '^%d+ (%d+)')
          if untl and tonumber(untl) > now_ms() then
            blocked = true
            break
          end
        end
      end
    end
  end
  if not blocked then
    local hold_token = held_token
    if fenced and (hold_token == '' or hold_token == '-') then
      -- A fenced reader joins a hold that had no token: it gets one now,
      -- and shares it with the readers after it.
      local err
      hold_token, err = next_token()
      if not hold_token then
        return err
      end
      redis.call('set', lock, value_with('~r', hold_token), 'KEEPTTL')
    end
    local l = tonumber(lease)
    redis.call('zadd', readers, now_ms() + l, owner)
    for _, k in ipairs({lock, readers}) do
      if redis.call('pttl', k) < l then
        redis.call('pexpire', k, l)
      end
    end
    if mine then
      return {2, fenced and token_of(hold_token) or 0}
    end
    leave_queue()
    return {1, fenced and token_of(hold_token) or 0}
  end
end

-- Busy.
local pttl = redis.call('pttl', lock)
if stay == '' then
  return {0, pttl, 0}
end
if string.sub(stay, 1, 1) == 'w' then
  if holder ~= '~r' then
    if mark ~= 'w' then
      redis.call('set', lock, value_with(holder, held_token, 'w'), 'KEEPTTL')
    end
  elseif not reader then
    -- Readers stay out behind this writer for a while: it asks again well
    -- within that time, and if it gave up, new readers soon get in again.
    local ms = tonumber(string.sub(stay, 2))
    local m = 'w'
    if ms then
      m = m .. (now_ms() + ms)
    end
    redis.call('set', lock, value_with('~r', held_token, m), 'KEEPTTL')
  end
  -- (A reader waits on the writer's mark; the last reader's release
  -- publishes all the same.)
  return {0, pttl, 0}
end
local ms = tonumber(stay)
local now = now_ms()
-- The waiter's entry: its lease, how long it stays queued, and whether
-- the hand-off hands it a token.
local new = redis.call('hset', waiters, owner, lease .. ' ' .. (now + ms) .. (fenced and ' f' or '')) == 1
-- (An entry whose list place was lost, say to eviction, gets one again.)
if new or not redis.call('lpos', queue, owner) then
  redis.call('rpush', queue, owner)
end
-- The queue lives as long as its longest-staying waiter.
for _, k in ipairs({queue, waiters}) do
  if redis.call('pttl', k) < ms then
    redis.call('pexpire', k, ms)
  end
end
if mark ~= 'q' then
  redis.call('set', lock, value_with(holder, held_token, 'q'), 'KEEPTTL')
end
return {0, pttl, now}

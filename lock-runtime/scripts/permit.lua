-- Take one permit of a semaphore, or join its queue (docs/SEMAPHORES.md).
-- KEYS[1] the semaphore, a hash: owner id -> "<lease end, server ms>
-- <token>"; KEYS[2] the token counter of its hash slot; KEYS[3], KEYS[4]
-- its queue and waiters (declared on a Redis Cluster only; else made from
-- KEYS[1]), the very ones locks use.
-- ARGV[1] owner id "<client id>:s<N>.<n>": N is how many holders this
-- request admits (read after the first ':', as `Mode::of` does; client
-- ids have none)
-- ARGV[2] lease in ms
-- ARGV[3] if busy: '' = just say so; '<ms>' = queue for that long;
--         'w<ms>' = Redlock: do not queue
-- ARGV[4] flags: 'f' hand out a fencing token; 's' tell waiters served
--         on the way by SPUBLISH (a Redis Cluster; else PUBLISH)
-- ARGV[5] how long the counter outlives its last use, in ms
-- ARGV[6] (Redlock) the token floor in microseconds; else the server's clock
-- Trailing arguments at their default are left out (the server pays about
-- 2 000 instructions for each): ARGV[3] '', ARGV[4] 'f', ARGV[5] 86400000
-- (24 h, the default fence_ttl).
-- Returns {1, token} taken, {2, token} already this owner's (an earlier
-- send ran, or a release handed it over), {0, ms until the earliest
-- holder's lease ends, queued at (server ms, 0 = not queued)} busy.
-- Token 0: none.
--
-- Tokens are acquire.lua's: the next of the slot's counter, never below
-- the clock in microseconds (or the Redlock floor), kept as strings and
-- compared as strings while both have 16 digits; anything else is
-- compared as digit strings and raised with a carry (exact at any length),
-- and a counter that is not an integer, or at the largest token
-- (i64::MAX), is an error reply (its value left as it was). The fast path (a free semaphore nobody
-- waits for) runs no more Lua than that and the entry's lease end: no
-- closure, one number parsed and formatted.
local sem, owner, lease = KEYS[1], ARGV[1], ARGV[2]
local flags = ARGV[4] or 'f'
-- N, matched only when at least 1 (as a string: a number is made of it
-- only when it is compared).
local permits = string.match(owner, '^[^:]*:s0*([1-9]%d*)%.')
if not permits then
  return redis.error_reply('not a permit owner id: ' .. owner)
end
local fenced = flags == 'f' or string.find(flags, 'f', 1, true) ~= nil
local queue = KEYS[3] or sem .. ':queue'

-- The fast path, straight through: fewer than this request's N hold (HLEN
-- counts ended entries too: fewer by it is fewer), none of them this
-- owner, and nobody is queued.
local held = redis.pcall('hlen', sem)
-- This owner's entry (nil: not read) and whether anyone is queued (nil:
-- not asked), for the path below.
local cur, queued
if held ~= 0 then
  permits = tonumber(permits)
end
if held == 0 or (type(held) == 'number' and held < permits) then
  if held > 0 then
    cur = redis.call('hget', sem, owner)
  end
  if not cur then
    queued = redis.call('llen', queue) > 0
  end
  if queued == false then
    local t = redis.call('time')
    local us = t[2]
    if #us < 6 then
      us = string.sub('00000' .. us, -6)
    end
    -- The clock in microseconds (16 digits).
    local clock = t[1] .. us
    local token = '-'
    if fenced then
      token = ARGV[6] or clock
      local counter, fence_ttl = KEYS[2], ARGV[5] or '86400000'
      local last = redis.pcall('set', counter, token, 'PX', fence_ttl, 'GET')
      if last and (#last ~= #token or last >= token or not string.find(last, '^%d*$')) then
        -- (The counter at or above the floor, or of another length, or an
        -- error's table, whose length is 0.)
        if type(last) ~= 'string' then
          return redis.error_reply(tostring(last.err) .. ' (token counter ' .. counter .. ')')
        end
        local n = string.match(last, '^0*(%d+)$')
        if not n then
          redis.call('set', counter, last, 'PX', fence_ttl)
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
            redis.call('set', counter, last, 'PX', fence_ttl)
            return redis.error_reply('token counter ' .. counter .. ' is at the largest token')
          end
          redis.call('set', counter, token, 'PX', fence_ttl)
        end
      end
    end
    -- The lease's end in server ms: '%d' truncates the microseconds
    -- (exact below 2^43 ms, any lease under 200 years: the sum's rounding
    -- error stays far from the 0.001 that would reach the next ms).
    redis.call('hset', sem, owner, string.format('%d %s', clock / 1000 + lease, token))
    if held == 0 or redis.call('pttl', sem) < tonumber(lease) then
      redis.call('pexpire', sem, lease)
    end
    if token == '-' then
      return {1, 0}
    end
    return {1, token}
  end
end

-- Everything else: a repeat, a full semaphore, a queue, a lock's key.
permits = tonumber(permits)
local stay, fence_ttl = ARGV[3] or '', ARGV[5] or '86400000'
local waiters = KEYS[4] or sem .. ':waiters'
local t = redis.call('time')
-- Milliseconds (13 digits) and microseconds (16) are exact as Lua numbers.
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local l = tonumber(lease)

-- The next token of the slot, as acquire.lua's: never below the clock in
-- microseconds (or the Redlock floor). Nil and an error reply if the
-- counter is not one.
local function next_token()
  local floor = ARGV[6] and string.match(ARGV[6], '^0*(%d+)$')
  if not floor then
    local us = t[2]
    if #us < 6 then
      us = string.sub('00000' .. us, -6)
    end
    floor = t[1] .. us
  end
  local token = floor
  local last = redis.pcall('set', KEYS[2], floor, 'PX', fence_ttl, 'GET')
  if type(last) == 'table' then
    return nil, redis.error_reply(tostring(last.err) .. ' (token counter ' .. KEYS[2] .. ')')
  end
  if last then
    local n = string.match(last, '^0*(%d+)$')
    if not n then
      redis.call('set', KEYS[2], last, 'PX', fence_ttl)
      return nil, redis.error_reply('token counter ' .. KEYS[2] .. ' is not an integer')
    end
    -- Exact at any length: compared as strings, raised with a carry.
    if #n > #floor or (#n == #floor and n >= floor) then
      local m = '0' .. n
      local i = #m
      while string.byte(m, i) == 57 do
        i = i - 1
      end
      token = string.match(string.sub(m, 1, i - 1) .. string.char(string.byte(m, i) + 1)
        .. string.rep('0', #m - i), '^0*(%d+)$')
      if #token > 19 or (#token == 19 and token > '9223372036854775807') then
        redis.call('set', KEYS[2], last, 'PX', fence_ttl)
        return nil, redis.error_reply('token counter ' .. KEYS[2] .. ' is at the largest token')
      end
      redis.call('set', KEYS[2], token, 'PX', fence_ttl)
    end
  end
  return token
end

-- The semaphore lives at least as long as `ms` from now.
local function stretch(ms)
  if redis.call('pttl', sem) < ms then
    redis.call('pexpire', sem, ms)
  end
end

-- Live holders, after dropping entries whose lease ended; and the time
-- until the earliest live lease ends (nil: none).
local function count()
  local all = redis.call('hgetall', sem)
  local live, earliest = 0, nil
  for i = 1, #all, 2 do
    local ends = tonumber(string.match(all[i + 1], '^(%d+)'))
    if ends and ends > now then
      live = live + 1
      if not earliest or ends < earliest then
        earliest = ends
      end
    else
      redis.call('hdel', sem, all[i])
    end
  end
  return live, earliest and earliest - now
end

-- Hand free permits to the queue's head, in order (see release_permit.lua,
-- which holds the same loop): stops at this owner, at a live head whose
-- own N the live holders fill, at a live lock waiter (one key used both
-- ways: it is served by its own next ask, once the permits are back), or
-- after 256 heads or 32 grants. Returns the live holders then, whether a
-- live waiter stays before this owner (or may), whether it stopped short
-- at the bound (the next call goes on), and the error of a counter that
-- is no integer.
local function serve(live)
  local looked, told, deaf = 0, 0, {}
  while looked < 256 and told < 32 do
    local head = redis.call('lindex', queue, 0)
    if not head or head == owner then
      return live, false, false
    end
    local entry = redis.call('hget', waiters, head)
    local hl, untl, f
    if entry then
      hl, untl, f = string.match(entry, '^(%d+) (%d+) ?(%S*)$')
    end
    local n = tonumber(string.match(head, '^[^:]*:s(%d+)%.'))
    local client = string.match(head, '^[^:]*')
    local waiting = hl and tonumber(untl) > now and not deaf[client]
    if waiting and (not n or live >= n) then
      return live, true, false
    end
    local alive = waiting and n
    -- The token before the head leaves the queue: a counter that is no
    -- integer stops here, and the head keeps its place.
    local token = '-'
    if alive and f == 'f' then
      local err
      token, err = next_token()
      if not token then
        return live, true, true, err
      end
    end
    redis.call('lpop', queue)
    redis.call('hdel', waiters, head)
    looked = looked + 1
    if alive then
      told = told + 1
      -- (The hold is written before the grant is announced.)
      redis.call('hset', sem, head, (now + tonumber(hl)) .. ' ' .. token)
      stretch(tonumber(hl))
      local channel = sem .. ':granted:' .. client
      local message = head .. ' ' .. (token == '-' and '0' or token) .. ' ' .. now
      local heard
      if string.find(flags, 's', 1, true) then
        heard = redis.call('spublish', channel, message) > 0
      else
        heard = redis.call('publish', channel, message) > 0
      end
      if heard then
        live = live + 1
      else
        -- Nobody listens: that waiter's client is gone, and with it
        -- every waiter of that client queued after it.
        deaf[client] = true
        redis.call('hdel', sem, head)
      end
    end
  end
  return live, true, true
end

if type(held) ~= 'number' then
  -- A lock's string (or foreign data): busy, never queued. Another error,
  -- such as a command the user may not run, is the caller's to see.
  if not string.find(held.err, '^WRONGTYPE') then
    return redis.error_reply(held.err .. ' (HLEN ' .. sem .. ')')
  end
  return {0, redis.call('pttl', sem), 0}
end

-- Already this owner's: an earlier send ran, or a release handed it over.
if held > 0 then
  if cur == nil then
    cur = redis.call('hget', sem, owner)
  end
  if cur then
    local ends, tok = string.match(cur, '^(%d+) (%S+)$')
    if ends and tonumber(ends) > now then
      redis.call('hset', sem, owner, (now + l) .. ' ' .. tok)
      stretch(l)
      if redis.call('hdel', waiters, owner) == 1 then
        redis.call('lrem', queue, 1, owner)
      end
      -- (As a string: a token is exact at any length.)
      return {2, string.find(tok, '^%d+$') and tok or 0}
    end
    redis.call('hdel', sem, owner)
    held = held - 1
  end
end

-- Admitted while fewer than this request's N hold and nobody live waits
-- before it. HLEN counts ended entries too: only when it looks full, or
-- someone is queued, is the hash counted (O(N)).
if queued == nil then
  queued = redis.call('llen', queue) > 0
end
local live, ttl = held, nil
if held >= permits or queued then
  live, ttl = count()
end
local blocked, short, err = false, false, nil
if live < permits and queued then
  live, blocked, short, err = serve(live)
  if err then
    return err
  end
end
if live < permits and not blocked then
  local token = '-'
  if fenced then
    local err
    token, err = next_token()
    if not token then
      return err
    end
  end
  redis.call('hset', sem, owner, (now + l) .. ' ' .. token)
  if held == 0 and live == 0 then
    redis.call('pexpire', sem, lease)
  else
    stretch(l)
  end
  if queued and redis.call('hdel', waiters, owner) == 1 then
    redis.call('lrem', queue, 1, owner)
  end
  -- (As a string: a token is exact at any length.)
  if token == '-' then
    return {1, 0}
  end
  return {1, token}
end

-- Busy: the earliest live lease is when a permit may come back unreleased;
-- serving that stopped short goes on at the next ask, at once.
if short then
  ttl = 1
elseif not ttl then
  local _
  _, ttl = count()
end
-- (None live, and still busy: dead waiters are being passed, 256 a call;
-- ask again at once.)
if not ttl or ttl < 1 then
  ttl = 1
end
if stay == '' or string.sub(stay, 1, 1) == 'w' then
  return {0, ttl, 0}
end
local ms = tonumber(stay)
local new = redis.call('hset', waiters, owner, lease .. ' ' .. (now + ms) .. (fenced and ' f' or '')) == 1
if new or not redis.call('lpos', queue, owner) then
  redis.call('rpush', queue, owner)
end
for _, k in ipairs({queue, waiters}) do
  if redis.call('pttl', k) < ms then
    redis.call('pexpire', k, ms)
  end
end
return {0, ttl, now}

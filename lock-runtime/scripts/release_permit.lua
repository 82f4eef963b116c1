-- Give back one permit of a semaphore and hand it to the first live waiter
-- (docs/SEMAPHORES.md); a waiter that gives up (or an undo) leaves the
-- queue by this same call.
-- KEYS[1] the semaphore (a hash, see permit.lua), KEYS[2] the token
-- counter of its slot (left out on one server when the key prefix has no
-- '{', as release.lua's), KEYS[3], KEYS[4] on a Redis Cluster its queue
-- and waiters
-- ARGV[1] owner id
-- ARGV[2] flags: 's' tell waiters by SPUBLISH (a Redis Cluster; else
--         PUBLISH); 'a' also publish on KEYS[1] .. ':released' (Redlock
--         waiters, which do not queue); 'f' a forced release (nothing
--         differs for a permit)
-- ARGV[3] how long the counter outlives its last use, in ms
-- Trailing arguments at their default are left out: ARGV[2] '', ARGV[3]
-- 86400000 (see permit.lua).
-- Returns 1 released, 0 not held (its lease ended, it never held, or an
-- earlier send of this release ran), -1 the key is not a semaphore (a
-- lock's string).
local sem, owner, flags = KEYS[1], ARGV[1], ARGV[2] or ''
local queue = KEYS[3] or sem .. ':queue'

local cur = redis.pcall('hget', sem, owner)
-- (An error's table has `err`; a string's is string.err, nil.)
if cur and cur.err then
  local waiters = KEYS[4] or sem .. ':waiters'
  if redis.call('hdel', waiters, owner) == 1 then
    redis.call('lrem', queue, 1, owner)
  end
  return -1
end
local t
-- An entry whose lease ended is no permit any more (renew_permits.lua
-- says so too, and another call may have counted it out already): it
-- goes, and the release says it was not held.
local gone = 0
if cur then
  redis.call('hdel', sem, owner)
  t = redis.call('time')
  -- (The lease's end in ms is after the clock's ms exactly when a
  -- thousand times it is above the clock's microseconds: 16 digits, exact
  -- as Lua numbers; no number parsed but by arithmetic.)
  local ends = string.match(cur, '^%d+')
  if ends and ends * 1000 > t[1] * 1000000 + t[2] then
    gone = 1
  end
elseif redis.call('hdel', KEYS[4] or sem .. ':waiters', owner) == 1 then
  -- A waiter giving up frees nothing; but at the head it may have held
  -- back waiters behind it that a smaller N of its own kept out (strict
  -- FIFO), and behind the head it may find permits free that nobody was
  -- handed yet (a lease that ran out, a head whose stay passed): the
  -- queue is served below either way, as the in-memory backend does.
  redis.call('lrem', queue, 1, owner)
end
local done = gone

-- The fast path: nobody waits.
if redis.call('llen', queue) == 0 then
  if flags ~= '' and string.find(flags, 'a', 1, true) then
    redis.call('publish', sem .. ':released', '')
  end
  return done
end

local waiters = KEYS[4] or sem .. ':waiters'
t = t or redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fence_ttl = ARGV[3] or '86400000'
local counter = KEYS[2] or string.match(sem, '^[^{]*') .. 'fence'
-- The next token of the slot (see acquire.lua): a waiter handed a permit.
local function next_token()
  local us = t[2]
  if #us < 6 then
    us = string.sub('00000' .. us, -6)
  end
  local token = t[1] .. us
  local last = redis.pcall('set', counter, token, 'PX', fence_ttl, 'GET')
  if type(last) == 'table' then
    -- Refused by the server (a counter of another type, an ACL): no token,
    -- as acquire.lua answers the same.
    return nil
  end
  if not last then
    return token
  end
  local n = string.match(last, '^0*(%d+)$')
  -- Exact at any length: compared as strings, raised with a carry.
  if n and (#n > #token or (#n == #token and n >= token)) then
    local m = '0' .. n
    local i = #m
    while string.byte(m, i) == 57 do
      i = i - 1
    end
    token = string.match(string.sub(m, 1, i - 1) .. string.char(string.byte(m, i) + 1)
      .. string.rep('0', #m - i), '^0*(%d+)$')
    if #token > 19 or (#token == 19 and token > '9223372036854775807') then
      n = nil
    else
      redis.call('set', counter, token, 'PX', fence_ttl)
    end
  end
  if not n then
    -- A counter that is not an integer, or at the largest token (i64::MAX):
    -- refused as permit.lua refuses it, its value left as it was, and no
    -- permit handed on (the waiter's own next ask is told why).
    redis.call('set', counter, last, 'KEEPTTL')
    return nil
  end
  return token
end
local function stretch(ms)
  if redis.call('pttl', sem) < ms then
    redis.call('pexpire', sem, ms)
  end
end
-- Live holders, dropping entries whose lease ended (O(N)).
local live = 0
local all = redis.call('hgetall', sem)
for i = 1, #all, 2 do
  local ends = tonumber(string.match(all[i + 1], '^(%d+)'))
  if ends and ends > now then
    live = live + 1
  else
    redis.call('hdel', sem, all[i])
  end
end
-- Hand free permits to the queue's head, in order (the same function is in
-- permit.lua): a head whose entry is missing or past its stay, or the
-- releasing owner's own left-over entry, is dropped; a live head whose own
-- N admits the live holders gets a permit and is told on its client's
-- channel (nobody heard: its client is gone, and the permit goes back); a
-- live head whose N the holders fill stops it (strict FIFO). At most 256
-- heads and 32 grants a call: the next call goes on, so no release is
-- O(waiters).
local looked, told, deaf = 0, 0, {}
while looked < 256 and told < 32 do
  local head = redis.call('lindex', queue, 0)
  if not head then
    break
  end
  local entry = redis.call('hget', waiters, head)
  local hl, untl, f
  if entry then
    hl, untl, f = string.match(entry, '^(%d+) (%d+) ?(%S*)$')
  end
  local n = tonumber(string.match(head, '^[^:]*:s(%d+)%.'))
  local client = string.match(head, '^[^:]*')
  local waiting = hl and tonumber(untl) > now and head ~= owner and not deaf[client]
  -- (A live lock waiter, one key used both ways, stops it too: its own
  -- next ask takes the key once the permits are back.)
  if waiting and (not n or live >= n) then
    break
  end
  local alive = waiting and n
  local token = '-'
  if alive and f == 'f' then
    token = next_token()
    if not token then
      -- Refused (see next_token): the head stays first.
      break
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
      -- Its client is gone, and with it every waiter of that client
      -- queued after it: those are passed over without a word.
      deaf[client] = true
      redis.call('hdel', sem, head)
    end
  end
end
if string.find(flags, 'a', 1, true) then
  redis.call('publish', sem .. ':released', '')
end
return done

-- End one acquisition: hand the lock to the first live waiter in its
-- queue, or delete it. A waiter that gives up leaves the queue by this
-- same call.
-- KEYS[1] lock, KEYS[2] the token counter of its slot (left out on one
-- server when the key prefix has no '{'), KEYS[3..5] on a Redis Cluster
-- its queue, waiters and readers (see acquire.lua for all, and the lock's
-- value)
-- ARGV[1] owner id, or a writer's hold as its acquire wrote it: "<owner>
--         <token>" ("<owner>" without a token); a lock of exactly that
--         value is deleted at once
-- ARGV[2] flags: 's' tell waiters by SPUBLISH (a Redis Cluster; else
--         PUBLISH); Redlock wake-ups on KEYS[1] .. ':released' (its waiters
--         do not queue): 'r' when this deletes a marked lock, 'a' also when
--         the lock is absent (a waiter may listen on a node where this
--         owner's lock never landed), 'n' never (taking back a partial
--         grant); 'f' a forced release (an operator's, run as the holder):
--         it hands on as any release does, but does not record its owner as
--         <from>, so that the holder's own later release finds the lock
--         lost instead of taking itself for a re-send of this one
--         'o' only the lock is declared (a Redis Cluster's slot on the
--         move, where a call declaring the others is refused): release on
--         the two paths that touch nothing else, else write nothing and
--         answer 2
-- ARGV[3] how long the counter outlives its last use, in ms
-- Trailing arguments at their default are left out: ARGV[2] 'r', ARGV[3]
-- 86400000 (see acquire.lua).
-- A reader (owner id "<client id>:r<n>") leaves the readers; the last one
-- out releases the lock as a writer would. A writer's release hands the
-- lock to a queued writer, or to the queued readers up to the next writer,
-- all at once.
-- Returns 1 released (also: an earlier send of this release handed it
-- over), 2 not done (flag 'o'), 0 absent (expired, deleted, or released by an earlier send of
-- this same release), -1 held by another owner.
local lock, held = KEYS[1], ARGV[1]
local cur = redis.pcall('get', lock)

-- The fast path, straight through: the hold as its acquire wrote it,
-- nobody queued behind it (the rslock release, and a wake-up on Redlock).
if cur == held then
  redis.call('del', lock)
  if ARGV[2] and string.find(ARGV[2], 'a', 1, true) then
    redis.call('publish', lock .. ':released', '')
  end
  return 1
end

local owner = string.match(held, '^%S*')
local flags, ttl = ARGV[2] or 'r', ARGV[3] or '86400000'
local holder, tok, mark, from
-- An unfenced hold nobody queued behind is the owner alone: no parsing.
local mine = cur == owner
if not mine and type(cur) == 'string' then
  holder, tok, mark, from = string.match(cur, '^(%S+) ?(%S*) ?(%S*) ?(%S*)$')
  mine = holder == owner and (mark == '' or mark == '-')
end

-- Nobody waits behind this writer (handed the lock, or forced out).
if mine then
  redis.call('del', lock)
  if string.find(flags, 'a', 1, true) then
    redis.call('publish', lock .. ':released', '')
  end
  return 1
end
if string.find(flags, 'o', 1, true) then
  return 2
end

local queue = KEYS[3] or lock .. ':queue'
local waiters = KEYS[4] or lock .. ':waiters'
local readers = KEYS[5] or lock .. ':readers'
local reader = string.find(owner, ':r', 1, true) ~= nil
local forced = string.find(flags, 'f', 1, true) ~= nil
local function is_reader(o)
  return string.find(o, ':r', 1, true) ~= nil
end
-- Leave the queue, if queued; whether this owner was.
local function withdraw()
  if redis.call('hdel', waiters, owner) == 1 then
    redis.call('lrem', queue, 1, owner)
    return true
  end
  return false
end
local function wake_redlock()
  redis.call('publish', lock .. ':released', '')
end
if not holder then
  if cur == false and string.find(flags, 'a', 1, true) then
    wake_redlock()
  end
  withdraw()
  if cur == false then
    return 0
  end
  return -1
end
-- What a hand-off writes after the new holder and mark: the releasing
-- owner as <from>; nothing for a forced release.
local by = ' ' .. owner
if forced then
  by = ''
end
-- The server's clock, read once and only when needed. Milliseconds (13
-- digits) and microseconds (16, tokens) are exact as Lua numbers.
local t, now_ms
local function clock()
  if not t then
    t = redis.call('time')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
end
-- The next token of the slot (see acquire.lua): a writer handed the lock.
local function next_token()
  clock()
  local us = t[2]
  if #us < 6 then
    us = string.sub('00000' .. us, -6)
  end
  local token = t[1] .. us
  local counter = KEYS[2] or string.match(lock, '^[^{]*') .. 'fence'
  local last = redis.pcall('set', counter, token, 'PX', ttl, 'GET')
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
      redis.call('set', counter, token, 'PX', ttl)
    end
  end
  if not n then
    -- A counter that is not an integer, or at the largest token (i64::MAX):
    -- refused as acquire.lua refuses it, its value left as it was, and no
    -- token handed out (the waiter's own next ask is told why).
    redis.call('set', counter, last, 'KEEPTTL')
    return nil
  end
  return token
end
-- The next live waiter in the queue, popped, with its lease in ms and
-- whether it takes a token.
local function next_waiter(readers_only)
  while true do
    -- (A writer's release pops its head at once; a run of readers looks
    -- first, and stops at the next writer.)
    if readers_only then
      local head = redis.call('lindex', queue, 0)
      if not head or not is_reader(head) then
        return nil
      end
    end
    local head = redis.call('lpop', queue)
    if not head then
      return nil
    end
    local entry = redis.call('hget', waiters, head)
    if entry then
      local lease, untl, fenced = string.match(entry, '^(%d+) (%d+) ?(%S*)$')
      -- (Never back to the releasing owner: an entry it left by an
      -- attempt whose answer was lost.)
      local live = lease and head ~= owner and tonumber(untl) > now_ms
      if live and string.find(head, '^[^:]*:s%d+%.') then
        -- A semaphore's waiter (one key used both ways) is handed no
        -- lock: it stays first, and its own next ask takes a permit.
        redis.call('lpush', queue, head)
        if redis.call('pttl', queue) < 0 then
          redis.call('pexpire', queue, tonumber(untl) - now_ms)
        end
        return nil
      end
      redis.call('hdel', waiters, head)
      if live then
        return head, tonumber(lease), fenced == 'f', entry
      end
    end
  end
end
-- Tell `head` it holds the lock with `token` ('-': none); false if nobody
-- heard.
local function told(head, token)
  local client = string.match(head, '^[^:]*')
  local channel = lock .. ':granted:' .. client
  local given = token == '-' and '0' or token
  local message = head .. ' ' .. given .. ' ' .. now_ms
  -- Nobody subscribed: that waiter's client is gone (or not yet
  -- listening, and then it asks again); serve the next one.
  if string.find(flags, 's', 1, true) then
    return redis.call('spublish', channel, message) > 0
  end
  return redis.call('publish', channel, message) > 0
end
-- Put a popped waiter back at the head of the queue, as it was.
local function requeue(head, entry)
  local left = tonumber(string.match(entry, '^%d+ (%d+)')) - now_ms
  redis.call('lpush', queue, head)
  redis.call('hset', waiters, head, entry)
  for _, k in ipairs({queue, waiters}) do
    if redis.call('pttl', k) < 0 then
      redis.call('pexpire', k, left)
    end
  end
end
local function rest()
  if redis.call('llen', queue) > 0 then
    return 'q'
  end
  return '-'
end
-- Hand the lock on to the first live waiter whose client hears it, and if
-- that is a reader, to every reader queued right behind it as well.
-- `joining`: the lock is read-held already, and only readers at the head
-- of the queue join them. Returns whether anyone was served.
local function serve(joining)
  clock()
  local served = false
  -- Readers handed the lock together share one token: the hold's own if
  -- they join one, else the releasing writer's (no new one is needed: it
  -- is the latest), else a new one. After a forced release, a new one: the
  -- writer forced out may still be running, and its writes must be fenced
  -- out by the readers'.
  local read_token = (tok ~= '' and tok ~= '-' and not forced) and tok or nil
  local token
  while true do
    -- Only readers that heard (or the hold they join) stop the scan at a
    -- writer: one nobody heard, dead or not listening yet, is passed over
    -- as a writer nobody heard is, and the writer behind it is served.
    local head, lease, fenced, entry = next_waiter(joining or served)
    if not head then
      break
    end
    -- A token refused (see next_token): nobody is served, the waiter
    -- stays first.
    if fenced and not (is_reader(head) and read_token) then
      token = next_token()
      if not token then
        requeue(head, entry)
        break
      end
      read_token = read_token or (is_reader(head) and token) or nil
    end
    -- (The hold is written before the grant is announced: a waiter never
    -- hears of a hold that is not there.)
    if not is_reader(head) then
      token = fenced and token or '-'
      redis.call('set', lock, head .. ' ' .. token .. ' ' .. rest() .. by, 'PX', lease)
      if told(head, token) then
        return true
      end
      -- Nobody heard: the next waiter's hold replaces this one, or the
      -- lock goes below.
    else
      if not (joining or served) then
        -- (Again after a reader nobody heard: the hold lives as long as
        -- the readers that did.)
        redis.call('del', readers)
        redis.call('set', lock, '~r', 'PX', lease)
      end
      redis.call('zadd', readers, now_ms + lease, head)
      if told(head, fenced and read_token or '-') then
        for _, k in ipairs({lock, readers}) do
          if redis.call('pttl', k) < lease then
            redis.call('pexpire', k, lease)
          end
        end
        served = true
      else
        redis.call('zrem', readers, head)
      end
    end
  end
  if served then
    local tail = by
    if joining then
      tail = from ~= '' and ' ' .. from or ''
    end
    redis.call('set', lock, '~r ' .. (read_token or '-') .. ' ' .. rest() .. tail, 'KEEPTTL')
  end
  return served
end
-- What this release answers: 0 if this reader's own lease had ended,
-- though others still kept the lock (it releases all the same).
local done = 1
-- What a release with nobody to hand over to deletes.
local gone = {lock}
if reader then
  local ends = holder == '~r' and redis.call('zscore', readers, owner)
  if not ends then
    withdraw()
    if from == owner and not forced then
      -- This release ran before and handed the lock over.
      return 1
    end
    return 0
  end
  if redis.call('zcard', readers) > 1 then
    -- Other readers still in their lease keep the lock for the longest of
    -- them; readers that died are dropped here, their lease over.
    redis.call('zrem', readers, owner)
    clock()
    if tonumber(ends) <= now_ms then
      done = 0
    end
    redis.call('zremrangebyscore', readers, '-inf', now_ms)
    local longest = redis.call('zrange', readers, -1, -1, 'WITHSCORES')[2]
    if longest then
      local left = tonumber(longest) - now_ms
      redis.call('pexpire', lock, left)
      redis.call('pexpire', readers, left)
      return done
    end
  end
  -- The last reader out (the lock lives exactly as long as its longest
  -- reader, so a lone reader's lease has not ended): it releases the lock
  -- as a writer would, and its entry goes with it. (A writer handed the
  -- lock gets a new token; the readers' is not carried on.)
  gone = {lock, readers}
  tok = ''
  if mark == 'q' then
    redis.call('del', readers)
  end
elseif holder ~= owner then
  if from == owner and not forced then
    -- This release ran before and handed the lock over.
    return 1
  end
  -- A queued writer giving up: readers that queued only behind it join
  -- the readers now, not at their next attempt.
  if withdraw() and holder == '~r' and mark == 'q' then
    serve(true)
  end
  return -1
end
if mark == 'q' and serve(false) then
  return done
end
redis.call('del', unpack(gone))
-- Redlock: a waiter listens on one node, which its busy attempt may not
-- have marked (that answer was lost): every release that frees the lock
-- there wakes it.
if (string.sub(mark, 1, 1) == 'w' and not string.find(flags, 'n', 1, true))
  or string.find(flags, 'a', 1, true) then
  wake_redlock()
end
return done

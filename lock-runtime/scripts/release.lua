-- End one acquisition: hand the lock to the first live waiter in its
-- queue, or delete it. A waiter that gives up leaves the queue by this
-- same call.
-- KEYS[1] lock, KEYS[2] fence counter, KEYS[3] queue, KEYS[4] waiters,
-- KEYS[5] readers (see acquire.lua)
-- ARGV[1] owner id
-- ARGV[2] grant channel prefix: a waiter's client hears its grant on
--         ARGV[2] .. "<client id>"
-- ARGV[3] 'publish', or 'spublish' on a Redis Cluster
-- ARGV[4] wake-up channel (Redlock waiters, who do not queue)
-- ARGV[5] Redlock wake-ups: 'r' when this deletes a marked lock, 'a' also
--         when the lock is absent (a waiter may listen on a node where this
--         owner's lock never landed), 'n' never (taking back a partial grant)
-- ARGV[6] '1' for a forced release (an operator's, run as the holder): it
--         hands on as any release does, but does not record ARGV[1] as
--         <from>, so that the holder's own later release finds the lock
--         lost instead of taking itself for a re-send of this one
-- A reader (owner id "<client id>:r<n>") leaves the readers; the last one
-- out releases the lock as a writer would. A writer's release hands the
-- lock to a queued writer, or to the queued readers up to the next writer,
-- all at once.
-- Returns 1 released (also: an earlier send of this release handed it
-- over), 0 absent (expired, deleted, or released by an earlier send of
-- this same release), -1 held by another owner.
local owner = ARGV[1]
local reader = string.find(owner, ':r', 1, true) ~= nil
local function is_reader(o)
  return string.find(o, ':r', 1, true) ~= nil
end
-- Leave the queue, if queued; whether this owner was.
local function withdraw()
  if redis.call('hdel', KEYS[4], owner) == 1 then
    redis.call('lrem', KEYS[3], 1, owner)
    return true
  end
  return false
end
local cur = redis.pcall('get', KEYS[1])
if type(cur) ~= 'string' then
  if cur == false and ARGV[5] == 'a' then
    redis.call('publish', ARGV[4], '')
  end
  withdraw()
  if cur == false then
    return 0
  end
  return -1
end
local holder, mark, from = string.match(cur, '^(%S+) ?(%S*) ?(%S*)$')
-- What a hand-off writes after the new holder and mark: the releasing
-- owner as <from>; nothing for a forced release (ARGV[6]).
local by = ' ' .. owner
if ARGV[6] == '1' then
  by = ''
end
-- The server's clock, read once and only when needed (an uncontended
-- writer's release does not). Milliseconds (13 digits) are exact as Lua
-- numbers; microseconds (16 digits, tokens) stay decimal strings.
local t, now_ms
local function clock()
  if not t then
    t = redis.call('time')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
end
local last, token
-- The next live waiter in the queue, popped, with its lease in ms.
local function next_waiter(readers_only)
  while true do
    -- (A writer's release pops its head at once; a run of readers looks
    -- first, and stops at the next writer.)
    if readers_only then
      local head = redis.call('lindex', KEYS[3], 0)
      if not head or not is_reader(head) then
        return nil
      end
    end
    local head = redis.call('lpop', KEYS[3])
    if not head then
      return nil
    end
    local entry = redis.call('hget', KEYS[4], head)
    if entry then
      redis.call('hdel', KEYS[4], head)
      local lease, untl = string.match(entry, '^(%d+) (%d+)$')
      -- (Never back to the releasing owner: an entry it left by an
      -- attempt whose answer was lost.)
      if lease and head ~= owner and tonumber(untl) > now_ms then
        return head, tonumber(lease)
      end
    end
  end
end
-- Tell `head` it holds the lock; false if nobody heard.
local function told(head)
  local clock_us = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
  if not last then
    last = redis.call('get', KEYS[2]) or ''
  end
  local given
  if is_reader(head) then
    -- Readers get the current token: the releasing writer's, or above it
    -- (a counter that vanished restarts at the clock).
    if last == '' then
      last = clock_us
      redis.call('set', KEYS[2], last)
    end
    given = last
  else
    if not token then
      token = clock_us
      if string.match(last, '^%d+$')
        and (#last > #token or (#last == #token and last >= token)) then
        token = string.format('%.0f', tonumber(last) + 1)
      end
    end
    given = token
  end
  local client = string.match(head, '^[^:]*')
  -- Nobody subscribed: that waiter's client is gone (or not yet
  -- listening, and then it asks again); serve the next one.
  return redis.call(ARGV[3], ARGV[2] .. client, head .. ' ' .. given .. ' ' .. now_ms) > 0
end
local function rest()
  if redis.call('llen', KEYS[3]) > 0 then
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
  local readers = joining
  local served = false
  while true do
    local head, lease = next_waiter(readers)
    if not head then
      break
    end
    if told(head) then
      if not is_reader(head) then
        redis.call('set', KEYS[1], head .. ' ' .. rest() .. by, 'PX', lease)
        redis.call('set', KEYS[2], token)
        return true
      end
      if not readers then
        readers = true
        redis.call('del', KEYS[5])
        redis.call('set', KEYS[1], '~r', 'PX', lease)
      end
      redis.call('zadd', KEYS[5], now_ms + lease, head)
      for _, k in ipairs({KEYS[1], KEYS[5]}) do
        if redis.call('pttl', k) < lease then
          redis.call('pexpire', k, lease)
        end
      end
      served = true
    end
  end
  if served then
    local tail = by
    if joining then
      tail = from ~= '' and ' ' .. from or ''
    end
    redis.call('set', KEYS[1], '~r ' .. rest() .. tail, 'KEEPTTL')
  end
  return served
end
-- What this release answers: 0 if this reader's own lease had ended,
-- though others still kept the lock (it releases all the same).
local done = 1
-- What a release with nobody to hand over to deletes.
local gone = {KEYS[1]}
if reader then
  local ends = holder == '~r' and redis.call('zscore', KEYS[5], owner)
  if not ends then
    withdraw()
    if from == owner and ARGV[6] ~= '1' then
      -- This release ran before and handed the lock over.
      return 1
    end
    return 0
  end
  if redis.call('zcard', KEYS[5]) > 1 then
    -- Other readers still in their lease keep the lock for the longest of
    -- them; readers that died are dropped here, their lease over.
    redis.call('zrem', KEYS[5], owner)
    clock()
    if tonumber(ends) <= now_ms then
      done = 0
    end
    redis.call('zremrangebyscore', KEYS[5], '-inf', now_ms)
    local longest = redis.call('zrange', KEYS[5], -1, -1, 'WITHSCORES')[2]
    if longest then
      local left = tonumber(longest) - now_ms
      redis.call('pexpire', KEYS[1], left)
      redis.call('pexpire', KEYS[5], left)
      return done
    end
  end
  -- The last reader out (the lock lives exactly as long as its longest
  -- reader, so a lone reader's lease has not ended): it releases the lock
  -- as a writer would, and its entry goes with it.
  gone = {KEYS[1], KEYS[5]}
  if mark == 'q' then
    redis.call('del', KEYS[5])
  end
elseif holder ~= owner then
  if from == owner and ARGV[6] ~= '1' then
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
if (string.sub(mark, 1, 1) == 'w' and ARGV[5] ~= 'n') or ARGV[5] == 'a' then
  redis.call('publish', ARGV[4], '')
end
return done

-- Take a lock for one acquisition, or join its queue of waiters.
-- KEYS[1] lock, KEYS[2] fence counter, KEYS[3] queue (owner ids, FIFO),
-- KEYS[4] waiters (owner id -> "<lease ms> <queued until, server ms>"),
-- KEYS[5] readers (a sorted set: reader owner ids by their lease's end,
-- server ms)
-- ARGV[1] owner id ("<client id>:<n>", unique per acquisition)
-- ARGV[2] lease in ms
-- ARGV[3] the token floor in microseconds; '' = this server's clock
-- ARGV[4] if busy: '' = just say so; 'w<ms>' = mark the lock so that its
--         release publishes a wake-up (Redlock; a writer's mark on a
--         read-held lock, which holds back new readers, lapses after <ms>
--         unless the writer asks again); else how many ms to stay queued,
--         after which a release skips this waiter
-- ARGV[5] '1' if an earlier send of this owner may have queued it (a
--         queuing attempt is checked whatever this says: a transport may
--         send it twice unawares)
-- The lock holds "<owner>", or "<owner> <mark>" with mark 'q' once someone
-- queued behind it ('w' on Redlock), or "<owner> <mark> <from>" after a
-- hand-off from the owner <from> ('-': no mark), so that a release knows
-- whom to serve without reading anything else.
-- A hold released with min_hold left is renamed "<owner>!" (keep.lua) and
-- lapses there; it is busy to everyone, its owner included.
-- A reader's owner id is "<client id>:r<n>". Readers share the lock, which
-- then holds "~r" (plus mark and from as above) and lives as long as its
-- longest reader; each reader's own lease is its entry in KEYS[5]. Once a
-- writer queues, new readers queue behind it.
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
-- The server's clock, read once per call and only when needed.
local t
local function time()
  if not t then
    t = redis.call('time')
  end
  return t
end
local function clock_us()
  local t = time()
  return t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
end
local reader = string.find(owner, ':r', 1, true) ~= nil
local function now_ms()
  local t = time()
  -- Milliseconds have 13 digits: exact as Lua numbers and in concatenation.
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Whether an earlier send of this attempt may have queued this owner: the
-- client says so, or this attempt queues if busy (then the same attempt
-- may have been sent before, by a transport that repeats commands).
local may_be_queued = ARGV[5] == '1' or ARGV[4] ~= ''
-- A grant taken directly by a waiter that an earlier send may have queued:
-- it leaves the queue, and if others still wait, this lock's release
-- serves them.
local function left_queue(value)
  if may_be_queued and redis.call('hdel', KEYS[4], owner) == 1 then
    redis.call('lrem', KEYS[3], 1, owner)
    if redis.call('llen', KEYS[3]) > 0 then
      redis.call('set', KEYS[1], value .. ' q', 'KEEPTTL')
    end
  end
end
-- A reader takes no token of its own: it gets the current one, which every
-- reader of one read hold shares. The first reader of a hold (`fresh`)
-- floors it at the clock as a writer's token is (a counter that lost
-- increments, say to a failover, must not hand a reader a token below an
-- earlier writer's); a raised floor is written, so that the readers after
-- it share it and the next writer's token is above it.
local function current_token(fresh)
  local token = redis.call('get', KEYS[2])
  if token and not string.match(token, '^%d+$') then
    return nil
  end
  local floor = ARGV[3]
  if floor == '' then
    floor = clock_us()
  end
  if not token or (fresh and above(floor, token)) then
    token = floor
    redis.call('set', KEYS[2], token)
  end
  return token
end
-- Join the readers: this reader's lease, and the lock and its readers kept
-- at least that long.
local function add_reader()
  local lease = tonumber(ARGV[2])
  redis.call('zadd', KEYS[5], now_ms() + lease, owner)
  for _, k in ipairs({KEYS[1], KEYS[5]}) do
    if redis.call('pttl', k) < lease then
      redis.call('pexpire', k, lease)
    end
  end
end
-- Whether a Redlock writer's mark on a read-held lock still holds back
-- new readers ('w' without a time: always, until the lock goes).
local function writer_marked(mark)
  if string.sub(mark, 1, 1) ~= 'w' then
    return false
  end
  local untl = tonumber(string.sub(mark, 2))
  return untl == nil or untl > now_ms()
end
-- Whether a live writer waits in the queue (readers then queue behind it).
local function writer_waits()
  local now = now_ms()
  for _, w in ipairs(redis.call('lrange', KEYS[3], 0, -1)) do
    if not string.find(w, ':r', 1, true) then
      local entry = redis.call('hget', KEYS[4], w)
      local untl = entry and string.match(entry, ' (%d+)$')
      if untl and tonumber(untl) > now then
        return true
      end
    end
  end
  return false
end
local function not_a_counter()
  return redis.error_reply('fence counter ' .. KEYS[2] .. ' is not an integer')
end
if reader then
  local cur = redis.pcall('get', KEYS[1])
  if cur == false then
    local token = current_token(true)
    if not token then
      return not_a_counter()
    end
    -- (Entries left by readers of a lock that was deleted under them go:
    -- those readers learn at their next renewal.)
    redis.call('del', KEYS[5])
    redis.call('set', KEYS[1], '~r', 'PX', ARGV[2])
    redis.call('zadd', KEYS[5], now_ms() + tonumber(ARGV[2]), owner)
    redis.call('pexpire', KEYS[5], ARGV[2])
    left_queue('~r')
    return {1, token}
  end
  if type(cur) == 'string' and (cur == '~r' or string.sub(cur, 1, 3) == '~r ') then
    local mark = string.match(cur, '^~r (%S*)') or ''
    -- (An entry whose lease ended is no longer a hold, even while other
    -- readers keep the lock.)
    local ends = redis.call('zscore', KEYS[5], owner)
    local mine = ends ~= false and tonumber(ends) > now_ms()
    if mine or (not writer_marked(mark) and (mark ~= 'q' or not writer_waits())) then
      local token = current_token(false)
      if not token then
        return not_a_counter()
      end
      add_reader()
      if mine then
        return {2, token}
      end
      if may_be_queued and redis.call('hdel', KEYS[4], owner) == 1 then
        redis.call('lrem', KEYS[3], 1, owner)
      end
      return {1, token}
    end
  end
  -- Written, or a writer waits: busy, below.
end
if not reader and redis.call('set', KEYS[1], owner, 'NX', 'PX', ARGV[2]) then
  -- Tokens never fall below the clock in microseconds, so a counter that
  -- lost increments (failover to a lagging replica, restart without
  -- persistence, eviction) still hands out tokens above every earlier one.
  local token = ARGV[3]
  if token == '' then
    token = clock_us()
  end
  local last = redis.pcall('set', KEYS[2], token, 'GET')
  if type(last) == 'table' and last.err then
    redis.call('del', KEYS[1])
    return redis.error_reply('fence counter ' .. KEYS[2] .. ' is not a string: ' .. last.err)
  end
  if last and not string.match(last, '^%d+$') then
    redis.call('set', KEYS[2], last)
    redis.call('del', KEYS[1])
    return redis.error_reply('fence counter ' .. KEYS[2] .. ' is not an integer')
  end
  if last and not above(token, last) then
    token = string.format('%.0f', tonumber(last) + 1)
    redis.call('set', KEYS[2], token)
  end
  -- Taken directly (the lock had expired) by a queued waiter.
  left_queue(owner)
  return {1, token}
end
-- Anything but a string (a lock of another layout, foreign data) is busy.
local cur = redis.pcall('get', KEYS[1])
if type(cur) ~= 'string' then
  return {0, redis.call('pttl', KEYS[1]), 0}
end
local holder, mark, from = string.match(cur, '^(%S+) ?(%S*) ?(%S*)$')
if holder == owner then
  redis.call('pexpire', KEYS[1], ARGV[2])
  local token = redis.call('get', KEYS[2])
  if not token then
    -- The counter vanished under a held lock (eviction): restart it at
    -- the clock rather than leave the holder without a token.
    token = clock_us()
    redis.call('set', KEYS[2], token)
  end
  return {2, token}
end
local pttl = redis.call('pttl', KEYS[1])
if ARGV[4] == '' then
  return {0, pttl, 0}
end
local function marked(m)
  if mark ~= m then
    local tail = ''
    if from ~= '' then
      tail = ' ' .. from
    end
    redis.call('set', KEYS[1], holder .. ' ' .. m .. tail, 'KEEPTTL')
  end
end
if string.sub(ARGV[4], 1, 1) == 'w' then
  if holder ~= '~r' then
    marked('w')
  elseif not reader then
    -- Readers queue behind this writer for a while: it asks again well
    -- within that time, and if it gave up, new readers soon get in again.
    local stay = tonumber(string.sub(ARGV[4], 2))
    local mark = 'w'
    if stay then
      mark = mark .. (now_ms() + stay)
    end
    redis.call('set', KEYS[1], '~r ' .. mark, 'KEEPTTL')
  end
  -- (A reader waits on the writer's mark; the last reader's release
  -- publishes all the same.)
  return {0, pttl, 0}
end
local stay = tonumber(ARGV[4])
local now = now_ms()
local new = redis.call('hset', KEYS[4], owner, ARGV[2] .. ' ' .. (now + stay)) == 1
-- (An entry whose list place was lost, say to eviction, gets one again.)
if new or not redis.call('lpos', KEYS[3], owner) then
  redis.call('rpush', KEYS[3], owner)
end
-- The queue lives as long as its longest-staying waiter.
for i = 3, 4 do
  if redis.call('pttl', KEYS[i]) < stay then
    redis.call('pexpire', KEYS[i], stay)
  end
end
marked('q')
return {0, pttl, now}

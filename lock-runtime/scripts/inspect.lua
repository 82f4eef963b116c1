-- Read one lock's state for an operator, in one consistent view; writes
-- nothing.
-- KEYS as release.lua: [1] lock, [2] fence counter, [3] queue, [4] waiters,
-- [5] readers
-- Returns {what, pttl, last token or '', live waiters, {holder ids}}:
-- what is 'held' (the lock is a string of ours, held by the writer or by
-- the readers whose own lease has not ended), 'free' (no lock key), or the
-- Redis type of a key that is not a lock of ours.
local kind = redis.call('type', KEYS[1])['ok']
local now
local function clock()
  if not now then
    local t = redis.call('time')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
-- Waiters still within their deadline (an entry past it is skipped by the
-- next release; its waiter gave up or died).
-- (pcall: side keys of another type, foreign data, read as empty.)
local waiting = 0
local entries = redis.pcall('hgetall', KEYS[4])
if entries.err then
  entries = {}
end
for i = 2, #entries, 2 do
  local untl = string.match(entries[i], ' (%d+)$')
  if untl and tonumber(untl) > clock() then
    waiting = waiting + 1
  end
end
local fence = redis.pcall('get', KEYS[2])
if type(fence) ~= 'string' then
  fence = ''
end
if kind == 'none' then
  return {'free', -2, fence, waiting, {}}
end
if kind ~= 'string' then
  return {kind, redis.call('pttl', KEYS[1]), fence, waiting, {}}
end
local holders = {}
local holder = string.match(redis.call('get', KEYS[1]), '^(%S+)')
if holder == '~r' then
  holders = redis.pcall('zrangebyscore', KEYS[5], '(' .. clock(), '+inf')
  if holders.err then
    holders = {}
  end
elseif holder then
  holders = {holder}
end
return {'held', redis.call('pttl', KEYS[1]), fence, waiting, holders}

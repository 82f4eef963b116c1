-- Read one lock's state for an operator, in one consistent view; writes
-- nothing.
-- KEYS[1] lock; its queue, waiters and readers are KEYS[1] .. ':queue',
-- ':waiters', ':readers' (see acquire.lua)
-- Returns {what, pttl, the hold's token or '', live waiters, {holder ids}}:
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
local entries = redis.pcall('hgetall', KEYS[1] .. ':waiters')
if entries.err then
  entries = {}
end
for i = 2, #entries, 2 do
  local untl = string.match(entries[i], '^%d+ (%d+)')
  if untl and tonumber(untl) > clock() then
    waiting = waiting + 1
  end
end
if kind == 'none' then
  return {'free', -2, '', waiting, {}}
end
if kind ~= 'string' then
  return {kind, redis.call('pttl', KEYS[1]), '', waiting, {}}
end
local holders = {}
local holder, fence = string.match(redis.call('get', KEYS[1]), '^(%S+) ?(%S*)')
if holder == '~r' then
  holders = redis.pcall('zrangebyscore', KEYS[1] .. ':readers', '(' .. clock(), '+inf')
  if holders.err then
    holders = {}
  end
elseif holder then
  holders = {holder}
end
return {'held', redis.call('pttl', KEYS[1]), fence, waiting, holders}

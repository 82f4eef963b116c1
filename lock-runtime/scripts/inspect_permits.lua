-- Read one semaphore for an operator, in one consistent view; writes
-- nothing. KEYS[1] the semaphore (a hash, see permit.lua), KEYS[2] its
-- waiters (declared, so that a Cluster slot on the move refuses the whole
-- call; KEYS[1] .. ':waiters' if left out).
-- Returns {what, ms until the longest live lease ends, the highest live
-- token or '', live waiters, {live holder ids}}: what is 'held' (a hash),
-- 'free' (no key) or the Redis type of a key that is not a semaphore.
local kind = redis.call('type', KEYS[1])['ok']
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local waiting = 0
local entries = redis.pcall('hgetall', KEYS[2] or KEYS[1] .. ':waiters')
if entries.err then
  entries = {}
end
for i = 2, #entries, 2 do
  local untl = string.match(entries[i], '^%d+ (%d+)')
  if untl and tonumber(untl) > now then
    waiting = waiting + 1
  end
end
if kind == 'none' then
  return {'free', -2, '', waiting, {}}
end
if kind ~= 'hash' then
  return {kind, redis.call('pttl', KEYS[1]), '', waiting, {}}
end
local holders, longest, fence = {}, 0, nil
local all = redis.call('hgetall', KEYS[1])
for i = 1, #all, 2 do
  local ends, tok = string.match(all[i + 1], '^(%d+) (%S+)$')
  ends = tonumber(ends)
  if ends and ends > now then
    holders[#holders + 1] = all[i]
    longest = math.max(longest, ends - now)
    -- (Compared as digit strings: exact at any length.)
    local n = string.match(tok, '^0*(%d+)$')
    if n and (not fence or #n > #fence or (#n == #fence and n > fence)) then
      fence = n
    end
  end
end
return {'held', longest, fence or '', waiting, holders}

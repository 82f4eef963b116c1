-- End one acquisition: hand the lock to the first live waiter in its
-- queue, or delete it. A waiter that gives up leaves the queue by this
-- same call.
-- KEYS[1] lock, KEYS[2] fence counter, KEYS[3] queue, KEYS[4] waiters
-- ARGV[1] owner id
-- ARGV[2] grant channel prefix: a waiter's client hears its grant on
--         ARGV[2] .. "<client id>"
-- ARGV[3] 'publish', or 'spublish' on a Redis Cluster
-- ARGV[4] wake-up channel (Redlock waiters, who do not queue)
-- ARGV[5] Redlock wake-ups: 'r' when this deletes a marked lock, 'a' also
--         when the lock is absent (a waiter may listen on a node where this
--         owner's lock never landed), 'n' never (taking back a partial grant)
-- Returns 1 released (also: an earlier send of this release handed it
-- over), 0 absent (expired, deleted, or released by an earlier send of
-- this same release), -1 held by another owner.
local owner = ARGV[1]
local cur = redis.pcall('get', KEYS[1])
if type(cur) ~= 'string' then
  if cur == false and ARGV[5] == 'a' then
    redis.call('publish', ARGV[4], '')
  end
  if redis.call('hdel', KEYS[4], owner) == 1 then
    redis.call('lrem', KEYS[3], 1, owner)
  end
  if cur == false then
    return 0
  end
  return -1
end
local holder, mark, from = string.match(cur, '^(%S+) ?(%S*) ?(%S*)$')
if holder ~= owner then
  if from == owner then
    -- This release ran before and handed the lock over.
    return 1
  end
  if redis.call('hdel', KEYS[4], owner) == 1 then
    redis.call('lrem', KEYS[3], 1, owner)
  end
  return -1
end
if mark == 'q' then
  local t = redis.call('time')
  -- Milliseconds (13 digits) are exact as Lua numbers; microseconds
  -- (16 digits, tokens) stay decimal strings.
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local token
  while true do
    local head = redis.call('lpop', KEYS[3])
    if not head then
      break
    end
    local entry = redis.call('hget', KEYS[4], head)
    if entry then
      redis.call('hdel', KEYS[4], head)
      local lease, untl = string.match(entry, '^(%d+) (%d+)$')
      -- (Never back to the releasing owner: an entry it left by an attempt
      -- whose answer was lost.)
      if lease and head ~= owner and tonumber(untl) > now_ms then
        if not token then
          token = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
          local last = redis.call('get', KEYS[2])
          if last and string.match(last, '^%d+$')
            and (#last > #token or (#last == #token and last >= token)) then
            token = string.format('%.0f', tonumber(last) + 1)
          end
        end
        local client = string.match(head, '^[^:]*')
        -- Nobody subscribed: that waiter's client is gone (or not yet
        -- listening, and then it asks again); serve the next one.
        local heard = redis.call(ARGV[3], ARGV[2] .. client, head .. ' ' .. token .. ' ' .. now_ms)
        if heard > 0 then
          local m = '-'
          if redis.call('llen', KEYS[3]) > 0 then
            m = 'q'
          end
          redis.call('set', KEYS[1], head .. ' ' .. m .. ' ' .. owner, 'PX', lease)
          redis.call('set', KEYS[2], token)
          return 1
        end
      end
    end
  end
end
redis.call('del', KEYS[1])
if mark == 'w' and ARGV[5] ~= 'n' then
  redis.call('publish', ARGV[4], '')
end
return 1

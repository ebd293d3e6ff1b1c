-- release.lua: give back slots in flight (see admin.go) and learn how long
-- a slot is held: the moving average (R) predicts when waiters get one.
local key, slots_key = KEYS[1], KEYS[2]
local now = now_us()
local n = 0
local raw = redis.call('HGET', key, 'R')
local avg = slot_avg(raw, 0)
local count = raw and tonumber(string.match(raw, ' (%d+)$')) or 0
for i = 1, #ARGV do
  local member = ARGV[i]
  if redis.call('ZREM', slots_key, member) == 1 then
    n = n + 1
    local st = slot_start(member)
    if st and now >= st then
      local dur = now - st
      count = math.min(count + 1, 20)
      avg = avg + (dur - avg) / count
    end
  end
end
-- Learned only while the key's hash lives (its limits and state): a hash
-- that expired meanwhile is not brought back holding R alone, with no TTL.
if n > 0 and redis.call('EXISTS', key) == 1 then
  redis.call('HSET', key, 'R', string.format('%d %d', math.ceil(avg), count))
  -- Waiters' lanes were predicted before this release: predict again.
  redis.call('HDEL', key, 'FL')
end
return n

-- extend.lua: renew the leases of slots still held (see admin.go): each
-- ends lease microseconds from now. A slot whose lease already ended was
-- taken back (its holder went quiet for too long) and is not renewed.
local slots_key = KEYS[1]
local lease = tonumber(ARGV[1])
local now = now_us()
local n = 0
for i = 2, #ARGV do
  local ends = finite(redis.call('ZSCORE', slots_key, ARGV[i]))
  -- (A lease that ended is over, swept by a decision or not; one that ends
  -- this very microsecond still counts, as decide counts it.)
  if ends and ends >= now then
    n = n + redis.call('ZADD', slots_key, 'XX', 'GT', 'CH', now + lease, ARGV[i])
  end
end
-- (the set lives as long as its longest lease: never shorter than another
-- process's, whose live holders renew theirs)
extend_to(slots_key, lease)
return n

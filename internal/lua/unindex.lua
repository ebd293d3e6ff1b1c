-- unindex.lua: drop members from the index of a limiter's keys (see
-- admin.go), each only if it was last recorded before the cutoff, so that
-- a member a process records meanwhile stays.
local index, cutoff = KEYS[1], tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do
  local s = tonumber(redis.call('ZSCORE', index, ARGV[i]))
  if s and s < cutoff then
    redis.call('ZREM', index, ARGV[i])
    n = n + 1
  end
end
return n

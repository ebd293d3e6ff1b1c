-- suspend.lua: suspend a key fleet-wide, extending and never shortening an
-- existing suspension (see admin.go for the contract).
local key = KEYS[1]
local d, max = tonumber(ARGV[1]), tonumber(ARGV[2])
if d > max then d = max end
local now = now_us()
local until_ = now + d
local cur = finite(redis.call('HGET', key, 's'))
-- A stored end beyond any honest wait is garbage, not a suspension to keep.
if cur and cur > until_ and cur - now <= MAX_WAIT then until_ = cur end
redis.call('HSET', key, 's', string.format('%d', until_))
-- The key lives at least until the suspension ends (never shorter than it did).
local pttl = redis.call('PTTL', key)
if pttl < 0 or pttl * 1000 < until_ - now then expire_in(key, until_ - now) end
return string.format('%d', until_ - now)

-- suspend.lua: suspend a key fleet-wide, extending and never shortening an
-- existing suspension (see lua.go for the contract).
local suspend_key = KEYS[1]
local d, max = tonumber(ARGV[1]), tonumber(ARGV[2])
if d > max then d = max end
local now = now_us()
local until_ = now + d
local cur = finite(redis.call('GET', suspend_key))
if cur and cur > until_ then until_ = cur end
redis.call('SET', suspend_key, fmt(until_))
expire_in(suspend_key, until_ - now)
return fmt(until_ - now)

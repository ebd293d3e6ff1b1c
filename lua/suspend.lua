-- suspend.lua: suspend a key fleet-wide, extending and never shortening an
-- existing suspension (see admin.go for the contract).
local key = KEYS[1]
local d, max = tonumber(ARGV[1]), tonumber(ARGV[2])
if d > max then d = max end
local now = now_us()
local h = redis.call('HMGET', key, 's', 'x')
local until_ = now + d
local cur = finite(h[1])
-- A stored end beyond any honest wait is garbage, not a suspension to keep.
if cur and cur > until_ and cur - now <= MAX_WAIT then until_ = cur end
local fields = {'s', string.format('%d', until_)}
local ttl = keep_alive(until_ - now, false, 0, h[2], now, fields)
redis.call('HSET', key, unpack(fields))
if ttl then expire_in(key, ttl) end
return string.format('%d', until_ - now)

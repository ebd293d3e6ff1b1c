-- inspect.lua: read a key's state without changing it (see admin.go).
local key, resv_key = KEYS[1], KEYS[2]
local defaults = ARGV[1]
local now = now_us()
local h = redis.call('HMGET', key, 'L', 's', 'T', 'q', 'g')
local until_ = finite(h[2]) or 0
local suspended = 0
if until_ > now then suspended = math.min(until_ - now, MAX_WAIT) end
local reservations = redis.call('ZCARD', resv_key)
local src = h[1]
if not src and defaults ~= '' then src = defaults end
if not src then return {-2, fmt(suspended), reservations} end
local tiers, field, why = parse_limits(src)
if not tiers then
  if not h[1] then field = 'default ' .. field end
  return {-1, field, why}
end
local from_redis = 0
if h[1] then from_redis = 1 end
local owed = bucket_owed(h[3], tiers, now)
local queued = (finite(h[4]) or 0) - now
if queued < 0 or queued > MAX_WAIT then queued = 0 end
local out = {1, fmt(suspended), reservations, fmt(queued), from_redis, #tiers}
for i, t in ipairs(tiers) do
  out[#out + 1] = fmt(t.rate)
  out[#out + 1] = fmt(t.per)
  out[#out + 1] = fmt(t.burst)
  out[#out + 1] = fmt(tokens_at(t, owed[i]))
end
return out

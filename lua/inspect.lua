-- inspect.lua: read a key's state without changing it (see lua.go).
local cfg_key, state_key, suspend_key, resv_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = now_us()
local until_ = tonumber(redis.call('GET', suspend_key)) or 0
local suspended = 0
if until_ > now then suspended = until_ - now end
local reservations = redis.call('ZCARD', resv_key)
local tiers, field, why = load_tiers(cfg_key, ARGV, 1)
if not tiers then
  if field then return {-1, field, why} end
  return {-2, fmt(suspended), reservations}
end
local state = read_state(state_key)
local tokens = refill(state, tiers, now)
local out = {1, fmt(suspended), reservations, fmt(math.max(0, (tonumber(state.vnext) or 0) - now))}
for i = 1, #tiers do out[#out + 1] = fmt(tokens[i]) end
return out

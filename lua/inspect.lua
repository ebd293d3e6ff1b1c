-- inspect.lua: read a key's state without changing it (see lua.go).
local cfg_key, state_key, suspend_key, resv_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = now_us()
local until_ = finite(redis.call('GET', suspend_key)) or 0
local suspended = 0
if until_ > now then suspended = math.min(until_ - now, MAX_WAIT) end
local reservations = redis.call('ZCARD', resv_key)
local tiers, field, why = load_tiers(cfg_key, ARGV, 1)
if not tiers then
  if field then return {-1, field, why} end
  return {-2, fmt(suspended), reservations}
end
local from_redis = redis.call('EXISTS', cfg_key)
local state = read_state(state_key)
local tokens = refill(state, tiers, now)
local queued = (stored_time(state.vnext, now + 1e12) or 0) - now
if queued < 0 then queued = 0 end
local out = {1, fmt(suspended), reservations, fmt(queued), from_redis, #tiers}
for i, t in ipairs(tiers) do
  out[#out + 1] = fmt(t.rate)
  out[#out + 1] = fmt(t.per / 1000)
  out[#out + 1] = fmt(t.burst)
  out[#out + 1] = fmt(tokens[i])
end
return out

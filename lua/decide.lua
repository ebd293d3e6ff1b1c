-- decide.lua: one atomic throttling decision (see lua.go for the contract).
local cfg_key, state_key, suspend_key, resv_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id          = ARGV[1]
local granule     = tonumber(ARGV[2])   -- us; 0 = the caller can come back at any instant
local horizon     = tonumber(ARGV[3])   -- us; 0 = never reserve
local lapse       = tonumber(ARGV[4])   -- us a reservation is kept after its slot
local idle_ms     = tonumber(ARGV[5])   -- inactivity expiry of the config
local DEFAULTS_AT = 6                   -- ARGV[6] = default tier count, then triples

local now = now_us()
local ALLOWED, DENIED, BAD_CONFIG, NO_LIMITS = 1, 0, -1, -2

local function reply(status, retry, remaining, by, slot)
  if remaining < 0 then remaining = 0 end
  if retry > MAX_WAIT then retry = MAX_WAIT end
  return {status, fmt(math.ceil(retry)), fmt(math.floor(remaining)), by, fmt(slot)}
end

-- 1. Suspension comes first: nothing else is read while a key is suspended
-- unless the task can be given a slot after the suspension ends.
local until_ = finite(redis.call('GET', suspend_key))
local suspended = until_ ~= nil and until_ > now

-- 2. Config, validated; the decision never crashes on a bad one.
local tiers, field, why = load_tiers(cfg_key, ARGV, DEFAULTS_AT)
if not tiers then
  if field then return {BAD_CONFIG, field, why} end
  if suspended then return reply(DENIED, until_ - now, 0, 'suspended', 0) end
  return {NO_LIMITS}
end
if idle_ms > 0 then expire_in(cfg_key, idle_ms * 1000) end

-- Reservations that lapsed (their task never came back) are dropped.
local slot = nil
if horizon > 0 then
  redis.call('ZREMRANGEBYSCORE', resv_key, '-inf', '(' .. fmt(now - lapse))
  if id ~= '' then slot = finite(redis.call('ZSCORE', resv_key, id)) end
end

local state = read_state(state_key)
local vnext = stored_time(state.vnext, now + horizon) or 0

-- keep_state refreshes the state's expiry: never shorter than the time the
-- bucket still needs to refill, or than the reservation queue.
local function keep_state(tokens)
  local ttl = full_after(state, tiers, tokens, now)
  if vnext - now > ttl then ttl = vnext - now end
  expire_in(state_key, ttl + 1e6)
end

-- 3. Refill every tier on demand.
local tokens = refill(state, tiers, now)

-- A task holding a reservation that is not due yet waits for it.
if slot and not suspended and now < slot then
  return reply(DENIED, slot - now, 0, 'reserved', slot)
end

-- 4. Take from all tiers or none. A task without a due reservation may not
-- take tokens that the queue of reservations has been promised.
local short_tier, wait = 0, 0
for i, t in ipairs(tiers) do
  local w = wait_for(tokens[i], t)
  if w > wait then short_tier, wait = i, w end
end
local queued = (slot == nil) and vnext > now
if not suspended and short_tier == 0 and not queued then
  local remaining = math.huge
  for i = 1, #tiers do
    tokens[i] = tokens[i] - 1
    if tokens[i] < remaining then remaining = tokens[i] end
  end
  write_tokens(state_key, state, tiers, tokens, now)
  if slot then redis.call('ZREM', resv_key, id) end
  keep_state(tokens)
  return reply(ALLOWED, 0, remaining, '', 0)
end

-- 5. Denied. Work out when the task may run, and who refused.
local by = 'tier:' .. short_tier
local earliest = now + wait
if suspended then
  by = 'suspended'
  if until_ > earliest then earliest = until_ end
elseif short_tier == 0 then
  by = 'queue'
end

if horizon > 0 and id ~= '' then
  -- Reserve the next free slot: distinct slots, in deny order, spaced so that
  -- one granule's worth of returning tasks fits in every tier's burst.
  local spacing = 0
  for _, t in ipairs(tiers) do
    local e = t.per / t.rate
    if granule > 0 and granule / t.burst > e then e = granule / t.burst end
    if e > spacing then spacing = e end
  end
  spacing = math.ceil(spacing)   -- slots stay whole microseconds
  if slot and slot >= earliest then
    return reply(DENIED, slot - now, 0, by, slot)
  end
  local s = earliest
  if vnext > s then s = vnext end
  if s - now <= horizon then
    vnext = s + spacing
    redis.call('HSET', state_key, 'vnext', fmt(vnext))
    redis.call('ZADD', resv_key, fmt(s), id)
    expire_in(resv_key, vnext - now + lapse)
    keep_state(tokens)
    return reply(DENIED, s - now, 0, by, s)
  end
  -- Beyond the horizon: come back when a slot can be reserved.
  if slot then redis.call('ZREM', resv_key, id) end
  return reply(DENIED, s - horizon - now, 0, by, 0)
end

if queued and vnext > earliest then
  earliest = vnext
  if not suspended then by = 'queue' end
end
return reply(DENIED, earliest - now, 0, by, 0)

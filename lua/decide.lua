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
  return table.concat({status, fmt(math.ceil(retry)), fmt(math.floor(remaining)), by, fmt(slot)}, '|')
end

-- 1. Suspension comes first: nothing else is read while a key is suspended
-- unless the task can be given a slot after the suspension ends.
local until_ = finite(redis.call('GET', suspend_key))
local suspended = until_ ~= nil and until_ > now

-- 2. Config, validated; the decision never crashes on a bad one.
local tiers, field, why = load_tiers(cfg_key, ARGV, DEFAULTS_AT)
if not tiers then
  if field then return table.concat({BAD_CONFIG, field, why}, '|') end
  if suspended then return reply(DENIED, until_ - now, 0, 'suspended', 0) end
  return tostring(NO_LIMITS)
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
  local va = finite(state.va)
  for i = 1, #tiers do
    local v = finite(state['vt:' .. i])
    if va and v and va + v - now > ttl then ttl = va + v - now end
  end
  expire_in(state_key, ttl + 1e6)
end

-- 3. Refill every tier on demand.
local tokens = refill(state, tiers, now)

-- A task holding a reservation that is not due yet waits for it. Within one
-- granule of its slot it is let through to the buckets: a worker clock a few
-- milliseconds behind Redis must not cost a whole extra deferral, and the
-- buckets alone keep the bound.
if slot and not suspended and now < slot - granule then
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
local function admit()
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
if not suspended and short_tier == 0 and not queued then
  return admit()
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
  if slot and slot >= earliest then
    return reply(DENIED, slot - now, 0, by, slot)
  end
  -- Reserve the next free slot. Each tier keeps a virtual schedule (GCRA:
  -- theoretical arrival time vt:i, emission interval per/rate, tolerance
  -- burst-1 intervals) that simulates its bucket at the times reserved tasks
  -- come back. A fresh queue starts from the buckets' real tokens. With a
  -- granule, slots fall on granule boundaries, because that is when asynq
  -- brings deferred tasks back: all the tasks of one granule arrive at once
  -- and must fit in what every bucket holds at that instant.
  -- Schedule times are kept relative to the queue's anchor va (whole us), so
  -- fractions of a microsecond survive (absolute times near 1.7e15 us would
  -- round them away and put a slot before its token).
  local fresh = vnext <= now or finite(state.va) == nil
  local va = now
  if not fresh then va = finite(state.va) end
  local tat = {}
  for i, t in ipairs(tiers) do
    local v = nil
    if not fresh then v = finite(state['vt:' .. i]) end
    if v == nil then v = (now - va) + (t.burst - tokens[i]) * t.per / t.rate end
    tat[i] = v
  end
  local function align(rel)
    local abs = va + math.ceil(rel)
    if granule > 0 then abs = math.ceil(abs / granule) * granule end
    return abs - va
  end
  local s = align(earliest - va)
  for _ = 1, 2 * #tiers + 1 do
    local moved = false
    for i, t in ipairs(tiers) do
      local start = tat[i] - (t.burst - 1) * t.per / t.rate
      if start > s + SLACK then s, moved = align(start), true end
    end
    if not moved then break end
  end
  local slot_at = va + s
  if slot_at - now <= horizon then
    local fields = {'va', fmt(va)}
    local gap = granule
    for i, t in ipairs(tiers) do
      local e = t.per / t.rate
      if tat[i] > s then tat[i] = tat[i] + e else tat[i] = s + e end
      fields[#fields + 1] = 'vt:' .. i
      fields[#fields + 1] = fmt(tat[i])
      if granule == 0 and e > gap then gap = e end
    end
    -- Fresh callers wait until the last reserved granule has come back.
    if slot_at + gap > vnext then vnext = math.ceil(slot_at + gap) end
    fields[#fields + 1] = 'vnext'
    fields[#fields + 1] = fmt(vnext)
    redis.call('HSET', state_key, unpack(fields))
    for k = 1, #fields, 2 do state[fields[k]] = fields[k + 1] end
    -- The schedule has room right now (a queued caller at a granule
    -- boundary, say): run now rather than "retry in 0".
    if slot_at <= now and not suspended and short_tier == 0 then
      return admit()
    end
    redis.call('ZADD', resv_key, fmt(slot_at), id)
    expire_in(resv_key, vnext - now + lapse)
    keep_state(tokens)
    return reply(DENIED, slot_at - now, 0, by, slot_at)
  end
  local s_abs = va + s
  -- Beyond the horizon: come back when a slot can be reserved.
  if slot then redis.call('ZREM', resv_key, id) end
  return reply(DENIED, s_abs - horizon - now, 0, by, 0)
end

if queued and vnext > earliest then
  earliest = vnext
  if not suspended then by = 'queue' end
end
return reply(DENIED, earliest - now, 0, by, 0)

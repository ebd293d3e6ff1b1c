-- decide.lua: atomic throttling decisions for one key (see lua.go for the
-- contract). One run decides for every caller it is given, in order, as if
-- each had called alone at the same instant: the decisions that one process
-- asks for at once share one script run, one clock reading and one write.
-- Order for each caller: suspension, config (validated), refill every tier,
-- take from all tiers or none, otherwise reserve a slot or say when to come
-- back.
local cfg_key, state_key, suspend_key, resv_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local n           = ARGV[1] + 0         -- decisions in this run
local granule     = ARGV[2] + 0         -- us; 0 = callers can come back at any instant
local horizon     = ARGV[3] + 0         -- us; 0 = never reserve
local lapse       = ARGV[4] + 0         -- us a reservation is kept after its slot
local idle_us     = ARGV[5] * 1000      -- inactivity expiry of the config
local lease       = ARGV[6] + 0         -- tokens a caller may take for its process, 0 = none
local DEFAULTS_AT = 7                   -- ARGV[7] = default tier count, then triples
local IDS_AT      = DEFAULTS_AT + 1 + 3 * ARGV[DEFAULTS_AT]

local now = now_us()

local function denied(retry, by, slot)
  if retry > MAX_WAIT then retry = MAX_WAIT end
  return string.format('0|%d|0|%s|%d', math.ceil(retry), by, slot)
end

local function all(reply)
  if n == 1 then return reply end
  local out = {}
  for k = 1, n do out[k] = reply end
  return table.concat(out, ';')
end

-- Suspension comes first.
local until_ = finite(redis.call('GET', suspend_key))
local suspended = until_ ~= nil and until_ > now

-- Config, validated; a decision never crashes on a bad one.
local tiers, field, why = load_tiers(cfg_key, ARGV, DEFAULTS_AT)
if not tiers then
  if field then return all('-1|' .. field .. '|' .. why) end
  if suspended then return all(denied(until_ - now, 'suspended', 0)) end
  return all('-2')
end

local state = read_state(state_key)
local vnext = stored_time(state.vnext, now + horizon) or 0

-- Reservations matter only while a queue of them is outstanding. Without
-- one, a task that held a slot is decided like any other (it cannot jump a
-- queue that is not there), so the common case reads no reservation at all.
if horizon > 0 and vnext > now then
  -- Reservations whose task never came back lapse.
  redis.call('ZREMRANGEBYSCORE', resv_key, '-inf', '(' .. fmt(now - lapse))
end
local fields = {}       -- state fields to write, in one HSET at the end
local taken = false     -- tokens changed

-- Refill every tier on demand, once: the callers of this run share the instant.
local tokens = refill(state, tiers, now)

local function admit(slot, id)
  local remaining = math.huge
  for i = 1, #tiers do
    tokens[i] = tokens[i] - 1
    if tokens[i] < remaining then remaining = tokens[i] end
  end
  taken = true
  if slot then redis.call('ZREM', resv_key, id) end
  -- A lease: up to lease-1 more tokens for the caller's process to hand out
  -- itself, only while every tier keeps at least lease tokens behind, so
  -- leases never compete for the last tokens. They are taken here, so the
  -- bound holds whatever the process does with them.
  local extra = 0
  if lease > 1 and not slot then
    extra = math.floor(remaining) - lease
    if extra > lease - 1 then extra = lease - 1 end
    if extra > 0 then
      for i = 1, #tiers do tokens[i] = tokens[i] - extra end
      remaining = remaining - extra
    else
      extra = 0
    end
  end
  if remaining < 0 then remaining = 0 end
  if extra > 0 then return '1|0|' .. math.floor(remaining) .. '||0|' .. extra end
  return '1|0|' .. math.floor(remaining) .. '||0'
end

-- The reservation schedule. Each tier keeps a virtual schedule (GCRA:
-- theoretical arrival time vt:i, emission interval per/rate, tolerance
-- burst-1 intervals) that simulates its bucket at the times reserved tasks
-- come back. A fresh queue starts from the buckets' real tokens. With a
-- granule, slots fall on granule boundaries, because that is when asynq
-- brings deferred tasks back: all the tasks of one granule arrive at once and
-- must fit in what every bucket holds at that instant. Schedule times are
-- relative to the queue's anchor va (whole us), so fractions of a
-- microsecond survive (absolute times near 1.7e15 us would round them away
-- and put a slot before its token).
local va, tat = nil, nil
local scheduled = false   -- the schedule changed
local function schedule()
  if tat then return end
  local fresh = vnext <= now or finite(state.va) == nil
  va = now
  if not fresh then va = finite(state.va) end
  tat = {}
  for i, t in ipairs(tiers) do
    local v = nil
    if not fresh then v = finite(state[F_VT[i]]) end
    if v == nil then v = (now - va) + (t.burst - tokens[i]) * t.e end
    tat[i] = v
  end
end
local function align(rel)
  local abs = va + math.ceil(rel)
  if granule > 0 then abs = math.ceil(abs / granule) * granule end
  return abs - va
end

local function decide(id)
  local slot = nil
  if horizon > 0 and vnext > now and id ~= '' then
    slot = finite(redis.call('ZSCORE', resv_key, id))
  end

  -- A task holding a reservation that is not due yet waits for it. Within
  -- one granule of its slot it is let through to the buckets: a worker clock
  -- a few milliseconds behind Redis must not cost a whole extra deferral,
  -- and the buckets alone keep the bound.
  if slot and not suspended and now < slot - granule then
    return denied(slot - now, 'reserved', slot)
  end

  -- Take from all tiers or none. A caller without a due reservation may not
  -- take tokens that the queue of reservations has been promised.
  local short_tier, wait = 0, 0
  for i, t in ipairs(tiers) do
    local w = wait_for(tokens[i], t)
    if w > wait then short_tier, wait = i, w end
  end
  local queued = (slot == nil) and vnext > now
  if not suspended and short_tier == 0 and not queued then
    return admit(slot, id)
  end

  -- Denied. Work out when the caller may run, and who refused.
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
      return denied(slot - now, by, slot)
    end
    schedule()
    local s = align(earliest - va)
    for _ = 1, 2 * #tiers + 1 do
      local moved = false
      for i, t in ipairs(tiers) do
        local start = tat[i] - (t.burst - 1) * t.e
        if start > s + SLACK then s, moved = align(start), true end
      end
      if not moved then break end
    end
    local slot_at = va + s
    if slot_at - now > horizon then
      -- Beyond the horizon: come back when a slot can be reserved.
      if slot then redis.call('ZREM', resv_key, id) end
      return denied(slot_at - horizon - now, by, 0)
    end
    local gap = granule
    for i, t in ipairs(tiers) do
      if tat[i] > s then tat[i] = tat[i] + t.e else tat[i] = s + t.e end
      if granule == 0 and t.e > gap then gap = t.e end
    end
    -- Fresh callers wait until the last reserved granule has come back.
    if slot_at + gap > vnext then vnext = math.ceil(slot_at + gap) end
    scheduled = true
    -- The schedule has room right now (a queued caller at a granule
    -- boundary, say): run now rather than "retry in 0".
    if slot_at <= now and not suspended and short_tier == 0 then
      return admit(slot, id)
    end
    redis.call('ZADD', resv_key, slot_at, id)
    expire_in(resv_key, vnext - now + lapse)
    return denied(slot_at - now, by, slot_at)
  end

  if queued and vnext > earliest then
    earliest = vnext
    if not suspended then by = 'queue' end
  end
  return denied(earliest - now, by, 0)
end

local replies = {}
for k = 1, n do
  replies[k] = decide(ARGV[IDS_AT + k - 1] or '')
end

-- Write what changed, once, and keep the state (and, now and then, the
-- config) alive: never shorter than the time the buckets need to refill, or
-- than the reservation queue.
if taken then
  write_tokens(fields, state, tiers, tokens, now)
  drop_extra_tiers(state_key, state, tiers)
end
if scheduled then
  fields[#fields + 1] = 'va'
  fields[#fields + 1] = va
  fields[#fields + 1] = 'vnext'
  fields[#fields + 1] = vnext
  state.va = va
  for i = 1, #tiers do
    fields[#fields + 1] = F_VT[i]
    fields[#fields + 1] = fmt(tat[i])
    state[F_VT[i]] = tat[i]
  end
end
if #fields > 0 then
  local need = full_after(state, tiers, tokens, now)
  if vnext - now > need then need = vnext - now end
  local a = finite(state.va)
  if a then
    for i = 1, #tiers do
      local v = finite(state[F_VT[i]])
      if v and a + v - now > need then need = a + v - now end
    end
  end
  -- The config's inactivity expiry is pushed back at most every 1/8 of it.
  local cr = finite(state.cr)
  local refresh_cfg = idle_us > 0 and (cr == nil or now - cr > idle_us / 8 or cr > now)
  if refresh_cfg then
    fields[#fields + 1] = 'cr'
    fields[#fields + 1] = now
  end
  local ttl = keep_alive(state_key, state, need, now, fields)
  redis.call('HSET', state_key, unpack(fields))
  if ttl then expire_in(state_key, ttl) end
  if refresh_cfg then expire_in(cfg_key, idle_us) end
end

if n == 1 then return replies[1] end
return table.concat(replies, ';')

-- decide.lua: atomic throttling decisions for one key (see decide.go for the
-- contract). One run decides for every caller it is given, in order, as if
-- each had called alone at the same instant: the decisions that one process
-- asks for at once share one script run, one clock reading and one write.
-- Order for each caller: suspension, limits (validated), every tier's bucket
-- at now, take from all tiers or none, otherwise reserve a slot or say when
-- to come back.
local key, resv_key = KEYS[1], KEYS[2]
local n        = ARGV[1] + 0         -- decisions in this run
local granule  = ARGV[2] + 0         -- us; 0 = callers can come back at any instant
local horizon  = ARGV[3] + 0         -- us; 0 = never reserve
local lapse    = ARGV[4] + 0         -- us a reservation is kept after its slot
local idle_us  = ARGV[5] * 1000      -- inactivity expiry of the limits
local lease    = ARGV[6] + 0         -- tokens a caller may take for its process, 0 = none
local defaults = ARGV[7]             -- limits when the key has none in Redis ('' = none)
local IDS_AT   = 8

local now = now_us()
local h = redis.call('HMGET', key, 'L', 's', 'T', 'x', 'q', 'g', 'D')
local L, T = h[1], h[3]
local gen = tonumber(h[6]) or 0     -- limits generation, for the caller's leases

local function denied(retry, by, slot)
  if retry > MAX_WAIT then retry = MAX_WAIT end
  return string.format('0|%d|0|%s|%d|0|%d', math.ceil(retry), by, slot, gen)
end

local function all(reply)
  if n == 1 then return reply end
  local out = {}
  for k = 1, n do out[k] = reply end
  return table.concat(out, ';')
end

-- Suspension comes first.
local until_ = finite(h[2])
local suspended = until_ ~= nil and until_ > now

-- Limits, validated; a decision never crashes on bad ones.
local src = L
if not src and defaults ~= '' then src = defaults end
if not src then
  if suspended then return all(denied(until_ - now, 'suspended', 0)) end
  return all('-2')
end
local tiers, field, why = parse_limits(src)
if not tiers then
  if not L then field = 'default ' .. field end
  return all('-1|' .. field .. '|' .. why)
end

local owed = bucket_owed(T, tiers, now)   -- of each tier's burst, in per_us units
local vnext = finite(h[5]) or 0
if vnext > now + horizon + MAX_SKEW then vnext = 0 end

-- Reservations matter only while a queue of them is outstanding. Without
-- one, a task that held a slot is decided like any other (it cannot jump a
-- queue that is not there), so the common case reads no reservation at all.
local queue_open = horizon > 0 and vnext > now
if queue_open then
  -- Reservations whose task never came back lapse.
  redis.call('ZREMRANGEBYSCORE', resv_key, '-inf', '(' .. fmt(now - lapse))
end
local taken = false     -- bucket state changed

local function admit(slot, id)
  local remaining = math.huge
  for i, t in ipairs(tiers) do
    local v = owed[i] + t.p
    owed[i] = v
    local left = t.burst - v / t.p
    if left < remaining then remaining = left end
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
      for i, t in ipairs(tiers) do owed[i] = owed[i] + extra * t.p end
      remaining = remaining - extra
    else
      extra = 0
    end
  end
  if remaining < 0 then remaining = 0 end
  return string.format('1|0|%d||0|%d|%d', math.floor(remaining), extra, gen)
end

-- The reservation schedule. Each tier keeps a virtual schedule (GCRA:
-- theoretical arrival time, emission interval per/rate, tolerance burst-1
-- intervals) that simulates its bucket at the times reserved tasks come
-- back. A fresh queue starts from the buckets' real state. With a granule,
-- slots fall on granule boundaries, because that is when asynq brings
-- deferred tasks back: all the tasks of one granule arrive at once and must
-- fit in what every bucket holds at that instant. Schedule times are
-- relative to the queue's anchor va (whole us), so fractions of a
-- microsecond survive (absolute times near 1.7e15 us would round them away
-- and put a slot before its token).
local va, vt = nil, nil
local scheduled = false   -- the schedule changed
local function schedule()
  if vt then return end
  local h2 = nil
  if vnext > now then h2 = redis.call('HMGET', key, 'a', 'V') end
  va = h2 and finite(h2[1])
  local stored = {}
  if va then stored = read_pairs(h2[2], '(%d+):([^ ]+)') else va = now end
  vt = {}
  for i, t in ipairs(tiers) do
    local v = finite(stored[t.key])
    if v == nil then v = owed[i] / t.rate + (now - va) end
    vt[i] = v
  end
end
local function align(rel)
  local abs = va + math.ceil(rel)
  if granule > 0 then abs = math.ceil(abs / granule) * granule end
  return abs - va
end

local function decide(id)
  local slot = nil
  if queue_open and id ~= '' then
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
    local w = wait_for(t, owed[i], 1)
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
        local start = vt[i] - (t.burst - 1) * t.e
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
      if vt[i] > s then vt[i] = vt[i] + t.e else vt[i] = s + t.e end
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

-- Write what changed, once, and keep the key alive: never shorter than the
-- time the buckets need to refill, the reservation queue, or the
-- suspension; with limits in Redis, never shorter than the idle expiry.
if taken or scheduled then
  local fields = {}
  local need = 0
  if taken then
    local t_field, full_in = write_owed(tiers, owed, now)
    need = full_in
    if t_field then
      fields[1], fields[2] = 'T', t_field
    else
      redis.call('HDEL', key, 'T')
    end
    if not L and h[7] ~= defaults then
      fields[#fields + 1] = 'D'
      fields[#fields + 1] = defaults
    end
  end
  if scheduled then
    local pairs_ = {}
    for i, t in ipairs(tiers) do
      pairs_[i] = t.key .. ':' .. fmt(vt[i])
      if va + vt[i] - now > need then need = va + vt[i] - now end
    end
    fields[#fields + 1] = 'q'
    fields[#fields + 1] = string.format('%d', vnext)
    fields[#fields + 1] = 'a'
    fields[#fields + 1] = string.format('%d', va)
    fields[#fields + 1] = 'V'
    fields[#fields + 1] = table.concat(pairs_, ' ')
  end
  if vnext - now > need then need = vnext - now end
  if suspended and until_ - now > need then need = until_ - now end
  local ttl = keep_alive(need, L ~= nil, idle_us, h[4], now, fields)
  if #fields > 0 then redis.call('HSET', key, unpack(fields)) end
  if ttl then expire_in(key, ttl) end
end

if n == 1 then return replies[1] end
return table.concat(replies, ';')

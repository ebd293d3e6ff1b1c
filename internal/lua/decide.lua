-- decide.lua: atomic throttling decisions for one key (see decide.go for the
-- contract). One run decides for every caller it is given, in order, as if
-- each had called alone at the same instant: the decisions that one process
-- asks for at once share one script run, one clock reading and one write.
-- Order for each caller: suspension, limits (validated), every tier at now,
-- take from all tiers or none, otherwise reserve a slot or say when to come
-- back.
local key, resv_key, slots_key = KEYS[1], KEYS[2], KEYS[3]
local n        = ARGV[1] + 0         -- decisions in this run
local granule  = ARGV[2] + 0         -- us; 0 = callers can come back at any instant
local horizon  = ARGV[3] + 0         -- us; 0 = never reserve
local lapse    = ARGV[4] + 0         -- us a reservation is kept after its slot
local idle_us  = ARGV[5] * 1000      -- inactivity expiry of the limits
local lease    = ARGV[6] + 0         -- tokens a caller may take for its process, 0 = none
local defaults = ARGV[7]             -- limits when the key has none in Redis ('' = none)
local headroom = ARGV[8] + 0         -- us of dispatch jitter to keep room for
local flags    = ARGV[9] + 0         -- 1: book (always reserve), 2: pace (admit at the slot), 4: probe
local slot_lease = ARGV[10] + 0      -- us a slot in flight is held without renewal
local CALLERS_AT = 11                -- then (task ID, cost) per decision
local book = flags % 2 == 1
local pace = math.floor(flags / 2) % 2 == 1
local probe = math.floor(flags / 4) % 2 == 1   -- a slot waiter asking again keeps its place

local now = now_us()
local h = redis.call('HMGET', key, 'L', 'T', 's', 'O')
local L = h[1]

-- Suspension comes first.
local until_ = finite(h[3])
-- (An end beyond any honest wait is garbage, not a suspension.)
if until_ and until_ - now > MAX_WAIT then until_ = nil end
local suspended = until_ ~= nil and until_ > now

-- Limits, validated; a decision never crashes on bad ones.
local src = L
if not src and defaults ~= '' then src = defaults end
if not src then
  if suspended then
    return all_n(string.format('0|%d|0|suspended|0|0|0', math.ceil(math.min(until_ - now, MAX_WAIT))), n)
  end
  return all_n('-2', n)
end
local spec, field, why = parse_limits(src)
if not spec then
  if not L then field = 'default ' .. field end
  return all_n('-1|' .. field .. '|' .. why, n)
end
-- Quotas learned from the provider (or adaptive mode) lower the limits.
if h[4] then spec = apply_learned(spec, src, h[4], now) end
local tiers, gen = spec.tiers, spec.gen

local ts, x, vnext, stored = read_T(h[2])
local owed = bucket_owed(stored, ts, tiers, now, headroom)   -- of each bucket's burst, in per_us units
if vnext > now + horizon + MAX_SKEW then vnext = 0 end

-- The common case, decided without the general machinery: one caller, no
-- suspension, no queue, no windows, no booking; admitted or not at once.
-- (A refusal falls through to the general path below.)
if n == 1 and not suspended and not spec.windows and not spec.inflight and vnext <= now and not book then
  local c = ARGV[CALLERS_AT + 1]
  c = c and tonumber(c) or 1
  local nt = #tiers
  local ok = c >= 1
  for i = 1, nt do
    local t = tiers[i]
    if owed[i] + headroom * t.rate > (t.burst - c) * t.p then ok = false break end
  end
  if ok then
    local remaining = math.huge
    for i = 1, nt do
      local t = tiers[i]
      local v = owed[i]
      if v < 0 then v = 0 end
      v = v + c * t.p
      owed[i] = v
      local left = t.burst - v / t.p
      if left < remaining then remaining = left end
    end
    local extra = 0
    if lease > 1 then
      extra = math.floor(remaining) - lease
      if extra > lease - c then extra = lease - c end
      if extra > 0 then
        for i = 1, nt do
          local t = tiers[i]
          owed[i] = owed[i] + extra * t.p
        end
        remaining = remaining - extra
      else
        extra = 0
      end
    end
    local longest = 0
    for i = 1, nt do
      local full_in = owed[i] / tiers[i].rate
      if full_in > longest then longest = full_in end
    end
    local ttl
    x, ttl = keep_alive(math.ceil(longest), L ~= nil, idle_us, x, now)
    local t_field
    if nt == 1 then
      local xr = 0
      if x > now then xr = math.floor((x - now) / 1000) end
      t_field = string.format('%d %d 0 %d:%d', now, xr, tiers[1].per, owed[1])
    else
      t_field = write_T(tiers, owed, now, x, 0)
    end
    if not L and not h[2] then
      redis.call('HSET', key, 'T', t_field, 'D', defaults)
    else
      redis.call('HSET', key, 'T', t_field)
    end
    if ttl then expire_in(key, ttl) end
    if remaining < 0 then remaining = 0 end
    return string.format('1|0|%d||%d|%d|%d', math.floor(remaining), now, extra, gen)
  end
end

local function denied(retry, by, slot)
  if retry > MAX_WAIT then retry = MAX_WAIT end
  return string.format('0|%d|0|%s|%d|0|%d', math.ceil(retry), by, slot, gen)
end

-- Windows keep their own state.
local wins = nil
if spec.windows then
  local names = {}
  for _, t in ipairs(tiers) do
    if t.kind == 'w' then names[#names + 1] = 'W' .. t.key end
  end
  local raw = redis.call('HMGET', key, unpack(names))
  wins = {}
  local k = 0
  for i, t in ipairs(tiers) do
    if t.kind == 'w' then
      k = k + 1
      wins[i] = win_load(raw[k], t, now, headroom)
    end
  end
end

-- Slots in flight: holders whose lease ended (a worker killed) give them
-- back now.
local held, slot_n = 0, spec.inflight
if slot_n then
  redis.call('ZREMRANGEBYSCORE', slots_key, '-inf', '(' .. fmt(now))
  held = redis.call('ZCARD', slots_key)
end
local lanes = nil        -- when each slot is next expected free, while callers wait
local function slot_wait()
  if not lanes then
    local raw = redis.call('HMGET', key, 'FL', 'R')
    local holders = redis.call('ZRANGE', slots_key, 0, -1)
    local avg = slot_avg(raw[2], 0)
    lanes = {}
    if avg == 0 then
      -- No slot of the key was released yet: nothing to predict from. The
      -- guess is a second (asynq's resolution), or as long as the oldest
      -- holder has been running; a waiter is not sent further than one
      -- guess ahead (it comes back and asks again), and the guess is not
      -- kept.
      avg = 1e6
      for _, m in ipairs(holders) do
        local st = slot_start(m)
        if st and now - st > avg then avg = now - st end
      end
      avg = math.min(avg, slot_lease)
      lanes.guess = now + avg
    else
      for v in string.gmatch(raw[1] or '', '(%d+)') do lanes[#lanes + 1] = tonumber(v) end
    end
    if #lanes ~= slot_n or lanes[1] < now then
      -- Fresh lanes: each holder is expected to hold its slot for the
      -- average, and one that has held it longer, as long again as it is
      -- over (at least 50 ms); while no average is known, as long again as
      -- it has held it (at least the guess). Predicted free "now", a
      -- waiter would ask again and again while a slow holder runs: tasks
      -- behind a slot held 12 s were deferred 60 times. Free slots are
      -- free now.
      local fresh = {guess = lanes.guess}
      for _, m in ipairs(holders) do
        local st = slot_start(m) or now
        local ends = st + avg
        if lanes.guess then
          ends = now + math.max(now - st, 1e6)
        elseif ends < now + 50000 then
          ends = now + math.max(now - ends, 50000)
        end
        fresh[#fresh + 1] = ends
      end
      while #fresh < slot_n do fresh[#fresh + 1] = now end
      table.sort(fresh)
      lanes = fresh
    end
    lanes.avg = avg
  end
  -- The earliest lane goes to this caller; it is next free a run later.
  -- (A probe was given its place before: it is told the earliest lane and
  -- takes none.)
  local at = lanes[1]
  if probe then
    if lanes.guess and at > lanes.guess then at = lanes.guess end
    return at
  end
  lanes[1] = at + lanes.avg
  table.sort(lanes)
  if lanes.guess and at > lanes.guess then at = lanes.guess end
  return at
end

-- Reservations matter only while a queue of them is outstanding. Without
-- one, a task that held a slot is decided like any other (it cannot jump a
-- queue that is not there), so the common case reads no reservation at all.
local queue_open = horizon > 0 and vnext > now
-- Reservations whose task never came back lapse: a holder found with one is
-- a fresh caller, and they are swept when a reservation is added.
local swept = false
local taken = false     -- bucket or window state changed
local callers_in_run = 0

-- admit takes c from every tier, at now or, for a paced holder, at a
-- moment ahead (at > now) when every tier admits it. It returns the reply.
local function admit(slot, id, c, at)
  local remaining = math.huge
  for i, t in ipairs(tiers) do
    if t.kind == 'b' then
      local v = owed[i]
      if v < (at - now) * t.rate then v = (at - now) * t.rate end
      v = v + c * t.p
      owed[i] = v
      local left = t.burst - v / t.p
      if left < remaining then remaining = left end
    else
      local w = wins[i]
      win_add(w, t, at, c)
      local left = t.n - win_count(w, t, at, headroom)
      if left < remaining then remaining = left end
    end
  end
  taken = true
  if slot then redis.call('ZREM', resv_key, id) end
  local hold = ''
  if slot_n then
    -- The reply is split on '|' and ';': a task ID with those is spelled
    -- with '_' in its slot's name.
    local who = string.gsub(id ~= '' and id or 'x', '[|;]', '_')
    local stamp = who .. '@' .. string.format('%d', now) .. '.'
    -- Unique even for two runs in the same microsecond (a clock that does
    -- not move, or a very fast Redis).
    repeat
      hold = stamp .. callers_in_run
      callers_in_run = callers_in_run + 1
    until redis.call('ZADD', slots_key, 'NX', now + slot_lease, hold) == 1
    held = held + 1
  end
  -- A lease: more tokens for the caller's process to hand out itself, only
  -- while every tier keeps at least lease tokens behind, so leases never
  -- compete for the last tokens. They are taken here, so the bound holds
  -- whatever the process does with them. Not on a key with a window: a
  -- leased call the process does not make within the lease is lost for a
  -- whole window there (a bucket has it back in 1/rate), and a fleet
  -- starting on a fresh window of 100 lost half of it that way.
  local extra = 0
  if lease > 1 and not slot and at == now and not slot_n and not spec.windows then
    extra = math.floor(remaining) - lease
    if extra > lease - c then extra = lease - c end
    if extra > 0 then
      for i, t in ipairs(tiers) do
        if t.kind == 'b' then owed[i] = owed[i] + extra * t.p else win_add(wins[i], t, now, extra) end
      end
      remaining = remaining - extra
    else
      extra = 0
    end
  end
  if remaining == math.huge then remaining = slot_n - held end
  if remaining < 0 then remaining = 0 end
  if slot_n then
    return string.format('1|%d|%d||%d|%d|%d|%s', math.ceil(at - now), math.floor(remaining), math.ceil(at), extra, gen, hold)
  end
  return string.format('1|%d|%d||%d|%d|%d', math.ceil(at - now), math.floor(remaining), math.ceil(at), extra, gen)
end

-- short returns the tier that refuses c calls at at (0: none) and how long
-- until it would not. A holder at its slot is let through when it is short
-- by at most HOLDER_SLACK: slots are rounded up to whole microseconds, so
-- the tokens its predecessors took at their rounded slots can fall due a
-- fraction of a microsecond after its own.
local HOLDER_SLACK = 1
local function short(c, at, holder)
  local tier, wait = 0, 0
  for i, t in ipairs(tiers) do
    local w
    if t.kind == 'b' then
      local v = owed[i]
      -- At an instant ahead, the bucket owes less by the time between, down
      -- to minus the headroom as bucket_owed reads a full bucket: a bucket
      -- full for that long has room for the headroom, and a floor of 0
      -- would refuse every holder of a burst equal to its cost ahead of now.
      if at > now then v = math.max(-headroom * t.rate, v - (at - now) * t.rate) end
      w = wait_for(t, v, c, headroom)
    else
      -- A holder does not wait for other holders' reservations whose
      -- sub-window has passed: they are late (asynq brings a task back up
      -- to a second after its slot) and take their turn when they come.
      -- Counted, they kept a window's room idle while on their way, and a
      -- window paired with a bucket drifted later every period until a
      -- holder missed its turn.
      local ws, stale = wins[i], nil
      if holder then
        local cur = math.floor(now / t.sub)
        for k, v in pairs(ws.r) do
          if -k < cur then
            stale = stale or {}
            stale[k] = v
          end
        end
        if stale then
          for k in pairs(stale) do ws.r[k] = nil end
        end
      end
      local free = win_free(ws, t, at, c, headroom, at + MAX_WAIT)
      if stale then
        for k, v in pairs(stale) do ws.r[k] = v end
      end
      w = free and free - at or MAX_WAIT
    end
    if w > wait and not (holder and w <= HOLDER_SLACK) then tier, wait = i, w end
  end
  return tier, wait
end

-- The reservation schedule. Each token bucket keeps a virtual schedule
-- (GCRA: theoretical arrival time, emission interval per/rate, tolerance
-- burst-cost intervals less the headroom) that simulates it at the times
-- reserved tasks come back; a window counts reserved slots with its calls.
-- A fresh queue starts from the real state. With a granule, slots fall on
-- granule boundaries, because that is when asynq brings deferred tasks
-- back: all the tasks of one granule arrive at once and must fit in what
-- every tier holds at that instant. Bucket schedule times are relative to
-- the queue's anchor va (whole us), so fractions of a microsecond survive.
local va, vt = nil, nil
local scheduled = false   -- the schedule changed
local function schedule()
  if vt then return end
  local h2 = nil
  if vnext > now then h2 = redis.call('HMGET', key, 'a', 'V') end
  va = h2 and finite(h2[1])
  local virt = {}
  if va then virt = read_pairs(h2[2], '(%d+):([^ ]+)') else va = now end
  vt = {}
  for i, t in ipairs(tiers) do
    if t.kind == 'b' then
      local v = finite(virt[t.key])
      if v == nil then v = owed[i] / t.rate + (now - va) end
      vt[i] = v
    end
  end
end
-- Pacing: with a bucket whose burst is below its rate per granule, slots
-- on whole granules would drain the backlog at burst per granule, and a
-- slow bucket (a token per granule or slower) whose burst cannot absorb a
-- granule's delay would lose up to a granule per slot; paced, slots are
-- exact instants and a holder back in the granule before its slot (or a
-- little earlier: worker clocks) is admitted at the slot and waits for it.
-- A window frees its calls a sub-window and the headroom after a whole
-- period, never on a granule: on whole granules a backlog would lose up to
-- a granule per period (half the quota of a one-second window), so windows
-- are paced too.
local paced = false
if pace and granule > 0 then
  for _, t in ipairs(tiers) do
    if t.kind == 'w' or (t.kind == 'b' and (t.burst * t.e - headroom < granule or
        (t.e >= granule and (t.burst - 1) * t.e - headroom < granule))) then
      paced = true
    end
  end
end
local PACE_EARLY = 200000   -- us a paced holder may come back before its granule
local function align(abs)
  abs = math.ceil(abs)
  if granule > 0 and not paced then abs = math.ceil(abs / granule) * granule end
  return abs
end

local function decide(id, c)
  -- A cost no configured tier can ever admit is refused for good; one above
  -- a tier lowered by what was learned waits for the tier to come back up.
  for _, t in ipairs(tiers) do
    local ct = t.ceiling or t
    if t.kind == 'b' and c > ct.burst then
      return '-3|' .. t.key .. '|' .. string.format('%d', ct.burst)
    end
    if t.kind == 'w' and c > ct.n then
      return '-3|' .. t.key .. '|' .. string.format('%d', ct.n)
    end
  end
  local slot = nil
  if book and id ~= '' then
    -- A booking under an ID that holds a reservation is another task's
    -- (an enqueue of an ID in use, which asynq will refuse): it changes
    -- nothing, neither the reservation nor any tier.
    local held = finite(redis.call('ZSCORE', resv_key, id))
    if held and held >= now - lapse then
      return string.format('0|0|0|booked|0|0|%d', gen)
    end
  elseif queue_open and id ~= '' then
    slot = finite(redis.call('ZSCORE', resv_key, id))
    if slot and slot < now - lapse then
      redis.call('ZREM', resv_key, id)
      slot = nil
    end
  end
  -- A holder's reserved calls leave the windows while it is decided, and
  -- go back where it ends up: admitted, on its slot again, or on a new one.
  local function keep(at)
    if wins and at then
      for i, t in ipairs(tiers) do
        if t.kind == 'w' then win_reserve(wins[i], t, at, c) end
      end
    end
  end
  if slot and wins then
    for i, t in ipairs(tiers) do
      if t.kind == 'w' then win_unreserve(wins[i], t, slot, c) end
    end
    taken = true
  end

  -- A task holding a reservation that is not due yet waits for it. Within
  -- one granule of its slot it is let through: paced, it is admitted at its
  -- slot and told how long to wait for it; otherwise the tiers decide at
  -- once (a worker clock a few milliseconds behind Redis must not cost a
  -- whole extra deferral, and the tiers alone keep the bound).
  if slot and not suspended then
    local early = granule
    if paced then early = granule + PACE_EARLY end
    if now < slot - early then
      keep(slot)
      return denied(slot - now, 'reserved', slot)
    end
    if paced then
      -- Paced: the holders of one granule come back together, in any order,
      -- and take their turns first come first served at the instant every
      -- tier admits them (the schedule made room for them in this granule),
      -- each told to wait for it.
      local at = now
      for _ = 1, 3 do
        local tier, wait = short(c, at, true)
        if tier == 0 then break end
        at = at + wait
      end
      if at - now <= early and short(c, at, true) == 0 and not (slot_n and held >= slot_n) then
        return admit(slot, id, c, at)
      end
    end
  end

  -- Take from all tiers or none. A caller without a due reservation may not
  -- take what the queue of reservations has been promised.
  local short_tier, wait = short(c, now, slot ~= nil and now >= slot)
  local queued = (slot == nil) and vnext > now
  local no_slot = slot_n ~= nil and held >= slot_n and not book
  if not suspended and short_tier == 0 and not queued and not no_slot and not (book and slot == nil) then
    return admit(slot, id, c, now)
  end

  -- Denied. Work out when the caller may run, and who refused.
  local by = 'tier:' .. short_tier
  local earliest = now + wait
  if suspended then
    by = 'suspended'
    if until_ > earliest then earliest = until_ end
  elseif short_tier == 0 and no_slot and not queued then
    -- Only the slots refuse: come back when one is expected free, in the
    -- order callers were refused (no reservation: a slot frees when its
    -- holder ends, not on a schedule).
    local at = slot_wait()
    if slot then keep(slot) end
    return denied(math.max(at - now, 1000), 'inflight', slot or 0)
  elseif short_tier == 0 then
    by = 'queue'
  end

  if horizon > 0 and id ~= '' then
    if slot and slot >= earliest then
      keep(slot)
      return denied(slot - now, by, slot)
    end
    schedule()
    local s = align(earliest)
    local limit = now + horizon
    for _ = 1, 2 * #tiers + 1 do
      local moved = false
      for i, t in ipairs(tiers) do
        local start
        if t.kind == 'b' then
          start = va + vt[i] - (t.burst - c) * t.e + headroom
        else
          start = win_free(wins[i], t, s, c, headroom, limit + granule) or (limit + granule + 1)
        end
        if start > s + SLACK then s, moved = align(start), true end
      end
      if not moved then break end
    end
    local slot_at = s
    if slot_at - now > horizon then
      -- Beyond the horizon: come back when a slot can be reserved.
      if slot then redis.call('ZREM', resv_key, id) end
      return denied(slot_at - horizon - now, by, 0)
    end
    local gap = granule
    for i, t in ipairs(tiers) do
      if t.kind == 'b' then
        local rel = slot_at - va
        if vt[i] > rel then vt[i] = vt[i] + c * t.e else vt[i] = rel + c * t.e end
        if granule == 0 and t.e > gap then gap = t.e end
      else
        win_reserve(wins[i], t, slot_at, c)
        taken = true
      end
    end
    -- Fresh callers wait until the last reserved granule has come back.
    if slot_at + gap > vnext then vnext = math.ceil(slot_at + gap) end
    scheduled = true
    -- The schedule has room right now (a queued caller at a granule
    -- boundary, say): run now rather than "retry in 0".
    if slot_at <= now and not suspended and short_tier == 0 and not book and not no_slot then
      for i, t in ipairs(tiers) do
        if t.kind == 'w' then win_unreserve(wins[i], t, slot_at, c) end
      end
      return admit(slot, id, c, now)
    end
    if not swept then
      redis.call('ZREMRANGEBYSCORE', resv_key, '-inf', '(' .. fmt(now - lapse))
      swept = true
    end
    redis.call('ZADD', resv_key, slot_at, id)
    expire_in(resv_key, vnext - now + lapse)
    return denied(math.max(slot_at - now, 0), by, slot_at)
  end

  if queued and vnext > earliest then
    earliest = vnext
    if not suspended then by = 'queue' end
  end
  return denied(earliest - now, by, 0)
end

local replies = {}
for k = 1, n do
  local at = CALLERS_AT + 2 * (k - 1)
  local c = ARGV[at + 1]
  c = c and tonumber(c) or 1
  if c < 1 or c ~= math.floor(c) then c = 1 end
  replies[k] = decide(ARGV[at] or '', c)
end

-- Write what changed, once, and keep the key alive: never shorter than the
-- time the tiers need to refill, the reservation queue, or the suspension;
-- with limits in Redis, never shorter than the idle expiry.
if taken or scheduled then
  local fields = {}
  local need = 0
  if wins then
    for i, t in ipairs(tiers) do
      if t.kind == 'w' then
        local s, empty_in = win_write(wins[i], t, now, headroom)
        if s then
          fields[#fields + 1] = 'W' .. t.key
          fields[#fields + 1] = s
        else
          redis.call('HDEL', key, 'W' .. t.key)
        end
        if empty_in > need then need = empty_in end
      end
    end
  end
  if scheduled then
    local pairs_ = {}
    for i, t in ipairs(tiers) do
      if t.kind == 'b' then
        pairs_[#pairs_ + 1] = t.key .. ':' .. fmt(vt[i])
        if va + vt[i] - now > need then need = va + vt[i] - now end
      end
    end
    fields[#fields + 1] = 'a'
    fields[#fields + 1] = string.format('%d', va)
    fields[#fields + 1] = 'V'
    fields[#fields + 1] = table.concat(pairs_, ' ')
  end
  local _, full_in = write_T(tiers, owed, now, 0, 0)
  if full_in > need then need = full_in end
  if vnext - now > need then need = vnext - now end
  if suspended and until_ - now > need then need = until_ - now end
  local ttl
  x, ttl = keep_alive(need, L ~= nil, idle_us, x, now)
  local t_field = write_T(tiers, owed, now, x, vnext > now and vnext or 0)
  if t_field then
    fields[#fields + 1] = 'T'
    fields[#fields + 1] = t_field
    if not L and not h[2] then
      -- Record the defaults the buckets are computed under, for SetLimits.
      fields[#fields + 1] = 'D'
      fields[#fields + 1] = defaults
    end
  elseif h[2] then
    redis.call('HDEL', key, 'T')
  end
  if #fields > 0 then redis.call('HSET', key, unpack(fields)) end
  if ttl then expire_in(key, ttl) end
end
if lanes and not lanes.guess then
  local l = {}
  for i = 1, #lanes do l[i] = string.format('%d', lanes[i]) end
  redis.call('HSET', key, 'FL', table.concat(l, ' '))
end
if slot_n and held > 0 then
  -- The slots live as long as their longest lease.
  expire_in(slots_key, slot_lease)
end

if n == 1 then return replies[1] end
return table.concat(replies, ';')

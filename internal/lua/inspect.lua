-- inspect.lua: read keys' state without changing it (see admin.go).

-- inspect_key reads one key at now (us): its bucket hash, reservations,
-- slots in flight, active tenants (nil: none) and configuration (lib.lua:
-- the hash's copy, else :c, kept until Delete), under the default limits
-- (a string as FormatTiers writes them, '' none); reservations older than
-- lapse (us) are not counted (0: count all).
local function inspect_key(key, resv_key, slots_key, tenants_key, kc, defaults, lapse, now)
  local h = redis.call('HMGET', key, 'L', 's', 'T', 'O', 'G', 'WL', 'D')
  h[1] = config_of(kc, h[1], h[7]) or false
  local wsrc = key
  if not h[6] and kc then
    h[6] = redis.call('HGET', kc, 'WL') or false
    wsrc = kc
  end
  local until_ = finite(h[2]) or 0
  local suspended = 0
  -- (An end beyond any honest wait is garbage, not a suspension: as decide.)
  if until_ > now and until_ - now <= MAX_WAIT then suspended = until_ - now end
  -- Reservations whose task never came back (older than the lapse, 0:
  -- count all) are swept only when one is added: not counted here.
  local reservations
  if lapse > 0 then
    reservations = redis.call('ZCOUNT', resv_key, fmt(now - lapse), '+inf')
  else
    reservations = redis.call('ZCARD', resv_key)
  end
  local src = h[1]
  if not src and defaults ~= '' then src = defaults end
  if not src then return {-2, fmt(suspended), reservations} end
  local spec, field, why = parse_limits(src)
  if not spec then
    if not h[1] then field = 'default ' .. field end
    return {-1, field, why}
  end
  -- The limits in force: the configured ones (the ceiling) lowered by what
  -- was learned.
  local ceiling = spec
  local learned, adapt = read_O(h[4])
  if h[4] then spec = apply_learned(spec, src, h[4], now) end
  local from_redis = 0
  if h[1] then from_redis = 1 end
  local ts, _, q, stored = read_T(h[3], now)
  local owed = bucket_owed(stored, ts, spec.tiers, now, 0)
  local queued = q - now
  if q < 0 then
    -- Tenants share the key (fair.lua): its bookings are not one queue, and
    -- the backlog drains with the last of them.
    local last = redis.call('ZRANGE', resv_key, -1, -1, 'WITHSCORES')
    queued = (tonumber(last[2]) or now) - now
  end
  if queued < 0 or queued > MAX_WAIT then queued = 0 end
  local in_flight = 0
  if spec.inflight then in_flight = redis.call('ZCOUNT', slots_key, fmt(now), '+inf') end
  local out = {1, fmt(suspended), reservations, fmt(queued), from_redis, #spec.tiers, spec.gen,
               in_flight, spec.inflight or 0, fmt(ceiling.adaptive or 0), adapt_ppm(ceiling, adapt, now)}
  for i, t in ipairs(spec.tiers) do
    local c = ceiling.tiers[i]
    local l = learned[c.key]
    local learned_for = 0
    if learned_lowers(l, c, now) then learned_for = l[2] - now end
    if t.kind == 'b' then
      out[#out + 1] = 'b'
      out[#out + 1] = fmt(t.rate)
      out[#out + 1] = fmt(t.per)
      out[#out + 1] = fmt(t.burst)
      out[#out + 1] = fmt(tokens_at(t, owed[i]))
      out[#out + 1] = fmt(c.rate)
      out[#out + 1] = fmt(c.burst)
    else
      local w = win_load(redis.call('HGET', key, 'W' .. t.key), t, now, 0)
      out[#out + 1] = t.fixed and 'x' or 'w'
      out[#out + 1] = fmt(t.n)
      out[#out + 1] = fmt(t.per)
      out[#out + 1] = fmt(t.n)
      out[#out + 1] = fmt(math.max(0, t.n - win_count(w, t, now, 0)))
      out[#out + 1] = fmt(c.n)
      out[#out + 1] = fmt(c.n)
    end
    out[#out + 1] = fmt(learned_for)
    out[#out + 1] = t.unit or ''
  end
  -- The tenants (fair.lua): the active ones (at most 100, least finish tag
  -- first), then those with a weight set that are not active: name, weight,
  -- share of the rate now, backlog (cost units booked and not yet due),
  -- units admitted while active.
  local tenants = {}
  local g = read_G(h[5] or nil, now)
  local V = g.V
  if g.W > 0 and #spec.tiers > 0 and now > g.tV then
    -- As fair_clock: at most a granule (1 s here) past what was served.
    local R = fair_rate(spec.tiers)
    V = math.max(V, math.min(V + (now - g.tV) * R / g.W, g.Vs + 1e6 * R / g.W))
  end
  local seen = {}
  if tenants_key and g.W > 0 then
    -- A tenant whose work the clock has passed has none booked: it leaves
    -- at the key's next decision, and gets no share meanwhile.
    local act, W = {}, 0
    for _, id in ipairs(redis.call('ZRANGE', tenants_key, 0, 99)) do
      local rec = read_tenant(redis.call('HGET', key, 't:' .. id) or nil)
      if rec and rec.F > V then
        act[#act + 1] = {id, rec}
        W = W + rec.w
      end
    end
    for _, a in ipairs(act) do
      local id, rec = a[1], a[2]
      seen[id] = true
      tenants[#tenants + 1] = {id, rec.w, rec.w / W, (rec.F - V) * rec.w, rec.units}
    end
  end
  for name in string.gmatch(h[6] or '', '[^\n]+') do
    if not seen[name] then
      local w = tonumber(redis.call('HGET', wsrc, 'w:' .. name)) or 1
      tenants[#tenants + 1] = {name, w, 0, 0, 0}
    end
  end
  out[#out + 1] = #tenants
  for _, t in ipairs(tenants) do
    out[#out + 1] = t[1]
    out[#out + 1] = fmt(t[2])
    out[#out + 1] = fmt(t[3])
    out[#out + 1] = fmt(t[4])
    out[#out + 1] = fmt(t[5])
  end
  return out
end

-- inspect_keys reads the keys of KEYS, five per limiter key (as
-- inspect_key takes them), at one instant: one reply for one key, else a
-- reply per key, {-9, error} for a key Redis could not read (a key of
-- the wrong type), so that one broken key does not hide the others.
local function inspect_keys(KEYS, ARGV)
  local defaults, lapse, now = ARGV[1], tonumber(ARGV[2]) or 0, now_us()
  if #KEYS == 5 then
    return inspect_key(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], defaults, lapse, now)
  end
  local out = {}
  for i = 1, #KEYS, 5 do
    local ok, r = pcall(inspect_key, KEYS[i], KEYS[i + 1], KEYS[i + 2], KEYS[i + 3], KEYS[i + 4], defaults, lapse, now)
    if not ok then
      if type(r) == 'table' then r = r.err end
      r = {-9, tostring(r)}
    end
    out[#out + 1] = r
  end
  return out
end

-- unbook.lua: give up a booking whose task was never enqueued (see
-- admin.go): Limiter.Enqueue booked a run time for task ID ARGV[1], then
-- asynq refused the task (a duplicate of a unique task, an ID in use, a
-- Redis error), so that work will never come. What the booking wrote is
-- undone, so that nobody waits behind it:
--   - the reservation, and a hold of its instant ('~' .. ID: a task of
--     several keys holds in a key the instant booked in another, see
--     multi.lua);
--   - on a key tenants share (fair.lua), its start tag, and the work it
--     added to its tenant's finish tag (a tenant's next tasks were tagged
--     behind work that never ran: after enough duplicates, its tasks on an
--     idle key never came due);
--   - otherwise, the buckets' schedule when the booking was the last one
--     (a later booking keeps its place: the schedule then stays a little
--     late, never early), and the calls it reserved in each window.
-- Reply: 1 when the booking (or a hold) was there, else 0.
local key, resv_key, akey, tkey, kc = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id, tenant, cost_raw, defaults = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = now_us()
local held = redis.call('ZREM', resv_key, '~' .. id)
local at = finite(redis.call('ZSCORE', resv_key, id))
if not at then return held end
redis.call('ZREM', resv_key, id)
-- (a hash that expired meanwhile holds nothing the booking wrote: it is
-- not made anew, with no lifetime)
if redis.call('EXISTS', key) == 0 then
  redis.call('ZREM', tkey, id)
  return 1
end
local h = redis.call('HMGET', key, 'L', 'O', 'G', 't:' .. tenant, 'V', 'T', 'D')
local src = config_of(kc, h[1], h[7])
if not src and defaults ~= '' then src = defaults end
local spec = src and parse_limits(src)
if not spec then return 1 end
if h[2] then spec = apply_learned(spec, src, h[2], now) end
local c = cost_vec(cost_raw, spec)
local S = finite(redis.call('ZSCORE', tkey, id))
if S then
  redis.call('ZREM', tkey, id)
  local g = read_G(h[3] or nil, now)
  local rec = read_tenant(h[4] or nil)
  if rec and g.W > 0 and redis.call('ZSCORE', akey, tenant) then
    local F = rec.F - cost_units(spec.tiers, c) / rec.w
    if F < S + rec.shift then F = S + rec.shift end
    if F < rec.F then
      rec.F = F
      if F < g.Fmin then g.Fmin = F end
      redis.call('HSET', key, 't:' .. tenant, pack_tenant(rec),
        'G', pack_G(g))
      -- (the set's scores may be low, never high: fair_expire)
      redis.call('ZADD', akey, fmt(F), tenant)
    end
  end
  return 1
end
-- The schedule of the buckets (decide.lua's book_schedule), while a queue
-- is outstanding.
local _, _, q = read_T(h[6], now)
local va, sw, vt = nil, 0, nil
if q > now then va, sw, vt = read_V(h[5] or nil) end
if va then
  local changed, v = false, {}
  for i, t in ipairs(spec.tiers) do
    if t.kind == 'b' then
      v[i] = vt[-t.id]
      local ci = cv(c, i)
      if v[i] and ci > 0 and math.abs(v[i] - (at - va + ci * t.e)) <= 1 then
        v[i], changed = at - va, true
      end
    end
  end
  if changed then
    local complete = true
    for i, t in ipairs(spec.tiers) do
      if t.kind == 'b' and v[i] == nil then complete = false end
    end
    if complete then redis.call('HSET', key, 'V', write_V(va, sw, spec.tiers, v)) end
  end
end
if spec.windows then
  for i, t in ipairs(spec.tiers) do
    local ci = cv(c, i)
    if t.kind == 'w' and ci > 0 then
      local f = 'W' .. t.key
      local w = win_load(redis.call('HGET', key, f), t, now, 0)
      win_unreserve(w, t, at, ci)
      local s = win_write(w, t, now, 0)
      if s then redis.call('HSET', key, f, s) else redis.call('HDEL', key, f) end
    end
  end
end
return 1

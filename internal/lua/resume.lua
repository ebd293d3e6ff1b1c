-- resume.lua: end a key's suspension at once (see admin.go), and every wait
-- a provider's response imposed: an operator wins over a provider. The
-- reservation schedule built during the suspension is dropped with it: its
-- reserved times all lie after the old end, and fresh callers would wait
-- behind them (so are the windows' reserved calls). So is the state of
-- fair shares (fair.lua: the clock, the active tenants and their records,
-- the start tags): the tenants' finish tags count the work those
-- reservations booked, and the tasks brought back, decided as fresh ones,
-- would queue behind their own work and never be reached. Weights stay.
-- A provider's near reset left the buckets owing beyond empty until then
-- (observe.lua's P): the provider's part of it is given back, down to
-- empty at most, never what calls took (a paced holder counted ahead owes
-- beyond empty too: see read_P). The reply names the
-- tasks that held a reservation, whichever path booked it (the middleware,
-- or Limiter.Enqueue), for the caller to bring back.
local key, resv_key, tenants_key, tags_key, kc = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local defaults = ARGV[1] or ''
local MAX_BACK = 100000
local now = now_us()
local h = redis.call('HMGET', key, 's', 'T', 'P', 'L', 'D', 'O')
local until_ = finite(h[1])
local P, parts = read_P(h[3] or nil)
if h[3] then redis.call('HDEL', key, 'P') end
local suspended = until_ ~= nil and until_ > now
if until_ and not suspended then redis.call('HDEL', key, 's') end
local held = {}
local T = h[2]
if suspended then
  held = redis.call('ZRANGE', resv_key, 0, MAX_BACK - 1)
  redis.call('HDEL', key, 's', 'V', 'B')
  redis.call('DEL', resv_key)
  drop_fair(key, tenants_key, tags_key)
  for _, f in ipairs(redis.call('HKEYS', key)) do
    if string.sub(f, 1, 1) == 'W' then
      local w = redis.call('HGET', key, f)
      local stripped = string.gsub(w, '|.*$', '')
      if stripped ~= w then redis.call('HSET', key, f, stripped) end
    end
  end
end
local ts, x, q, stored = read_T(T, now)
local spec = nil
if ts and P and P > now then
  local src = config_of(kc, h[4], h[5])
  if not src and defaults ~= '' then src = defaults end
  spec = src and parse_limits(src)
  if spec and h[6] then spec = apply_learned(spec, src, h[6], now) end
end
-- (the queue's end goes with the schedule, and the mark of active tenants
-- with the fair state: none is active now)
local q_new = q
if suspended then q_new = 0 end
if spec then
  local owed = bucket_owed(stored, ts, spec.tiers, now, 0)
  for i, t in ipairs(spec.tiers) do
    if t.kind == 'b' then
      local d = debt_of(t, parts[string.format('%d', t.id)], owed[i])
      if d > 0 then owed[i] = math.max(owed[i] - d, t.full) end
    end
  end
  local t_field = write_T(spec.tiers, owed, now, x, q_new)
  if t_field then redis.call('HSET', key, 'T', t_field) else redis.call('HDEL', key, 'T') end
elseif ts and q ~= q_new then
  -- The same field, without the queue's end.
  redis.call('HSET', key, 'T', string.sub(T, 1, 16) .. bin_pack('<d', 0) .. string.sub(T, 25))
end
if not suspended then return {'0'} end
local out = {string.format('%d', math.min(until_ - now, MAX_WAIT))}
for i = 1, #held do out[1 + i] = held[i] end
return out

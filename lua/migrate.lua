-- migrate.lua: carry a key written by the previous storage layout (four keys:
-- :cfg, :state, :suspend, :resv, tiers by position) into the current one
-- (see admin.go). It fills in only what the current hash lacks (limits,
-- bucket state, suspension) and leaves the old keys to processes of the
-- previous version, which still read them during a rolling upgrade. The
-- old reservation queue is not carried: its tasks are decided anew.
local key, cfg1, state1, suspend1 = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local idle_us  = ARGV[1] * 1000
local defaults = ARGV[2]
if redis.call('EXISTS', cfg1, state1, suspend1) == 0 then return 0 end

local now = now_us()
local h = redis.call('HMGET', key, 'L', 'T', 's')
local fields = {}

-- Limits: copied as they were (a bad value stays bad, and is reported by
-- the next decision naming the field, as before).
local cfg = {}
local flat = redis.call('HGETALL', cfg1)
for i = 1, #flat, 2 do cfg[flat[i]] = flat[i + 1] end
local L1 = nil
local n1 = tonumber(cfg.tiers)
if n1 and n1 >= 1 and n1 <= MAX_TIERS and n1 == math.floor(n1) then
  local toks = {}
  for i = 1, n1 do
    toks[i] = (cfg['rate:' .. i] or '?') .. '/' .. (cfg['per_ms:' .. i] or '?') .. '/' .. (cfg['burst:' .. i] or '?')
  end
  L1 = table.concat(toks, ' ')
end
if not h[1] and L1 then
  fields[#fields + 1] = 'L'
  fields[#fields + 1] = L1
end

-- Bucket state: tokens per tier by position, as of ts.
local tiers = nil
local on_defaults = false
if L1 then
  local spec = parse_limits(L1)
  tiers = spec and spec.tiers
end
if not tiers and defaults ~= '' then
  local spec = parse_limits(defaults)
  tiers = spec and spec.tiers
  on_defaults = tiers ~= nil
end
local need = 0
if not h[2] and tiers then
  local st = {}
  flat = redis.call('HGETALL', state1)
  for i = 1, #flat, 2 do st[flat[i]] = flat[i + 1] end
  local ts = finite(st.ts)
  if ts then
    local elapsed = now - ts
    if elapsed < 0 then elapsed = 0 end
    local owed = {}
    for i, t in ipairs(tiers) do
      local tk = finite(st['tk:' .. i])
      local v = 0
      if tk then
        if tk < 0 then tk = 0 end
        tk = tk + elapsed / t.e
        if tk > t.burst then tk = t.burst end
        v = math.ceil((t.burst - tk) * t.p)
        -- A stored time ahead of now (the clock stepped back) held the
        -- refill back by that much.
        if ts > now and ts - now <= MAX_SKEW then v = v + (ts - now) * t.rate end
      end
      owed[i] = v
    end
    local t_field, full_in = write_T(tiers, owed, now, 0, 0)
    if t_field then
      fields[#fields + 1] = 'T'
      fields[#fields + 1] = t_field
      need = full_in
      if on_defaults and not h[1] then
        fields[#fields + 1] = 'D'
        fields[#fields + 1] = defaults
      end
    end
  end
end

-- Suspension.
local until_ = finite(redis.call('GET', suspend1))
if not h[3] and until_ and until_ > now and until_ - now <= MAX_WAIT then
  fields[#fields + 1] = 's'
  fields[#fields + 1] = string.format('%d', until_)
  if until_ - now > need then need = until_ - now end
end

if #fields == 0 then return 0 end
local x, ttl = keep_alive(need, (h[1] or L1) ~= nil, idle_us, 0, now)
for i = 1, #fields, 2 do
  if fields[i] == 'T' then fields[i + 1] = string.gsub(fields[i + 1], '^(%d+ )0', '%1' .. string.format('%d', x)) end
end
redis.call('HSET', key, unpack(fields))
if ttl then expire_in(key, ttl) end
return 1

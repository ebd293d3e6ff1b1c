-- lib.lua: helpers shared by every throttle script. The Go side prepends this
-- file to each script body, so every script is still one self-contained EVAL.
--
-- Units: times are integer microseconds of Redis TIME; a tier is
-- {rate = tokens per period, per = period in microseconds, burst = capacity}.
--
-- Speed matters here: a decision runs once per task. Whole numbers (times)
-- are passed to redis.call as numbers, which Redis writes with full
-- precision (Lua's tostring would keep 14 digits); fractions go through fmt,
-- because the Lua of miniredis cannot read back forms like "1e-05". Field
-- names are built once, and expiries are refreshed only when they would
-- otherwise run short.

local MAX_TIERS = 4
local MAX_PER_MS = 30 * 24 * 3600 * 1000   -- 30 days
local MAX_RATE_PER_SEC = 1e6
local MAX_BURST = 1e9
local MAX_WAIT = 1e13                      -- us (~116 days): no honest wait is longer
local MAX_SKEW = 3600 * 1e6                -- a stored time further ahead of TIME is garbage
local MAX_TTL_MS = 1e13
local F_RATE = {'rate:1', 'rate:2', 'rate:3', 'rate:4'}
local F_PER = {'per_ms:1', 'per_ms:2', 'per_ms:3', 'per_ms:4'}
local F_BURST = {'burst:1', 'burst:2', 'burst:3', 'burst:4'}
local F_TK = {'tk:1', 'tk:2', 'tk:3', 'tk:4'}
local F_VT = {'vt:1', 'vt:2', 'vt:3', 'vt:4'}

-- (Arithmetic on a string converts it once; tonumber converts it twice, and
-- a conversion is one of the dearest steps here. Strings from TIME and from
-- the caller are trusted; stored ones go through tonumber, which survives
-- garbage.)
local function now_us()
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- fmt writes a number for a reply or an error message with full precision.
local function fmt(x)
  return string.format('%.17g', x)
end

-- expire_in sets a key's expiry to us microseconds from now, at least 1 ms
-- and at most MAX_TTL_MS, as a whole number of milliseconds.
local function expire_in(key, us)
  local ms = math.ceil(us / 1000)
  if ms < 1 then ms = 1 end
  if ms > MAX_TTL_MS then ms = MAX_TTL_MS end
  redis.call('PEXPIRE', key, ms)
end

-- finite returns a stored number, or nil when it is missing or not finite.
local function finite(raw)
  local v = tonumber(raw)
  if v == nil or v ~= v or v == math.huge or v == -math.huge then return nil end
  return v
end

-- stored_time reads a stored timestamp. Stored times may be ahead of TIME
-- after the clock stepped back; one implausibly far ahead is garbage.
local function stored_time(raw, now)
  local v = finite(raw)
  if v == nil or v > now + MAX_SKEW then return nil end
  return v
end

-- check_num validates one untrusted number. It returns the number, or nil and
-- the reason; the caller names the field.
local function check_num(raw, integer, min, max)
  if raw == nil or raw == false then return nil, 'missing' end
  local v = tonumber(raw)
  if v == nil then return nil, 'not a number' end
  if v ~= v then return nil, 'NaN' end
  if v == math.huge or v == -math.huge then return nil, 'infinite' end
  if integer and v ~= math.floor(v) then return nil, 'not an integer' end
  if v < min then return nil, 'below minimum ' .. fmt(min) end
  if v > max then return nil, 'above maximum ' .. fmt(max) end
  return v
end

-- parse_tiers reads tiers from a table of config fields. It returns the
-- tiers, or nil, field, reason.
local function parse_tiers(h)
  local n, why = check_num(h.tiers, true, 1, MAX_TIERS)
  if not n then return nil, 'tiers', why end
  local tiers = {}
  for i = 1, n do
    local rate, per, burst
    rate, why = check_num(h[F_RATE[i]], true, 1, 1e15)
    if not rate then return nil, F_RATE[i], why end
    per, why = check_num(h[F_PER[i]], true, 1, MAX_PER_MS)
    if not per then return nil, F_PER[i], why end
    if rate / per * 1000 > MAX_RATE_PER_SEC then
      return nil, F_RATE[i], 'above maximum ' .. fmt(MAX_RATE_PER_SEC) .. ' per second'
    end
    burst, why = check_num(h[F_BURST[i]], true, 1, MAX_BURST)
    if not burst then return nil, F_BURST[i], why end
    tiers[i] = {rate = rate, per = per * 1000, burst = burst, e = per * 1000 / rate}
  end
  return tiers
end

-- tiers_from_argv parses tiers sent by the caller starting at argv[first]: a
-- count, then rate, per_ms, burst triples. A count of 0 means none (nil).
local function tiers_from_argv(argv, first)
  local n = tonumber(argv[first]) or 0
  if n == 0 then return nil end
  local h = {tiers = argv[first]}
  for i = 1, math.min(n, MAX_TIERS) do
    local at = first + 1 + (i - 1) * 3
    h[F_RATE[i]], h[F_PER[i]], h[F_BURST[i]] = argv[at], argv[at + 1], argv[at + 2]
  end
  return parse_tiers(h)
end

-- read_hash returns a hash as a table of field -> value.
local function read_hash(key)
  local flat = redis.call('HGETALL', key)
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  return h, #flat > 0
end

-- load_tiers reads the config hash; when it is empty it falls back to the
-- defaults the caller sent in argv (see tiers_from_argv). It returns tiers
-- (nil when the key has no limits at all), or nil, field, reason.
local function load_tiers(cfg_key, argv, first)
  local h, found = read_hash(cfg_key)
  if found then return parse_tiers(h) end
  local tiers, field, why = tiers_from_argv(argv, first)
  if field then return nil, 'default ' .. field, why end
  return tiers
end

-- refill returns the tokens of every tier at now, computed on demand from the
-- stored state: tokens never exceed the (possibly lowered) burst, and elapsed
-- time is clamped at zero so a clock that steps back refills nothing.
local function refill(state, tiers, now)
  local ts = stored_time(state.ts, now)
  local elapsed = 0
  if ts and now > ts then elapsed = now - ts end
  local tokens = {}
  for i, t in ipairs(tiers) do
    local stored = finite(state[F_TK[i]])
    local v
    if stored == nil or ts == nil then
      v = t.burst
    else
      -- Tokens are never taken below zero; anything less is garbage.
      if stored < 0 then stored = 0 end
      v = stored + elapsed / t.e
    end
    if v > t.burst then v = t.burst end
    tokens[i] = v
  end
  return tokens
end

-- read_state returns the state hash with every value converted to a number
-- once (nil when it is not one), so the helpers that read a field again and
-- again pay for the conversion once.
local function read_state(state_key)
  local flat = redis.call('HGETALL', state_key)
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = tonumber(flat[i + 1]) end
  return h
end

-- wait_for returns how long (whole microseconds) until a tier has one
-- token; 0 when it has one now. SLACK absorbs float rounding in the refill
-- (about 1e-4 us even for a month-long period) and nothing more.
local SLACK = 1e-3   -- microseconds
local function wait_for(tokens, t)
  local need = (1 - tokens) * t.e
  if need <= SLACK then return 0 end
  return math.ceil(need - SLACK)
end

-- full_after returns how long (microseconds) until every tier is full again,
-- counted from now. A stored time ahead of now (the clock stepped back) holds
-- the refill back by that much.
local function full_after(state, tiers, tokens, now)
  local longest = 0
  for i, t in ipairs(tiers) do
    local need = (t.burst - tokens[i]) * t.e
    if need > longest then longest = need end
  end
  local ts = stored_time(state.ts, now)
  if ts and ts > now then longest = longest + (ts - now) end
  return longest
end

-- keep_alive makes sure state_key lives at least need microseconds more.
-- The expiry is written with room to spare (twice the need) and remembered
-- in the hash (field xp, us), so most calls need no PEXPIRE at all. fields is
-- the list of field/value pairs the caller is about to HSET; xp joins it.
local function keep_alive(state_key, state, need, now, fields)
  if need < 1e6 then need = 1e6 end
  -- Trust the memo only while the clock has not stepped back (a stored time
  -- ahead of now): expiries then are measured differently.
  local xp, ts = finite(state.xp), finite(state.ts)
  if xp and xp >= now + need and not (ts and ts > now) then return end
  local ttl = 2 * need
  if ttl > MAX_TTL_MS * 1000 then ttl = MAX_TTL_MS * 1000 end
  fields[#fields + 1] = 'xp'
  fields[#fields + 1] = now + ttl
  state.xp = now + ttl
  return ttl
end

-- write_tokens adds tokens and the time they were computed at to fields (an
-- HSET list). The stored time never moves backwards.
local function write_tokens(fields, state, tiers, tokens, now)
  local ts = stored_time(state.ts, now)
  if ts == nil or now > ts then ts = now end
  fields[#fields + 1] = 'ts'
  fields[#fields + 1] = ts
  for i = 1, #tiers do
    fields[#fields + 1] = F_TK[i]
    fields[#fields + 1] = fmt(tokens[i])
  end
end

-- drop_extra_tiers deletes stored tokens of tiers the limits no longer have.
local function drop_extra_tiers(state_key, state, tiers)
  for i = #tiers + 1, MAX_TIERS do
    if state[F_TK[i]] then redis.call('HDEL', state_key, F_TK[i]) end
  end
end

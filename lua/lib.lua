-- lib.lua: helpers shared by every throttle script. The Go side prepends this
-- file to each script body, so every script is still one self-contained EVAL.
--
-- Units: times are integer microseconds of Redis TIME; a tier is
-- {rate = tokens per period, per = period in microseconds, burst = capacity}.
-- Numbers are written back with %.17g because Lua's tostring keeps only 14
-- significant digits, which would make tokens drift.

local MAX_TIERS = 4
local MAX_PER_MS = 30 * 24 * 3600 * 1000   -- 30 days
local MAX_RATE_PER_SEC = 1e6
local MAX_BURST = 1e9
local MAX_WAIT = 1e13                      -- us (~116 days): no honest wait is longer
local MAX_SKEW = 3600 * 1e6                -- a stored time further ahead of TIME is garbage

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function fmt(x)
  return string.format('%.17g', x)
end

-- expire_in sets a key's expiry to us microseconds from now (at least 1 ms,
-- at most MAX_TTL_MS): every key written gets a TTL, in an integer form Redis
-- accepts (Lua would print a large number as 1e+15).
local MAX_TTL_MS = 1e13
local function expire_in(key, us)
  local ms = math.ceil(us / 1000)
  if ms < 1 then ms = 1 end
  if ms > MAX_TTL_MS then ms = MAX_TTL_MS end
  redis.call('PEXPIRE', key, string.format('%d', ms))
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

-- parse_tiers reads tiers from a flat field/value source. get(name) returns
-- the raw value of a field. It returns the tiers, or nil, field, reason.
local function parse_tiers(get)
  local n, why = check_num(get('tiers'), true, 1, MAX_TIERS)
  if not n then return nil, 'tiers', why end
  local tiers = {}
  for i = 1, n do
    local rate, per, burst
    rate, why = check_num(get('rate:' .. i), true, 1, 1e15)
    if not rate then return nil, 'rate:' .. i, why end
    per, why = check_num(get('per_ms:' .. i), true, 1, MAX_PER_MS)
    if not per then return nil, 'per_ms:' .. i, why end
    if rate / per * 1000 > MAX_RATE_PER_SEC then
      return nil, 'rate:' .. i, 'above maximum ' .. fmt(MAX_RATE_PER_SEC) .. ' per second'
    end
    burst, why = check_num(get('burst:' .. i), true, 1, MAX_BURST)
    if not burst then return nil, 'burst:' .. i, why end
    tiers[i] = {rate = rate, per = per * 1000, burst = burst}
  end
  return tiers
end

-- tiers_from_argv parses tiers sent by the caller starting at argv[first]: a
-- count, then rate, per_ms, burst triples. A count of 0 means none (nil).
local function tiers_from_argv(argv, first)
  local n = tonumber(argv[first]) or 0
  if n == 0 then return nil end
  local d = {tiers = argv[first]}
  for i = 1, n do
    local at = first + 1 + (i - 1) * 3
    d['rate:' .. i], d['per_ms:' .. i], d['burst:' .. i] = argv[at], argv[at + 1], argv[at + 2]
  end
  return parse_tiers(function(name) return d[name] end)
end

-- load_tiers reads the config hash; when it is empty it falls back to the
-- defaults the caller sent in argv (see tiers_from_argv). It returns tiers
-- (nil when the key has no limits at all), or nil, field, reason.
local function load_tiers(cfg_key, argv, first)
  local flat = redis.call('HGETALL', cfg_key)
  if #flat > 0 then
    local h = {}
    for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
    return parse_tiers(function(name) return h[name] end)
  end
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
    local stored = finite(state['tk:' .. i])
    local v
    if stored == nil or ts == nil then
      v = t.burst
    else
      -- Tokens are never taken below zero; anything less is garbage.
      if stored < 0 then stored = 0 end
      v = stored + elapsed * t.rate / t.per
    end
    if v > t.burst then v = t.burst end
    tokens[i] = v
  end
  return tokens
end

local function read_state(state_key)
  local flat = redis.call('HGETALL', state_key)
  local s = {}
  for i = 1, #flat, 2 do s[flat[i]] = flat[i + 1] end
  return s
end

-- wait_for returns how long (whole microseconds) until a tier has one
-- token; 0 when it has one now. SLACK absorbs float rounding in the refill
-- (about 1e-4 us even for a month-long period) and nothing more.
local SLACK = 1e-3   -- microseconds
local function wait_for(tokens, t)
  local need = (1 - tokens) * t.per / t.rate
  if need <= SLACK then return 0 end
  return math.ceil(need - SLACK)
end

-- full_after returns how long (microseconds) until every tier is full again,
-- counted from now. A stored time ahead of now (the clock stepped back) holds
-- the refill back by that much.
local function full_after(state, tiers, tokens, now)
  local longest = 0
  for i, t in ipairs(tiers) do
    local need = (t.burst - tokens[i]) * t.per / t.rate
    if need > longest then longest = need end
  end
  local ts = stored_time(state.ts, now)
  if ts and ts > now then longest = longest + (ts - now) end
  return longest
end

-- write_tokens stores tokens and the time they were computed at. The stored
-- time never moves backwards.
local function write_tokens(state_key, state, tiers, tokens, now)
  local ts = stored_time(state.ts, now)
  if ts == nil or now > ts then ts = now end
  local args = {'ts', fmt(ts)}
  for i = 1, #tiers do
    args[#args + 1] = 'tk:' .. i
    args[#args + 1] = fmt(tokens[i])
  end
  for i = #tiers + 1, MAX_TIERS do
    if state['tk:' .. i] then redis.call('HDEL', state_key, 'tk:' .. i) end
  end
  redis.call('HSET', state_key, unpack(args))
end

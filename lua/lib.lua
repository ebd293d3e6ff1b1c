-- lib.lua: helpers shared by every throttle script. Loaded once as part of a
-- Redis function library (FUNCTION LOAD), or prepended to each script body
-- for EVAL where functions are not available (Redis 6.2, miniredis, an ACL
-- without FUNCTION).
--
-- Storage (one limiter key, all under one hash tag):
--   KEYS hash <prefix>:{name}:b  fields
--     L  limits set in Redis: tiers separated by spaces, each
--        rate/per_ms/burst (a token bucket)
--     D  the default limits the buckets were last computed under, while the
--        key has no L (so that SetLimits from any process can carry them over)
--     T  bucket state: "ts per_ms:owed ...", one pair per tier that is not
--        full: as of ts (us of Redis TIME), the tier owes owed / per_us
--        tokens of its burst. owed is a whole number: a take adds per_us and
--        each microsecond refills rate, so the arithmetic is exact (a burst
--        taken at one instant leaves exactly burst - n tokens, whatever the
--        rate) and every value is written as an integer.
--     s  suspended until (us)
--     g  limits generation, bumped by every SetLimits
--     x  when the key expires (us), a memo that spares most PEXPIREs
--     q, a, V  the reservation schedule while a queue is outstanding: the
--        next free slot for callers without a reservation (us), the
--        schedule's anchor (us) and per_ms:virtual-tat pairs relative to it
--   <prefix>:{name}:r  sorted set of reservations: task ID scored by slot (us)
--
-- A tier is identified by its period (per_ms): a tier's state survives any
-- change of the limits that keeps its period, whatever its position.
--
-- Speed matters here: a decision runs once per task. Numbers are formatted
-- by string.format (Redis's own conversion of a Lua number argument is
-- slower), whole microseconds are written as integers, and fields are read
-- with one HMGET.

local MAX_TIERS = 4
local MAX_PER_MS = 30 * 24 * 3600 * 1000   -- 30 days
local MAX_RATE_PER_SEC = 1e6
local MAX_BURST = 1e9
local MAX_RATE = 1e15
local MAX_WAIT = 1e13                      -- us (~116 days): no honest wait is longer
local MAX_SKEW = 3600 * 1e6                -- us a stored time may run ahead of TIME
local MAX_TTL_MS = 1e13
local SLACK = 1e-3                         -- us of float rounding absorbed, and no more
local MAX_LIMITS_LEN = 256                 -- bytes of the L field: 4 tiers fit in 100

local function now_us()
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- fmt writes a number with full precision (fractions, error messages).
local function fmt(x)
  return string.format('%.17g', x)
end

-- finite returns a stored number, or nil when it is missing or not finite.
local function finite(raw)
  local v = tonumber(raw)
  if v == nil or v ~= v or v == math.huge or v == -math.huge then return nil end
  return v
end

-- expire_in sets a key's expiry to us microseconds from now, at least 1 ms
-- and at most MAX_TTL_MS, as a whole number of milliseconds.
local function expire_in(key, us)
  local ms = math.ceil(us / 1000)
  if ms < 1 then ms = 1 end
  if ms > MAX_TTL_MS then ms = MAX_TTL_MS end
  redis.call('PEXPIRE', key, ms)
end

-- Parsed limits are kept between calls of a function library (the config
-- string is the cache key, so a change of limits is a new entry); under
-- EVAL the table lives for one call. It is cleared when it grows large.
local parsed, n_parsed = {}, 0

-- parse_limits reads a limits string (the L field, or defaults from the
-- caller). It returns the tiers, or nil, field, reason. The string is
-- untrusted: anything but whole numbers in range is refused, naming the
-- tier and the field as the Go API does (limits[2].Rate).
local function parse_limits(s)
  local tiers = parsed[s]
  if tiers then return tiers end
  if #s > MAX_LIMITS_LEN then
    return nil, 'limits', 'longer than ' .. MAX_LIMITS_LEN .. ' bytes'
  end
  tiers = {}
  local n = 0
  for tok in string.gmatch(s, '%S+') do
    n = n + 1
    local f = 'limits[' .. (n - 1) .. ']'
    if n > MAX_TIERS then return nil, 'limits', 'more than ' .. MAX_TIERS .. ' tiers' end
    local r, p, b = string.match(tok, '^(%d+)/(%d+)/(%d+)$')
    if not r then
      local got = string.gsub(string.sub(tok, 1, 40), '[^%w%./%-%+]', '?')
      return nil, f, 'want rate/per_ms/burst in whole numbers, got "' .. got .. '"'
    end
    r, p, b = tonumber(r), tonumber(p), tonumber(b)
    if r < 1 then return nil, f .. '.Rate', 'below minimum 1' end
    if r > MAX_RATE then return nil, f .. '.Rate', 'above maximum ' .. fmt(MAX_RATE) end
    if p < 1 then return nil, f .. '.Per', 'below minimum 1 ms' end
    if p > MAX_PER_MS then return nil, f .. '.Per', 'above maximum ' .. fmt(MAX_PER_MS) .. ' ms' end
    if r / p * 1000 > MAX_RATE_PER_SEC then
      return nil, f .. '.Rate', 'above maximum ' .. fmt(MAX_RATE_PER_SEC) .. ' per second'
    end
    if b < 1 then return nil, f .. '.Burst', 'below minimum 1' end
    if b > MAX_BURST then return nil, f .. '.Burst', 'above maximum ' .. fmt(MAX_BURST) end
    for j = 1, n - 1 do
      if tiers[j].per == p then
        return nil, f .. '.Per', 'same period as limits[' .. (j - 1) .. '] (a tier is identified by its period)'
      end
    end
    -- key: the period as T and V spell it (string keys: a number key this
    -- large would make some Lua tables grow an array part to its size).
    tiers[n] = {rate = r, per = p, burst = b, e = p * 1000 / r, p = p * 1000, full = b * p * 1000,
                key = string.format('%d', p)}
  end
  if n == 0 then return nil, 'limits', 'no tiers' end
  if n_parsed >= 256 then parsed, n_parsed = {}, 0 end
  parsed[s] = tiers
  n_parsed = n_parsed + 1
  return tiers
end

-- read_pairs reads per_ms:value pairs (the T and V fields) into a table
-- keyed by per_ms as written (tier.key). Entries whose value is not a
-- number read as missing.
local function read_pairs(raw, pattern)
  local out = {}
  if raw then
    for p, v in string.gmatch(raw, pattern) do out[p] = tonumber(v) end
  end
  return out
end

-- bucket_owed returns, for each tier, what it owes of its burst at now, in
-- per_us units of tokens (0: full), from the stored T field. Time that passed
-- since T was written refills rate per microsecond; a clock that stepped back
-- makes a tier owe more, never less, so it refills nothing until the clock
-- is back where it was. A tier owing more than a whole burst beyond MAX_SKEW
-- (a step back of over an hour, or garbage) is taken as empty now: still no
-- refill, and no freeze for longer.
local function bucket_owed(T, tiers, now)
  local owed = {}
  local ts = T and string.match(T, '^(%d+) ')
  ts = ts and tonumber(ts)
  local stored = ts and read_pairs(T, ' (%d+):(%d+)') or {}
  local elapsed = ts and now - ts or 0
  for i, t in ipairs(tiers) do
    local v = stored[t.key]
    if v == nil then
      v = 0
    else
      v = v - elapsed * t.rate
      if v < 0 then
        v = 0
      elseif v > t.full + MAX_SKEW * t.rate then
        v = t.full
      end
    end
    owed[i] = v
  end
  return owed
end

-- tokens_at is what tier t holds when it owes owed.
local function tokens_at(t, owed)
  return t.burst - owed / t.p
end

-- wait_for returns how long (whole microseconds) until tier t, owing owed,
-- holds c tokens; 0 when it holds them now.
local function wait_for(t, owed, c)
  local need = owed - (t.burst - c) * t.p
  if need <= 0 then return 0 end
  return math.ceil(need / t.rate)
end

-- T_FMT formats the T field of 1 to 4 tiers in one call.
local T_FMT = {'%d %d:%d', '%d %d:%d %d:%d', '%d %d:%d %d:%d %d:%d', '%d %d:%d %d:%d %d:%d %d:%d'}

-- write_owed returns the T field for owed at now (false when every tier is
-- full), and how long (us) until every tier is full again.
local function write_owed(tiers, owed, now)
  local a, k, longest = {now}, 1, 0
  for i, t in ipairs(tiers) do
    local v = owed[i]
    if v > 0 then
      a[k + 1], a[k + 2] = t.per, v
      k = k + 2
      local full_in = v / t.rate
      if full_in > longest then longest = full_in end
    end
  end
  if k == 1 then return false, 0 end
  return string.format(T_FMT[(k - 1) / 2], unpack(a, 1, k)), math.ceil(longest)
end

-- keep_alive makes sure key lives at least need microseconds more (and, when
-- it holds limits, at least 7/8 of the idle expiry, renewed to the whole
-- expiry). The expiry is written with room to spare and remembered in the
-- x field, so most calls need no PEXPIRE. fields is the HSET list the caller
-- is about to write; x joins it. It returns the TTL to set (us), or nil.
local function keep_alive(need, has_limits, idle_us, x, now, fields)
  if need < 1e6 then need = 1e6 end
  local ttl = 2 * need
  if has_limits and idle_us > 0 then
    if need < idle_us * 7 / 8 then need = idle_us * 7 / 8 end
    if ttl < idle_us then ttl = idle_us end
  end
  x = finite(x)
  if x and x >= now + need and x <= now + MAX_TTL_MS * 1000 then return nil end
  if ttl > MAX_TTL_MS * 1000 then ttl = MAX_TTL_MS * 1000 end
  fields[#fields + 1] = 'x'
  fields[#fields + 1] = string.format('%d', now + ttl)
  return ttl
end

-- lib.lua: helpers shared by every throttle script. Loaded once as part of a
-- Redis function library (FUNCTION LOAD), or prepended to each script body
-- for EVAL where functions are not available (Redis 6.2, miniredis, an ACL
-- without FUNCTION).
--
-- Storage (one limiter key, all under one hash tag; TestStorageSpecNamesEveryField
-- checks that every hash field a script reads or writes is listed here):
--   <prefix>:{name}:b  hash, fields; it expires with its state (keep_alive)
--     L  the configured limits (SetLimits), the ceiling of the limits in
--        force (see O), a copy of :c's, space-separated items:
--          rate/per_ms/burst   a token bucket
--          wN/per_ms           a window: at most N calls in any per_ms
--          xN/per_ms           a fixed window: at most N calls in each
--                              per_ms aligned to the Unix epoch
--          fN                  in flight: at most N slots held at once
--          aP                  adaptive: P ms clean periods
--          #G                  the generation, bumped by every change
--     D  the default limits the buckets were last computed under, while the
--        key has no L (so that SetLimits from any process carries them over;
--        and the mark of a key without configured limits: see config_of)
--     O  what was learned below L: quotas a provider stated (observe.lua)
--        and the adaptive cut (suspend.lua); see read_O
--     T  bucket state, binary (read_T): ts, x, q, then per_ms and owed of
--        each token bucket that is not full: as of ts (us of Redis TIME)
--        the bucket owes owed / per_us tokens of its burst (a whole number
--        below 2^53: a take adds per_us x cost, each microsecond refills
--        rate, so the arithmetic is exact); x is when the key expires (us,
--        a memo that spares most PEXPIREs, 0 unknown); q is when the queue
--        of reservations ends: callers without a reservation wait for it
--        (0 none)
--     Ww<per_ms>  a window's state (window.lua): calls admitted per
--        sub-window, then the calls reserved per sub-window; Wx<per_ms> a
--        fixed window's, per aligned window
--     B  while a queue of reservations is outstanding: "anchor credit
--        mean", its V's anchor, the tokens refunds gave back that no
--        reservation was brought forward for yet, and the mean estimate
--        of the calls settled (adjust.lua's bring_forward)
--     A  the latest instant ahead a call was counted at (a paced holder):
--        refunds are counted as of then (adjust.lua)
--     AH on a key with units, while calls are counted at instants ahead:
--        "at,tier=owed,... ..." per such call, its instant (us) and what
--        each bucket of another unit was charged for it (its cost and the
--        refill a full bucket loses until then, in owed units), so that M
--        and refunds count what the calls made so far owed (read_AH)
--     s  suspended until (us)
--     P  a provider's near reset holding the buckets in debt beyond empty
--        (observe.lua; Resume clears it): "until id:owed ...", until when
--        (us), then per token bucket its id and the part of what it owes
--        that the provider imposed, not calls (read_P)
--     V  the reservation schedule of the token buckets while a queue is
--        outstanding, binary as T (read_V): its anchor (us), when lapsed
--        reservations were last swept (us), then per_ms and the virtual
--        time of each bucket
--     R  in flight: "avg_us n", the moving average of how long a slot was
--        held (over the last 20 releases)
--     FL the in-flight lanes while callers wait for a slot: when each of the
--        N slots is next expected free (us), waiters taking the earliest
--     M  on a key with units: what each bucket owed at least in each of a
--        few intervals of time, binary (read_M): per bucket its id and how
--        many intervals, then each interval's start (us) and least owed,
--        oldest first; lets a refund give back what cannot have been cut
--        by a full bucket (refund_room)
--     G  fair shares among tenants (fair.lua): the virtual clock, binary
--     Y  the last yield to a late task (fair.lua): "taskID@granule"
--     t:<tenant>  an active tenant's record, binary (fair.lua)
--     w:<tenant>  a tenant's weight (SetWeights), a copy of :c's
--     WL the tenants that have a weight, a name per line, a copy of :c's
--   <prefix>:{name}:c  hash without expiry, until Delete: the configuration,
--        L, w:<tenant> and WL as above (config_of)
--   <prefix>:{name}:r  sorted set of reservations: task ID scored by its
--        reserved instant (us)
--   <prefix>:{name}:a  sorted set of active tenants by finish tag (fair.lua)
--   <prefix>:{name}:t  sorted set of fair reservations' start tags by task
--        ID (fair.lua)
--   <prefix>:{name}:f  sorted set of slots held: "taskID@start_us.k" scored
--        by when the slot expires (us) unless its holder renews it (a worker
--        killed stops renewing)
--
-- A tier is identified by its kind and period: its state survives any
-- change of the limits that keeps them, whatever its position.
--
-- Speed matters here: a decision runs once per task. Numbers are formatted
-- by string.format (Redis's own conversion of a Lua number argument is
-- slower), whole microseconds are written as integers, parsed limits are
-- cached between calls of the function library, and the hash is read with
-- one HMGET on the common path.

local MAX_BURST, MAX_WAIT, MAX_SKEW, SLACK, WINDOW_SLICES, now_us
local fmt, finite, extend_to, parsed, n_parsed, parse_limits
local ADAPT_FLOOR, ADAPT_STEP, ADAPT_CUT, bump_gen, read_O, write_O
local adapt_ppm, tier_quota, learned_lowers, apply_learned, double_bytes, bytes_double
local bin_pack, bin_unpack, pick_codec, read_V, write_V, read_T
local bucket_owed, M_SLICE, keep_M, read_M, write_M, sample_M
local refund_room, refund_given, read_AH, write_AH, ahead_of, made_owed
local fair_rate, COSTS, COSTS_RENEW, cost_miss, cost_vec, cv
local cost_units, read_G, pack_G, read_tenant, pack_tenant, drop_fair
local read_P, write_P, debt_of, debt_through, tokens_at, wait_for
local full_in, write_T, slot_start, slot_avg, all_n, outlive
local keep_alive, set_ttl, config_of, restore_config, save_config, set_config
do
  local MAX_TIERS = 8
  local MAX_PER_MS = 30 * 24 * 3600 * 1000   -- 30 days
  local MAX_RATE_PER_SEC = 1e6
  MAX_BURST = 1e9
  local MAX_RATE = 1e15
  MAX_WAIT = 1e13                      -- us (~116 days): no honest wait is longer
  MAX_SKEW = 3600 * 1e6                -- us a stored time may run ahead of TIME
  local MAX_TTL_MS = 1e13
  local MAX_TIME = 2^53                       -- us: times are whole numbers below it
  SLACK = 1e-3                         -- us of float rounding absorbed, and no more
  local MAX_LIMITS_LEN = 640                 -- bytes of the L field: 8 tiers with units fit in 400
  WINDOW_SLICES = 20                   -- sub-windows per window: >= 95 % of its quota

  function now_us()
    local t = redis.call('TIME')
    return t[1] * 1000000 + t[2]
  end

  -- fmt writes a number with full precision (fractions, error messages).
  function fmt(x)
    return string.format('%.17g', x)
  end

  -- finite returns a stored number, or nil when it is missing or not finite.
  function finite(raw)
    local v = tonumber(raw)
    if v == nil or v ~= v or v == math.huge or v == -math.huge then return nil end
    return v
  end

  -- Lifetimes (issue 34). What a key holds lives as long as some path
  -- promised: a bucket until it is full again, a suspension until its end, a
  -- learned quota until it lapses, a reservation until it lapses, a slot
  -- until its holder stops renewing it. No path may shorten a lifetime that
  -- another path set: every expiry a script sets goes through extend_to (or
  -- keep_alive, for the key's hash), which only ever raises a key's TTL to
  -- what its caller needs, so what the key holds for other paths outlives
  -- the caller's own need. (TestEveryExpiryGoesThroughExtendTo holds every
  -- script to it.) Configuration never expires: see config_of.

  -- ttl_ms is a lifetime of us microseconds as PEXPIRE takes it: a whole
  -- number of milliseconds, at least 1 and at most MAX_TTL_MS.
  local function ttl_ms(us)
    local ms = math.ceil(us / 1000)
    if ms < 1 then ms = 1 end
    if ms > MAX_TTL_MS then ms = MAX_TTL_MS end
    return ms
  end

  -- extend_to makes key live at least us microseconds more, never less than
  -- it would have: its TTL is raised, never lowered (a key without a TTL
  -- gets one: only configuration is kept without; a missing key is left
  -- missing).
  function extend_to(key, us)
    local ms = ttl_ms(us)
    local pttl = redis.call('PTTL', key)
    if pttl == -2 or pttl >= ms then return end
    redis.call('PEXPIRE', key, ms)
  end

  -- Parsed limits are kept between calls of a function library (the limits
  -- string is the cache key, so a change of limits is a new entry); under
  -- EVAL the table lives for one call. It is cleared when it grows large.
  parsed, n_parsed = {}, 0

  -- A tier counts one unit: requests unless its token says another
  -- ("~tokens"). Its id in T and V is its period plus, for another unit, a
  -- number told by the unit's name times 2^32 (periods are below 2^32 ms):
  -- a request tier keeps the id it always had, and two tiers of one period
  -- in different units (500 RPM beside 30,000 TPM) are two buckets.
  local UNIT_ID = 4294967296

  -- unit_id returns the number a unit's name adds to its tiers' ids (0 for
  -- requests): a hash below 2^20, so that ids stay exact in a double.
  local function unit_id(unit)
    if not unit then return 0 end
    local h = 0
    for k = 1, #unit do h = (h * 31 + string.byte(unit, k)) % 1048573 end
    return (h + 1) * UNIT_ID
  end

  -- check_count validates one whole number of a limit.
  local function check_count(v, field, min, max, unit)
    if v < min then return field, 'below minimum ' .. fmt(min) .. unit end
    if v > max then return field, 'above maximum ' .. fmt(max) .. unit end
  end

  -- unit_shortcuts returns, for tiers, m1: the tier of the key's one bucket
  -- of another unit than requests, when it has exactly one (its M is read
  -- without a table, decide_run); and upat1: when every tier of another unit
  -- counts the same one, the common cost argument of that unit,
  -- "n,unit=m", anchored (cost_vec).
  local function unit_shortcuts(tiers)
    local m1, nm = nil, 0
    local upat1, u1 = nil, nil
    for i = 1, #tiers do
      local t = tiers[i]
      if t.kind == 'b' and t.unit then m1, nm = i, nm + 1 end
      local u = t.unit
      if u then
        if u1 and u ~= u1 then upat1 = false end
        u1 = u
      end
    end
    if nm ~= 1 then m1 = nil end
    if u1 and upat1 == nil then upat1 = '^(%d+),' .. string.gsub(u1, '%-', '%%-') .. '=(%d+)$' end
    return m1, upat1 or nil
  end

  -- parse_limits reads a limits string (the L field, or defaults from the
  -- caller). It returns the spec ({tiers, gen, windows}), or nil, field,
  -- reason. The string is untrusted: anything but whole numbers in range is
  -- refused, naming the tier and the field as the Go API does
  -- (limits[2].Rate).
  function parse_limits(s)
    local spec = parsed[s]
    if spec then return spec end
    if #s > MAX_LIMITS_LEN then
      return nil, 'limits', 'longer than ' .. MAX_LIMITS_LEN .. ' bytes'
    end
    local tiers, n, gen, windows, inflight, adaptive, units = {}, 0, 0, false, nil, nil, false
    for tok in string.gmatch(s, '%S+') do
      local c = string.sub(tok, 1, 1)
      local unit = nil
      local u0 = string.find(tok, '~', 1, true)
      if u0 and c ~= '#' and c ~= 'a' and c ~= 'f' then
        unit = string.sub(tok, u0 + 1)
        tok = string.sub(tok, 1, u0 - 1)
        if not string.match(unit, '^[a-z][a-z0-9_%-]*$') or #unit > 32 or unit == 'requests' then
          local got = string.gsub(string.sub(unit, 1, 40), '[^%w%-_]', '?')
          return nil, 'limits[' .. n .. '].Unit', 'want a unit of a-z, 0-9, _ or - (at most 32, not "requests": the default), got "' .. got .. '"'
        end
        units = true
      end
      if c == '#' then
        local g = string.match(tok, '^#(%d+)$')
        gen = tonumber(g) or 0
        if gen > 1e15 then gen = 0 end
      elseif c == 'a' and string.match(tok, '^a%d+$') then
        if adaptive then return nil, 'limits', 'more than one adaptive limit' end
        local e = tonumber(string.sub(tok, 2))
        local bad, why = check_count(e, 'limits.Adaptive', 1000, MAX_PER_MS, ' ms')
        if bad then return nil, bad, why end
        adaptive = e * 1000
      elseif c == 'f' and string.match(tok, '^f%d+$') then
        local q = string.match(tok, '^f(%d+)$')
        if inflight then return nil, 'limits', 'more than one in-flight limit' end
        q = tonumber(q)
        local bad, why = check_count(q, 'limits.InFlight', 1, 1e6, '')
        if bad then return nil, bad, why end
        inflight = q
      else
        n = n + 1
        local f = 'limits[' .. (n - 1) .. ']'
        if n > MAX_TIERS then return nil, 'limits', 'more than ' .. MAX_TIERS .. ' tiers' end
        local t
        if c == 'w' or c == 'x' then
          local q, p = string.match(tok, '^[wx](%d+)/(%d+)$')
          if not q then
            local got = string.gsub(string.sub(tok, 1, 40), '[^%w%./%-%+]', '?')
            return nil, f, 'want ' .. c .. 'N/per_ms in whole numbers, got "' .. got .. '"'
          end
          q, p = tonumber(q), tonumber(p)
          local bad, why = check_count(q, f .. '.N', 1, MAX_BURST, '')
          if not bad then bad, why = check_count(p, f .. '.Per', 1, MAX_PER_MS, ' ms') end
          if bad then return nil, bad, why end
          if q / p * 1000 > MAX_RATE_PER_SEC then
            return nil, f .. '.N', 'above maximum ' .. fmt(MAX_RATE_PER_SEC) .. ' per second'
          end
          -- A fixed window (x) counts per aligned window: one slice of per.
          local slices = WINDOW_SLICES
          if c == 'x' then slices = 1 end
          t = {kind = 'w', fixed = c == 'x', n = q, per = p, p = p * 1000, sub = p * 1000 / slices,
               key = c .. string.format('%d', p)}
          windows = true
        else
          local r, p, b = string.match(tok, '^(%d+)/(%d+)/(%d+)$')
          if not r then
            local got = string.gsub(string.sub(tok, 1, 40), '[^%w%./%-%+]', '?')
            return nil, f, 'want rate/per_ms/burst in whole numbers, got "' .. got .. '"'
          end
          r, p, b = tonumber(r), tonumber(p), tonumber(b)
          local bad, why = check_count(r, f .. '.N', 1, MAX_RATE, '')
          if not bad then bad, why = check_count(p, f .. '.Per', 1, MAX_PER_MS, ' ms') end
          if not bad and r / p * 1000 > MAX_RATE_PER_SEC then
            bad, why = f .. '.N', 'above maximum ' .. fmt(MAX_RATE_PER_SEC) .. ' per second'
          end
          if not bad then bad, why = check_count(b, f .. '.Burst', 1, MAX_BURST, '') end
          if bad then return nil, bad, why end
          -- key: the period as T and V spell it (string keys: a number key
          -- this large would make some Lua tables grow an array part to it).
          t = {kind = 'b', rate = r, per = p, burst = b, e = p * 1000 / r, p = p * 1000,
               full = b * p * 1000, key = string.format('%d', p)}
        end
        t.unit, t.id = unit, t.per + unit_id(unit)
        if unit then
          t.key = t.key .. '~' .. unit
          t.upat = ',' .. string.gsub(unit, '%-', '%%-') .. '=(%d+)'
        end
        for j = 1, n - 1 do
          if tiers[j].key == t.key then
            return nil, f .. '.Per', 'same period and unit as limits[' .. (j - 1) .. '] (a tier is identified by its kind, period and unit)'
          elseif t.kind == 'b' and tiers[j].kind == 'b' and tiers[j].id == t.id then
            return nil, f .. '.Unit', 'its unit and limits[' .. (j - 1) .. ']\'s hash alike: rename one'
          end
        end
        tiers[n] = t
      end
    end
    if n == 0 and not inflight then return nil, 'limits', 'no tiers' end
    if adaptive and n == 0 then return nil, 'limits.Adaptive', 'needs a rate tier to adapt' end
    local m1, upat1 = unit_shortcuts(tiers)
    spec = {tiers = tiers, gen = gen, windows = windows, inflight = inflight, adaptive = adaptive, units = units,
            m1 = m1, upat1 = upat1}
    -- (cost_vec's cache: cost vectors by the caller's cost argument, their
    -- number at [0], cost_miss's count at [-1])
    if units then spec.costs = {[0] = 0, [-1] = 0} end
    if n_parsed >= 256 then parsed, n_parsed = {}, 0 end
    parsed[s] = spec
    n_parsed = n_parsed + 1
    return spec
  end

  -- Learned limits: the O field, written by observe.lua (what providers'
  -- responses say) and suspend.lua (adaptive mode), below the limits of L,
  -- which stay the ceiling. Tokens, space separated:
  --   t<tier key>=<n>@<until_us>  the provider's quota for the tier's period,
  --                                in force until then (refreshed while the
  --                                provider keeps saying it)
  --   t<tier key>=<n>/<b>@<until>  the same with the burst its bucket holds
  --                                (what an LLM provider's reset tells: a
  --                                per-minute quota enforced per second)
  --   a<ppm>@<since_us>           adaptive: the rate tiers at ppm (per
  --                                million) of the ceiling since then, plus
  --                                ADAPT_STEP for every clean interval after
  ADAPT_FLOOR = 15625     -- ppm: 1/64 of the ceiling at the lowest
  ADAPT_STEP = 100000     -- ppm won back per clean interval (10 %)
  ADAPT_CUT = 0.5         -- each new suspension halves the rate

  -- bump_gen returns the limits string L with its generation one higher:
  -- what processes holding leases see as a change of limits.
  function bump_gen(L)
    local g = tonumber(string.match(L, '#(%d+)') or '0') or 0
    if g >= 1e15 then g = 0 end
    local s = string.gsub(L, '%s*#%d+', '')
    return s .. ' #' .. string.format('%d', g + 1)
  end

  -- read_O splits the O field: the learned quotas by tier key ({n, until,
  -- burst or nil}) and the adaptive state ({ppm, since}) or nil.
  function read_O(O)
    local learned, adapt = {}, nil
    if not O then return learned, nil end
    for tok in string.gmatch(O, '%S+') do
      local k, q, b, u = string.match(tok, '^t([wx]?%d+~?[%w_%-]*)=(%d+)/?(%d*)@(%d+)$')
      if k then
        learned[k] = {tonumber(q), tonumber(u), tonumber(b)}
      else
        local ppm, since = string.match(tok, '^a(%d+)@(%d+)$')
        if ppm then adapt = {tonumber(ppm), tonumber(since)} end
      end
    end
    return learned, adapt
  end

  -- write_O formats the O field (false when nothing is learned).
  function write_O(learned, adapt, now)
    local out = {}
    for k, l in pairs(learned) do
      if l[2] > now and l[3] then
        out[#out + 1] = string.format('t%s=%d/%d@%d', k, l[1], l[3], l[2])
      elseif l[2] > now then
        out[#out + 1] = string.format('t%s=%d@%d', k, l[1], l[2])
      end
    end
    table.sort(out)
    if adapt and adapt[1] < 1e6 then out[#out + 1] = string.format('a%d@%d', adapt[1], adapt[2]) end
    if #out == 0 then return false end
    return table.concat(out, ' ')
  end

  -- adapt_ppm is the adaptive factor in force at now (1e6: the ceiling).
  function adapt_ppm(spec, adapt, now)
    if not adapt or not spec.adaptive then return 1e6 end
    local ppm = adapt[1]
    if now > adapt[2] then ppm = ppm + ADAPT_STEP * math.floor((now - adapt[2]) / spec.adaptive) end
    if ppm > 1e6 then ppm = 1e6 end
    return ppm
  end

  -- tier_quota is what a tier allows per period: a bucket's rate, a
  -- window's N.
  function tier_quota(t)
    if t.kind == 'b' then return t.rate end
    return t.n
  end

  -- with_quota returns a copy of tier t allowing q per period (a bucket's
  -- burst is lowered with it, and to lb when given, never raised).
  local function with_quota(t, q, lb)
    if t.kind == 'b' then
      local b = math.min(t.burst, q, lb or q)
      return {kind = 'b', rate = q, per = t.per, burst = b, e = t.p / q, p = t.p,
              full = b * t.p, key = t.key, unit = t.unit, upat = t.upat, id = t.id, ceiling = t}
    end
    return {kind = 'w', fixed = t.fixed, n = q, per = t.per, p = t.p, sub = t.sub, key = t.key,
            unit = t.unit, upat = t.upat, id = t.id, ceiling = t}
  end

  -- learned_lowers reports whether learned entry l lowers tier t at now:
  -- its quota below the tier's, or (a bucket) its burst below the tier's.
  function learned_lowers(l, t, now)
    if not l or l[2] <= now then return false end
    return l[1] < tier_quota(t) or (l[3] ~= nil and t.kind == 'b' and l[3] < t.burst)
  end

  -- apply_learned returns the limits in force at now: spec (parsed from src)
  -- with the learned quotas (and bursts) of O below it. It is spec itself
  -- when nothing learned is in force; otherwise a copy, cached like
  -- parse_limits.
  function apply_learned(spec, src, O, now)
    local learned, adapt = read_O(O)
    local ppm = adapt_ppm(spec, adapt, now)
    local sig, any = {src, '|', ppm}, ppm < 1e6
    for _, t in ipairs(spec.tiers) do
      local l = learned[t.key]
      if learned_lowers(l, t, now) then
        sig[#sig + 1] = ' ' .. t.key .. '=' .. l[1] .. '/' .. (l[3] or '')
        any = true
      end
    end
    if not any then return spec end
    local k = table.concat(sig)
    local eff = parsed[k]
    if eff then return eff end
    eff = {tiers = {}, gen = spec.gen, windows = spec.windows, inflight = spec.inflight,
           adaptive = spec.adaptive, units = spec.units, costs = spec.costs, m1 = spec.m1, upat1 = spec.upat1, ppm = ppm}
    for i, t in ipairs(spec.tiers) do
      local q, lb = tier_quota(t), nil
      local l = learned[t.key]
      if l and l[2] > now and l[1] < q then q = l[1] end
      if learned_lowers(l, t, now) and l[3] and t.kind == 'b' and l[3] < t.burst then lb = l[3] end
      if ppm < 1e6 then q = math.floor(q * ppm / 1e6) end
      if q < 1 then q = 1 end
      if q == tier_quota(t) and not lb then eff.tiers[i] = t else eff.tiers[i] = with_quota(t, q, lb) end
    end
    if n_parsed >= 256 then parsed, n_parsed = {}, 0 end
    parsed[k] = eff
    n_parsed = n_parsed + 1
    return eff
  end

  -- The T field is binary: IEEE 754 doubles of 8 bytes, little-endian
  -- (struct's '<d'): ts, x, q, then per_ms and owed of each bucket that owes.
  -- As text, it cost a lone decision 17k of its 93k instructions in pattern
  -- matching, number parsing and formatting (bench/callgrind.sh), and %d
  -- could not write an owed above 2^63 (a bucket of millions of calls per 30
  -- days), which read back as a full bucket. Redis has the struct library;
  -- miniredis has not, and gets the codec below, which writes and reads the
  -- same bytes (TestTheTwoCodecsOfTWriteTheSameBytes holds it to Redis's).

  -- double_bytes writes x as struct.pack('<d', x) does (a NaN is never
  -- written: its bits are not portable).
  function double_bytes(x)
    local sign = 0
    if x < 0 or (x == 0 and 1 / x < 0) then sign, x = 128, -x end
    local e, m -- the biased exponent, and the 52 bits of the mantissa as a whole number
    if x == math.huge then
      e, m = 2047, 0
    elseif x == 0 then
      e, m = 0, 0
    else
      local f, ex = math.frexp(x) -- x = f * 2^ex, 0.5 <= f < 1
      e = ex + 1022
      if e <= 0 then -- subnormal: x = m * 2^-1074
        e, m = 0, math.ldexp(f, ex + 1074)
      else
        m = (f * 2 - 1) * 4503599627370496 -- 2^52: exact
      end
    end
    local b1 = m % 256; m = (m - b1) / 256
    local b2 = m % 256; m = (m - b2) / 256
    local b3 = m % 256; m = (m - b3) / 256
    local b4 = m % 256; m = (m - b4) / 256
    local b5 = m % 256; m = (m - b5) / 256
    local b6 = m % 256; m = (m - b6) / 256
    return string.char(b1, b2, b3, b4, b5, b6, m + (e % 16) * 16, (e - e % 16) / 16 + sign)
  end

  -- bytes_double reads the double at pos of s, as struct.unpack('<d') does.
  function bytes_double(s, pos)
    local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(s, pos, pos + 7)
    local sign = 1
    if b8 >= 128 then sign, b8 = -1, b8 - 128 end
    local e = b8 * 16 + (b7 - b7 % 16) / 16
    local m = ((((((b7 % 16) * 256 + b6) * 256 + b5) * 256 + b4) * 256 + b3) * 256 + b2) * 256 + b1
    if e == 2047 then
      if m == 0 then return sign * math.huge end
      return 0 / 0
    elseif e == 0 then
      return sign * math.ldexp(m, -1074)
    end
    return sign * math.ldexp(m + 4503599627370496, e - 1075)
  end

  -- bin_pack and bin_unpack are struct.pack and struct.unpack, or on
  -- miniredis the same for formats of '<' and 'd's only: bin_unpack(fmt, s,
  -- pos) returns the numbers, then the position after them. They are picked
  -- on first use (pick_codec): a function library cannot see struct, nor
  -- rawget, while it loads.
  bin_pack, bin_unpack = nil, nil

  local function lua_pack(fmt, ...)
    local out = {}
    for i = 1, select('#', ...) do out[i] = double_bytes((select(i, ...))) end
    return table.concat(out)
  end

  local function lua_unpack(fmt, s, pos)
    pos = pos or 1
    local out, n = {}, #fmt - 1
    for i = 1, n do
      out[i] = bytes_double(s, pos)
      pos = pos + 8
    end
    out[n + 1] = pos
    return unpack(out, 1, n + 1)
  end

  function pick_codec()
    local lib = rawget(_G, 'struct') -- (a missing global read plainly is an error)
    if lib then
      bin_pack, bin_unpack = lib.pack, lib.unpack
    else
      bin_pack, bin_unpack = lua_pack, lua_unpack
    end
  end

  -- read_V reads the V field (binary, as T: doubles va, sw, then per_ms and
  -- the virtual time of each bucket): the queue's anchor, when lapsed
  -- reservations were last swept, and each bucket's virtual time by minus
  -- its period; nil when there is no field or it is of another shape.
  function read_V(V)
    if not bin_pack then pick_codec() end
    if not V or #V < 16 or (#V - 16) % 16 ~= 0 then return nil end
    local va, sw, pos = bin_unpack('<dd', V)
    if not (va >= 0 and va < MAX_TIME and va == math.floor(va)) then return nil end
    if not (sw >= 0 and sw < MAX_TIME) then sw = 0 end
    local vt = {}
    while pos < #V do
      local per, v
      per, v, pos = bin_unpack('<dd', V, pos)
      if per == per and v == v and v > -math.huge and v < math.huge then vt[-per] = v end
    end
    return va, sw, vt
  end

  -- write_V writes the V field: anchor va, last sweep sw, and the virtual
  -- time vt[i] of each token bucket of tiers.
  function write_V(va, sw, tiers, vt)
    local a = {va, sw}
    for i = 1, #tiers do
      if tiers[i].kind == 'b' then
        a[#a + 1], a[#a + 2] = tiers[i].id, vt[i]
      end
    end
    return bin_pack('<' .. string.rep('d', #a), unpack(a))
  end

  -- read_T splits the T field: ts, x (the key's expiry, a memo that spares
  -- most PEXPIREs; 0 unknown), q (when the queue of reservations ends; 0
  -- none) and what each bucket that owes owed, by minus its period (into, a
  -- table, when given, is filled instead of a new one, after it is cleared of
  -- what it held). A field of another length, or with a time that is not a
  -- whole number, reads as empty. The memo x is not trusted after the clock
  -- stepped back (ts after now): the key's expiry may not have followed the
  -- clock.
  function read_T(T, now, into)
    if not bin_pack then pick_codec() end
    local stored = into or {}
    for k in pairs(stored) do stored[k] = nil end
    if not T or #T < 24 or (#T - 24) % 16 ~= 0 then return nil, 0, 0, stored end
    -- (one or two buckets owing, the common cases, in one unpack)
    local len, ts, x, q, pos, p1, o1, p2, o2 = #T
    if len == 40 then
      ts, x, q, p1, o1, pos = bin_unpack('<ddddd', T)
    elseif len == 56 then
      ts, x, q, p1, o1, p2, o2, pos = bin_unpack('<ddddddd', T)
    else
      ts, x, q, pos = bin_unpack('<ddd', T)
    end
    if not (ts >= 0 and ts < MAX_TIME and ts == math.floor(ts)) then return nil, 0, 0, stored end
    if not (x > 0 and x < MAX_TIME and ts <= now) then x = 0 end
    if q ~= -1 and not (q >= 0 and q < MAX_TIME) then q = 0 end -- (-1: tenants are active, fair.lua)
    if p1 and p1 == p1 and o1 == o1 and o1 ~= math.huge then stored[-p1] = o1 end
    if p2 and p2 == p2 and o2 == o2 and o2 ~= math.huge then stored[-p2] = o2 end
    while pos < len do
      local per, owed
      per, owed, pos = bin_unpack('<dd', T, pos)
      if per == per and owed == owed and owed ~= math.huge then stored[-per] = owed end
    end
    return ts, x, q, stored
  end

  -- bucket_owed returns what each token bucket owes of its burst at now, in
  -- per_us units of tokens (0: full; windows get 0), from what T stored at
  -- ts (read_T). Time since refills rate per microsecond; a clock that
  -- stepped back makes a tier owe more, never less, so it refills nothing
  -- until the clock is back where it was. After a step back of over an hour
  -- (MAX_SKEW), a tier is taken as empty now, or as what it owed if that is
  -- more: still no refill, and no freeze for longer. What a tier owes beyond
  -- its burst is debt a surcharge left (Used above the estimate), kept until
  -- it is repaid however long that takes; only more than MAX_BURST calls of
  -- debt is garbage, read as an empty tier. A full bucket
  -- reads as owing down to -headroom x rate (it has been full for that
  -- long): headroom is what a caller keeps room for, and a bucket full for
  -- longer has that room. Whoever takes from it adds to max(owed, 0). The
  -- table into, when given, is filled instead of a new one (entries past
  -- the tiers are left as they are).
  function bucket_owed(stored, ts, tiers, now, headroom, into)
    local owed = into or {}
    local elapsed = ts and now - ts or 0
    for i = 1, #tiers do
      local t, v = tiers[i], 0
      if t.kind == 'b' then
        local floor = -headroom * t.rate
        v = stored[-t.id]
        if not v then
          v = floor
        elseif v > t.full + MAX_BURST * t.p then
          v = t.full -- (garbage)
        elseif elapsed < -MAX_SKEW then
          v = math.max(v, t.full)
        else
          v = v - elapsed * t.rate
          if v < floor then v = floor end
        end
      end
      owed[i] = v
    end
    return owed
  end

  -- Refunds on a key with units (M). A refund of a call admitted at at may
  -- give back what the bucket would hold now had the call cost less, and no
  -- more: that is the refund itself, unless the bucket, holding the refund
  -- more at some instant since at, would have been over its burst (and lost
  -- the refill). It was not when the bucket owed at least the refund all the
  -- time since at. M keeps, per bucket, the least it owed in each of a few
  -- intervals of time (the latest open), from samples taken at every change
  -- of what it owes (a decision that takes, a settlement): the least over
  -- the intervals from the one holding at to now bounds the refund. A
  -- refund given makes every interval from the one holding its call's
  -- instant on owe that much less (had the call cost less, the bucket would
  -- have owed less since it); the intervals before are left as they were,
  -- so that the refunds of calls that ended long ago do not eat the room of
  -- the calls after them. A decision opens a new interval once the latest
  -- is M_SLICE old (samples closer in time share one, so that most
  -- decisions write nothing), and at most M_SLICES are kept: the two
  -- neighbours whose union is shortest for its age become one (the older
  -- an interval, the longer it may be: a call's room counts its interval
  -- from its start). An interval that ended over M_KEEP ago is dropped.
  -- M is kept for the buckets of another unit than requests (tokens: what
  -- calls estimate and settle); without it (a request bucket, a call older
  -- than every interval) a bucket gives back only what has not refilled
  -- since the call.
  local M_KEEP = 60e6    -- us: calls up to a minute long find their interval
  M_SLICE = 50000  -- us: the least age of the latest interval before another opens
  local M_SLICES = 12    -- intervals per bucket at most

  -- keep_M is the least lifetime (us) of a hash that holds intervals in M:
  -- M_KEEP, so that a call settled (Used) after its buckets refilled still
  -- finds the interval it was taken in, and gives back no more than what
  -- the bucket has not refilled since.
  function keep_M(M, need)
    if M and next(M) ~= nil and need < M_KEEP then return M_KEEP end
    return need
  end

  -- read_M reads the M field: per bucket tier index, the flat list {start,
  -- least, start, least, ...} of its intervals, oldest first (starts in us,
  -- increasing; least in owed units, math.huge: no sample yet). It also
  -- returns whether the field holds exactly the records read, so that
  -- write_M would write it unchanged while no record changes. into, when
  -- given, is filled instead of a new table, with records of M_POOL (a
  -- decision keeps them for the run only): a run that reads M and writes it
  -- back allocates little for it.
  local M_POOL = {}
  function read_M(raw, tiers, into)
    local out, n = into or {}, #tiers
    if into then
      for i = 1, n do out[i] = nil end
    end
    if not raw or #raw == 0 or #raw % 16 ~= 0 then return out, raw == '' end
    if not bin_pack then pick_codec() end
    -- (written in the order of the tiers: a bucket whose record is not next,
    -- new or of other limits, starts afresh)
    local pos, len, all = 1, #raw, true
    for i = 1, n do
      local t = tiers[i]
      if t.kind == 'b' and t.unit then
        local found = false
        if pos < len then
          local id, k, npos = bin_unpack('<dd', raw, pos)
          if id == t.id and k >= 1 and k <= M_SLICES and k == math.floor(k) and npos + 16 * k <= len + 1 then
            local m
            if into then
              m = M_POOL[i]
              if not m then
                m = {}
                M_POOL[i] = m
              end
              for j = #m, 1, -1 do m[j] = nil end
            else
              m = {}
            end
            local ok, last = true, -1
            for j = 1, k do
              local st, w
              st, w, npos = bin_unpack('<dd', raw, npos)
              if not (st > last and st < MAX_TIME and w == w and w >= 0) then ok = false end
              m[2 * j - 1], m[2 * j], last = st, w, st
            end
            if ok then out[i], pos, found = m, npos, true end
          end
        end
        if not found then all = false end
      end
    end
    return out, all and pos == len + 1
  end

  -- write_M writes the M field of tiers.
  function write_M(M, tiers)
    if not bin_pack then pick_codec() end
    local parts = {}
    for i = 1, #tiers do
      local t, m = tiers[i], M[i]
      if m and t.kind == 'b' and t.unit then
        parts[#parts + 1] = bin_pack('<' .. string.rep('d', 2 + #m), t.id, #m / 2, unpack(m))
      end
    end
    return table.concat(parts)
  end

  -- sample_M records what bucket i owes at now (owed, before any change at
  -- now) in M, in the latest interval; a decision (open) then opens another
  -- interval, at now, when the latest is M_SLICE old, drops those that ended
  -- M_KEEP ago and merges two if there are more than M_SLICES (a bucket
  -- without M starts it now: calls before now find no interval). It returns
  -- whether the record changed.
  function sample_M(M, i, v, now, open)
    if v < 0 then v = 0 end
    local m = M[i]
    if not m then
      M[i] = {now, math.huge}
      return true
    end
    local n2, changed = #m, false
    if v < m[n2] then m[n2], changed = v, true end
    if not open or now - m[n2 - 1] < M_SLICE then return changed end
    -- (the sample opens the new interval too, as one a little later would
    -- go in it: its least is at most what the bucket owed before the run)
    m[n2 + 1], m[n2 + 2] = now, v
    while #m >= 4 and m[3] <= now - M_KEEP do
      table.remove(m, 1)
      table.remove(m, 1)
    end
    if #m > 2 * M_SLICES then
      -- The two neighbours whose union is shortest for its age (its start's
      -- distance from now) become one, the least of both.
      local best, at = math.huge, 1
      for j = 1, #m - 3, 2 do
        local ends = m[j + 4] or now
        local r = (ends - m[j]) / (now - m[j])
        if r < best then best, at = r, j end
      end
      if m[at + 3] < m[at + 1] then m[at + 1] = m[at + 3] end
      table.remove(m, at + 2)
      table.remove(m, at + 2)
    end
    return true
  end

  -- refund_room is what bucket i may give back of a call admitted at at
  -- beyond the rule without M: the least it owed in the intervals from the
  -- one holding at to now, and now.
  function refund_room(M, i, at, owed_now)
    local m = M[i]
    if not m or at < m[1] then return 0 end
    local least = owed_now
    for j = #m - 1, 1, -2 do
      if m[j + 1] < least then least = m[j + 1] end
      if m[j] <= at then break end
    end
    return math.max(0, least)
  end

  -- refund_given lowers, in bucket i's intervals from the one holding at to
  -- now, the least owed by given, which a refund of a call admitted at at
  -- gave back, and records what the bucket owes after it (owed_now) in the
  -- latest.
  function refund_given(M, i, at, given, owed_now)
    local m = M[i]
    if not m then return end
    if given > 0 then
      for j = #m - 1, 1, -2 do
        local w = m[j + 1]
        if w ~= math.huge then m[j + 1] = math.max(0, w - given) end
        if m[j] <= at then break end
      end
    end
    if owed_now < m[#m] then m[#m] = math.max(0, owed_now) end
  end

  -- Calls counted ahead (AH). A paced holder admitted before its instant is
  -- counted at it (decide.lua's admit): every bucket owes as of now what it
  -- will take then, and the refill it would lose, full, until then. The
  -- calls made so far owed that much less until the instant. M's samples,
  -- and the room a refund may take, are of those calls: counted from the
  -- buckets as they are, a refund of a call made after a holder was
  -- admitted found room in the holder's cost while the bucket was in fact
  -- full before the holder's instant, and the refund, lost to that full
  -- bucket, stayed in the buckets after it: a call admitted beyond what they
  -- held had the call cost less (bench L6's lone 429 after learning).

  -- read_AH reads the AH field: the calls counted at instants after now,
  -- each {at = instant, [tier key] = owed units}, sorted by instant. It also
  -- returns whether any entry was dropped (its instant has come).
  function read_AH(raw, now)
    local out, dropped = {}, false
    if not raw or raw == '' then return out, false end
    for tok in string.gmatch(raw, '%S+') do
      local at = tonumber(string.match(tok, '^(%d+)'))
      if at and at > now and at < MAX_TIME then
        local e = {at = at}
        for k, v in string.gmatch(tok, ',([^=,]+)=([^,]+)') do
          local a = tonumber(v)
          if a and a == a and a > 0 and a < math.huge then e[k] = a end
        end
        out[#out + 1] = e
      else
        dropped = true
      end
    end
    table.sort(out, function(a, b) return a.at < b.at end)
    return out, dropped
  end

  -- write_AH writes the AH field (false: nothing is counted ahead).
  function write_AH(AH)
    if #AH == 0 then return false end
    local parts = {}
    for _, e in ipairs(AH) do
      local s = string.format('%d', e.at)
      for k, v in pairs(e) do
        if k ~= 'at' then s = s .. ',' .. k .. '=' .. fmt(v) end
      end
      parts[#parts + 1] = s
    end
    return table.concat(parts, ' ')
  end

  -- ahead_of is what token bucket t owes for the calls of AH counted at
  -- instants after from.
  function ahead_of(AH, t, from)
    local sum = 0
    for j = #AH, 1, -1 do
      local e = AH[j]
      if e.at <= from then break end
      sum = sum + (e[t.key] or 0)
    end
    return sum
  end

  -- made_owed is what token bucket t, owing owed at now, owes at least from
  -- now on for the calls made so far, until the last instant of AH: now, and
  -- just before each instant of AH (the bucket refills until then, and then
  -- takes what the call was charged), the calls counted after it left out.
  -- A refund given now must fit all of it: what it gives back before an
  -- instant a full bucket would lose, and the buckets would keep after it.
  function made_owed(AH, t, owed, now)
    local after = ahead_of(AH, t, now)
    local least = owed - after
    for j = 1, #AH do
      local e = AH[j]
      local v = e[t.key]
      if v then
        local before = owed - (e.at - now) * t.rate - after
        if before < least then least = before end
        after = after - v
      end
    end
    if least < 0 then least = 0 end
    return least
  end

  -- The virtual clock of fair shares (G) and an active tenant's record (t:<id>),
  -- read by decide (fair.lua), setweights and inspect.

  -- fair_rate returns R, what the key's binding tier allows per
  -- microsecond, in cost units.
  function fair_rate(tiers)
    local e = 0
    for _, t in ipairs(tiers) do
      local te = t.e
      if t.kind == 'w' then te = t.p / t.n end
      if te > e then e = te end
    end
    return 1 / e
  end

  -- A caller's cost is a number, taken by every tier, on a key whose tiers
  -- all count requests; on a key with tiers in other units (spec.units), a
  -- table of what each tier takes, by index: the requests for request
  -- tiers, and for another unit's tiers what the caller says it uses of it
  -- (0 when it says nothing: a tier takes nothing from a task that uses
  -- none of its unit, and does not hold it back).

  -- parse_cost reads a caller's cost argument: "n" requests, or
  -- "n,unit=m,..." with other units (decide.go). Each tier of another unit
  -- finds its count with its own pattern (t.upat, ",unit=(%d+)": a unit's
  -- name is never the end of another's after a comma), without a table of
  -- the units said. On a key with units it fills into (when given) or a new
  -- table.
  local function parse_cost(raw, spec, into)
    local tiers = spec.tiers
    local pat = spec.upat1
    if pat then
      -- One unit besides requests, said as "n,unit=m" (what decide.go
      -- writes): one anchored match reads both counts, as the general rules
      -- below would (whole numbers; n above MAX_BURST is 1, m above it 0).
      local a, b = string.match(raw, pat)
      if a then
        -- (nil: digits past a number, in gopher-lua; Redis reads inf)
        local n, m = 1, tonumber(b)
        if a ~= '1' then
          n = tonumber(a)
          if not n or n < 1 or n > MAX_BURST then n = 1 end
        end
        if not m or m > MAX_BURST then m = 0 end
        local k, c = #tiers, into
        if c then
          for i = 1, k do c[i] = tiers[i].upat and m or n end
        elseif k == 2 then
          c = {tiers[1].upat and m or n, tiers[2].upat and m or n}
        else
          c = {}
          for i = 1, k do c[i] = tiers[i].upat and m or n end
        end
        return c
      end
    end
    local n = tonumber(raw)
    if not n then
      local comma = string.find(raw, ',', 1, true)
      n = comma and tonumber(string.sub(raw, 1, comma - 1)) or 1
    end
    if n < 1 or n ~= math.floor(n) or n > MAX_BURST then n = 1 end
    if not spec.units then return n end
    local c = into or {}
    for i = 1, #tiers do
      local t = tiers[i]
      if t.upat then
        local v = tonumber(string.match(raw, t.upat) or '')
        if not v or v > MAX_BURST then v = 0 end
        c[i] = v
      else
        c[i] = n
      end
    end
    return c
  end

  -- On a key with units the vectors are kept by the cost argument
  -- (spec.costs: up to COSTS of them, their number at [0]), as parsed limits
  -- are: a caller that says the same cost again costs a lookup, and nothing
  -- changes a vector once kept. Costs that differ call after call (an LLM
  -- task's estimate) would only churn it: once full, a cost not kept is
  -- parsed without keeping it (into the caller's table when it gives one),
  -- unless it is the cost missed just before ([-2]), or COSTS_RENEW misses
  -- have passed since it filled ([-1]): then the costs kept are dropped and
  -- it is kept in their place.
  COSTS, COSTS_RENEW = 64, 1024

  -- cost_miss is cost_vec for a cost argument not kept in spec.costs.
  function cost_miss(raw, spec, into)
    local costs = spec.costs
    if not costs then return parse_cost(raw, spec, into) end
    local k = costs[0]
    if k >= COSTS then
      local missed = costs[-1] + 1
      if missed < COSTS_RENEW and raw ~= costs[-2] then
        costs[-1] = missed
        costs[-2] = raw
        return parse_cost(raw, spec, into)
      end
      for key in pairs(costs) do costs[key] = nil end
      costs[-1] = 0
      k = 0
    end
    local c = parse_cost(raw, spec, nil)
    costs[raw] = c
    costs[0] = k + 1
    return c
  end

  -- cost_vec reads a caller's cost argument (parse_cost), kept or not as
  -- cost_miss says.
  function cost_vec(raw, spec)
    local costs = spec.costs
    if costs then
      local c = costs[raw]
      if c then return c end
    end
    return cost_miss(raw, spec, nil)
  end

  -- cv is what tier i takes of cost c.
  function cv(c, i)
    if type(c) == 'table' then return c[i] end
    return c
  end

  -- cost_units returns the fair units of cost c (fair.lua): c itself when a
  -- number; for a table, the time it holds the tier it weighs on most
  -- (cost x the tier's interval per unit), in units of the key's slowest
  -- tier, which is what fair_rate counts in: a tenant's share is of its
  -- dominant resource, and with one unit this is the cost.
  function cost_units(tiers, c)
    if type(c) ~= 'table' then return c end
    local most, e_max = 0, 0
    for i, t in ipairs(tiers) do
      local te = t.e
      if t.kind == 'w' then te = t.p / t.n end
      if c[i] * te > most then most = c[i] * te end
      if te > e_max then e_max = te end
    end
    if most <= 0 then return 1e-6 end
    return most / e_max
  end

  -- read_G reads the virtual clock (a fresh one at now when absent or of
  -- another shape): V, tV, W, Fmin, sw, Vs (fair.lua) and Smax, the largest
  -- shift of a tenant active (read_tenant), a bound kept high until no
  -- tenant is active (48 bytes, from before shifts: none).
  function read_G(raw, now)
    if not bin_pack then pick_codec() end
    if raw and (#raw == 48 or #raw == 56) then
      local V, tV, W, Fmin, sw, Vs, Smax
      if #raw == 48 then
        V, tV, W, Fmin, sw, Vs = bin_unpack('<dddddd', raw)
        Smax = 0
      else
        V, tV, W, Fmin, sw, Vs, Smax = bin_unpack('<ddddddd', raw)
      end
      if V == V and tV == tV and W == W and Fmin == Fmin and sw == sw and Vs == Vs and W >= 0 and tV <= now + MAX_SKEW and
          Smax == Smax and Smax > -math.huge and Smax < math.huge then
        return {V = V, tV = tV, W = W, Fmin = Fmin, sw = sw, Vs = Vs, Smax = Smax}
      end
    end
    return {V = 0, tV = now, W = 0, Fmin = math.huge, sw = 0, Vs = 0, Smax = 0}
  end

  -- pack_G writes the virtual clock (read_G).
  function pack_G(g)
    return bin_pack('<ddddddd', g.V, g.tV, g.W, g.Fmin, g.sw, g.Vs, g.Smax or 0)
  end

  -- read_tenant reads an active tenant's record (nil: not active): its
  -- finish tag F, the weight it counts in W, the cost units admitted while
  -- active, and shift, what settlements (Used) moved its place in line since
  -- it became active: its reservations' start tags are kept less the shift
  -- at their booking, and count plus the shift now (fair_place), so that a
  -- tenant whose tasks use more than they estimate is moved on, its booked
  -- tasks too. (A record of 24 bytes, from before shifts, has none.)
  function read_tenant(raw)
    if not raw or (#raw ~= 24 and #raw ~= 32) then return nil end
    local F, w, units, shift = bin_unpack(#raw == 24 and '<ddd' or '<dddd', raw)
    if #raw == 24 then shift = 0 end
    if F ~= F or w ~= w or w <= 0 then return nil end
    if shift ~= shift or shift == math.huge or shift == -math.huge then shift = 0 end
    return {F = F, w = w, units = units, shift = shift}
  end

  -- pack_tenant writes a tenant's record (read_tenant).
  function pack_tenant(rec, w)
    return bin_pack('<dddd', rec.F, w or rec.w, rec.units, rec.shift or 0)
  end

  -- hdel_all deletes fields of key, a thousand per command (unpack has a
  -- limit).
  local function hdel_all(key, fields)
    for i = 1, #fields, 1000 do
      redis.call('HDEL', key, unpack(fields, i, math.min(i + 999, #fields)))
    end
  end

  -- drop_fair deletes the state of fair shares of a key (fair.lua): the
  -- clock, the last yield, every tenant's record, the active tenants and
  -- the start tags, so that no tenant is active and none is behind work
  -- booked before. Weights (w:<tenant>, WL) are configuration and stay.
  function drop_fair(key, akey, tkey)
    local del = {'G', 'Y'}
    for _, f in ipairs(redis.call('HKEYS', key)) do
      if string.sub(f, 1, 2) == 't:' then del[#del + 1] = f end
    end
    hdel_all(key, del)
    if akey and tkey then redis.call('DEL', akey, tkey) end
  end

  -- A provider's debt (P). A provider's near reset makes the buckets owe
  -- beyond empty (observe.lua), and an operator's Resume gives that back:
  -- what the provider imposed, never what calls took (the configured bound
  -- holds across Resume). Of what a bucket owes, P keeps the part that is
  -- the provider's: the rest is what the calls alone would owe, as a bucket
  -- that owes nothing owes them, the part the calls refilled below nothing
  -- lost. Every path that changes what a bucket owes beyond empty carries
  -- the part through (debt_through): a paced holder counted ahead (decide),
  -- a settlement (adjust), new limits (setlimits), another response
  -- (observe). A take at now needs room, so it changes a bucket that owes no
  -- more than its burst: there the part is read as none (debt_of), since
  -- the calls alone may owe all of it by then. (Capped at empty, Resume gave
  -- back the tokens a paced holder took ahead, and a bucket of 2 per second
  -- admitted 5 calls in 1.15 s:
  -- TestModelResumeKeepsWhatAFairHolderTookAhead.)

  -- read_P reads P: its end (us, nil: none) and the provider's part of each
  -- token bucket by id ("%d" of the id). A P of an end alone (written by an
  -- older version) says no part: Resume gives back nothing of it, and the
  -- debt lapses by itself (under 10 s).
  function read_P(raw)
    local parts = {}
    if not raw then return nil, parts end
    local until_ = finite(string.match(raw, '^(%d+)'))
    for id, v in string.gmatch(raw, ' (%d+):(%S+)') do
      v = finite(v)
      if v and v > 0 then parts[id] = v end
    end
    return until_, parts
  end

  -- write_P writes P: until, and the parts of tiers' buckets.
  function write_P(until_, parts, tiers)
    local s = string.format('%d', until_)
    for _, t in ipairs(tiers) do
      local id = string.format('%d', t.id)
      local v = parts[id]
      if t.kind == 'b' and v and v > 0 then s = s .. ' ' .. id .. ':' .. fmt(v) end
    end
    return s
  end

  -- debt_of returns the provider's part of what token bucket t owes now
  -- (owed), given the part d P keeps: none when it owes no more than its
  -- burst (a take at now may have taken from it since the part was kept),
  -- and no more than it owes.
  function debt_of(t, d, owed)
    if not d or d <= 0 or owed <= t.full + 2 * t.rate then return 0 end
    return math.min(d, owed)
  end

  -- debt_through returns the provider's part of what token bucket t owes
  -- after a change, the part being d of owed before it: the calls alone owed
  -- calls = owed - d, and owe calls_after after (the caller applies the same
  -- change to both); the part is the rest.
  function debt_through(t, d, owed, after, change)
    d = debt_of(t, d, owed)
    if d == 0 then return 0 end
    local calls = math.max(owed, 0) - d
    local v = after - change(calls)
    if v < 0 then v = 0 end
    return v
  end

  -- tokens_at is what token bucket t holds when it owes owed.
  function tokens_at(t, owed)
    if owed < 0 then owed = 0 end
    return t.burst - owed / t.p
  end

  -- wait_for returns how long (whole microseconds) until token bucket t,
  -- owing owed, holds c tokens with room for headroom us of dispatch jitter;
  -- 0 when it holds them now.
  function wait_for(t, owed, c, headroom)
    local need = owed + headroom * t.rate - (t.burst - c) * t.p
    if need <= 0 then return 0 end
    return math.ceil(need / t.rate)
  end

  -- T_FMT is the format of the T field with 0 to MAX_TIERS token buckets
  -- owing (a literal: a function library sees no string library while it
  -- loads).
  local T_FMT = {[0] = '<ddd', '<ddddd', '<ddddddd', '<ddddddddd', '<ddddddddddd',
                 '<ddddddddddddd', '<ddddddddddddddd', '<ddddddddddddddddd', '<ddddddddddddddddddd'}

  -- full_in returns how long (us) until every token bucket is full again.
  function full_in(tiers, owed)
    local longest = 0
    for i = 1, #tiers do
      local t, v = tiers[i], owed[i]
      if t.kind == 'b' and v > 0 and v / t.rate > longest then longest = v / t.rate end
    end
    return math.ceil(longest)
  end

  -- write_T returns the T field for the buckets' owed at now, the expiry memo
  -- x and the end of the queue of reservations q, or false when there is
  -- nothing to keep.
  function write_T(tiers, owed, now, x, q)
    if not bin_pack then pick_codec() end
    local owing, only, before = 0, 0, 0 -- (before: the one owing before only)
    for i = 1, #tiers do
      if tiers[i].kind == 'b' and owed[i] > 0 then
        -- (one at a time: gopher-lua, miniredis's Lua, may assign before
        -- it has read the old only)
        owing = owing + 1
        before = only
        only = i
      end
    end
    if owing == 0 then
      if q == 0 then return false end
      return bin_pack('<ddd', now, x, q)
    elseif owing == 1 then -- the common cases, without a table
      return bin_pack('<ddddd', now, x, q, tiers[only].id, owed[only])
    elseif owing == 2 then
      return bin_pack('<ddddddd', now, x, q, tiers[before].id, owed[before], tiers[only].id, owed[only])
    end
    local a, k = {now, x, q}, 3
    for i = 1, #tiers do
      local t, v = tiers[i], owed[i]
      if t.kind == 'b' and v > 0 then
        a[k + 1], a[k + 2] = t.id, v
        k = k + 2
      end
    end
    return bin_pack(T_FMT[(k - 3) / 2], unpack(a, 1, k))
  end

  -- Slots in flight.

  -- slot_start reads when a slot holder started from its member name.
  function slot_start(member)
    return tonumber(string.match(member, '@(%d+)%.%d+$'))
  end

  -- slot_avg reads the moving average of how long a slot is held (R), or
  -- the default when none is known.
  function slot_avg(raw, default)
    if not raw then return default end
    local avg = tonumber(string.match(raw, '^(%d+)') or '')
    if avg == nil or avg < 1 then return default end
    return avg
  end

  -- all_n repeats one reply for the n callers of a run.
  function all_n(reply, n)
    if n == 1 then return reply end
    local out = {}
    for k = 1, n do out[k] = reply end
    return table.concat(out, ';')
  end

  -- outlive makes key other live at least us microseconds longer than key
  -- does (the active tenants, beside the hash that counts them).
  function outlive(key, other, us)
    local pttl = redis.call('PTTL', key)
    if pttl > 0 then extend_to(other, pttl * 1000 + us) end
  end

  -- keep_alive decides the expiry of the key's hash (key), which must live
  -- at least need microseconds more: x is the memo of when it expires at the
  -- earliest (T's x; 0 unknown), a lower bound because no path shortens a
  -- TTL. When the memo says the key lives long enough, nothing is asked;
  -- otherwise its TTL is read (another path may have raised it: a
  -- suspension, a learned quota), and raised only when it is short, to twice
  -- the need (so that the next calls find the memo long enough). It returns
  -- the new memo and the TTL to set once the hash is written (us), or the
  -- memo and nil.
  function keep_alive(key, need, x, now)
    if need < 1e6 then need = 1e6 end
    x = finite(x) or 0
    if x >= now + need and x <= now + MAX_TTL_MS * 1000 then return x, nil end
    local pttl = redis.call('PTTL', key)
    if pttl > 0 and pttl * 1000 >= need then return now + pttl * 1000, nil end
    local ttl = 2 * need
    if ttl > MAX_TTL_MS * 1000 then ttl = MAX_TTL_MS * 1000 end
    if pttl > 0 and pttl * 1000 > ttl then ttl = pttl * 1000 end
    return now + ttl, ttl
  end

  -- set_ttl sets the TTL keep_alive asked for (us), once the hash is
  -- written.
  function set_ttl(key, ttl)
    redis.call('PEXPIRE', key, ttl_ms(ttl))
  end

  -- Configuration (issue 34). What an operator set lives in a hash of its
  -- own, <prefix>:{name}:c, with no expiry, until Delete: the limits (L) and
  -- the tenants' weights (w:<tenant>, WL). The key's hash keeps a copy of it
  -- beside the state, read in the same HMGET as the state, and expires with
  -- the state: an idle key shrinks to its configuration, and costs nothing
  -- else. A hash without L and without D (the defaults the buckets were
  -- computed under, written only on a key without configured limits) may
  -- have lost its copy: the configuration is read from :c (config_of), and
  -- a decision copies it back (restore_config).

  -- is_config reports whether a field of the key's hash is configuration.
  local function is_config(f)
    return f == 'L' or f == 'WL' or string.sub(f, 1, 2) == 'w:'
  end

  -- config_of returns the configured limits of a key whose hash has L (h_L)
  -- and D (h_D) as read: L; else, without D, those of :c (kc); nil: none.
  function config_of(kc, h_L, h_D)
    if h_L then return h_L end
    if h_D or not kc or kc == '' then return nil end
    return redis.call('HGET', kc, 'L') or nil
  end

  -- restore_config copies the configuration (:c) into the key's hash (kb)
  -- and returns its limits (nil: none) and whether there was any. The hash
  -- lives at least a second more (it may be new).
  function restore_config(kb, kc)
    local all = redis.call('HGETALL', kc)
    if #all == 0 then return nil, false end
    local L = nil
    for i = 1, #all, 2 do
      if all[i] == 'L' then L = all[i + 1] end
    end
    for i = 1, #all, 1000 do redis.call('HSET', kb, unpack(all, i, math.min(i + 999, #all))) end
    extend_to(kb, 1e6)
    return L, true
  end

  -- save_config writes the configuration of the key's hash (kb) to :c when
  -- :c has none (a key configured before :c existed keeps its limits past
  -- its hash).
  function save_config(kb, kc)
    if not kc or kc == '' or redis.call('EXISTS', kc) == 1 then return end
    local h = redis.call('HMGET', kb, 'L', 'WL')
    local fields = {}
    if h[1] then
      fields[#fields + 1] = 'L'
      fields[#fields + 1] = h[1]
    end
    if h[2] then
      fields[#fields + 1] = 'WL'
      fields[#fields + 1] = h[2]
      for name in string.gmatch(h[2], '[^\n]+') do
        local w = redis.call('HGET', kb, 'w:' .. name)
        if w then
          fields[#fields + 1] = 'w:' .. name
          fields[#fields + 1] = w
        end
      end
    end
    if #fields > 0 then redis.call('HSET', kc, unpack(fields)) end
  end

  -- set_config writes configuration fields (pairs) to the key's hash and to
  -- :c, and deletes the fields del from both.
  function set_config(kb, kc, fields, del)
    if del and #del > 0 then
      hdel_all(kb, del)
      if kc and kc ~= '' then hdel_all(kc, del) end
    end
    if #fields > 0 then
      redis.call('HSET', kb, unpack(fields))
      if kc and kc ~= '' then redis.call('HSET', kc, unpack(fields)) end
    end
  end
end

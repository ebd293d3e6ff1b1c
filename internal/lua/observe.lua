-- observe.lua: learn from what a provider's response says about its quota
-- (see admin.go). The limits in L (or the defaults) stay the ceiling; what
-- is learned goes beside them in O and only ever lowers what is in force:
--   - a published quota below a tier's (matched by its period) lowers that
--     tier until learn_for after the provider last said so; one at or above
--     it puts the tier back to its ceiling;
--   - a remaining count below a tier's tokens brings the tokens down to it
--     (never up): the tier whose period is the remaining's window, or every
--     rate tier when the window is not known;
--   - remaining 0 with a reset: those tiers admit nothing until the reset;
--     a reset 10 s or more away also suspends the key until then (tasks
--     park rather than be decided again and again), extending, never
--     shortening, a suspension, unless the caller says not to (a 429,
--     which the caller suspends the key for itself).
-- Reply: one string per change, for the caller to log, and last, when the
-- key has limits, "tiers per_ms:in_force:configured:unit:burst ..." (each
-- tier's period, quota and unit, and a bucket's burst in force, 0 for a
-- window), which tells the caller which published quotas (and bursts)
-- could change anything, so that it sends only those.
local key, kc, akey = KEYS[1], KEYS[2], KEYS[3]
local policies  = ARGV[1]             -- "per_ms:quota[:unit:burst] ..." ('' none)
local remaining = tonumber(ARGV[2])   -- -1: not said
local window_ms = tonumber(ARGV[3])   -- window of remaining, 0: not said
local reset_us  = tonumber(ARGV[4])   -- 0: not said
local learn_for = tonumber(ARGV[5])   -- us a learned quota lasts unconfirmed
local defaults  = ARGV[6]
local max_susp  = tonumber(ARGV[7])
local stop      = ARGV[8] == '1'      -- remaining 0 with a reset suspends
local unit_left = ARGV[9] or ''       -- "unit:window_ms:remaining ...": other units' counts left
local now = now_us()
local SUSPEND_FROM = 10e6             -- us: a nearer reset is left to the tiers

local h = redis.call('HMGET', key, 'L', 'T', 'O', 's', 'P', 'D', 'V')
h[1] = config_of(kc, h[1], h[6]) or false
local src = h[1]
if not src and defaults ~= '' then src = defaults end
if not src then return {} end
local ceiling = parse_limits(src)
if not ceiling then return {} end
local changes = {}
local learned, adapt = read_O(h[3])
local before = write_O(learned, adapt, now)
local relearned = false

-- unit_of reads a unit as sent ('' and 'requests': the default, nil).
local function unit_of(u)
  if u == '' or u == 'requests' then return nil end
  return u
end

-- burst_tol is how far a burst told may be from a bucket of b and still be
-- it, rounded: 1, or 1 % of b.
local function burst_tol(b) return math.max(1, math.floor(b / 100)) end

-- matches returns the tiers a published quota of q per per_ms in unit is
-- about, each with the quota it states for that tier's period and the
-- burst it implies (nil: none): the tiers of that period and unit; when
-- there is none, the tier of the unit whose period is nearest (by ratio;
-- a tie goes to the longer), the quota converted to its period (q x its
-- period / per_ms, rounded down; less than one is left unmapped, with a
-- warning) and, when that period is the
-- longer, a burst of q (the provider admits no more than q at once). So a
-- quota per minute binds a tier per second at a sixtieth of it, and one
-- per second a tier per minute at sixty times it, holding q at most: the
-- provider's sustained rate, never more. (Without it, limits configured as
-- per-second tiers never learned a provider's per-minute quota, silently.)
-- It also reports whether the quota was converted.
local function matches(per, q, unit)
  local out = {}
  for i, t in ipairs(ceiling.tiers) do
    if t.per == per and t.unit == unit then out[#out + 1] = {i, q} end
  end
  if #out > 0 then return out, false end
  local best, dist = nil, nil
  for i, t in ipairs(ceiling.tiers) do
    if t.unit == unit then
      local d = math.max(t.per / per, per / t.per)
      if not best or d < dist or (d == dist and t.per > ceiling.tiers[best].per) then best, dist = i, d end
    end
  end
  if not best then return out, false end
  local t = ceiling.tiers[best]
  local qc = math.floor(q * t.per / per)
  -- (less than one per the tier's period cannot be said in it: rounded up
  -- to one, the tier would admit more than the quota; left unmapped, and
  -- warned about)
  if qc < 1 then return out, false, best end
  local b = nil
  if t.per > per then b = q end
  out[1] = {best, qc, b}
  return out, true
end

-- Published quotas (a bucket's burst too, when the provider tells it),
-- matched to the tier of their period and unit, else converted to the
-- periods of the tiers of their unit. A tier told several (a quota of its
-- own period and one converted, say) follows the strictest.
local stated, order = {}, {}
for tok in string.gmatch(policies, '%S+') do
  local per, q0, u, b0 = string.match(tok, '^(%d+):(%d+):?([%w_%-]*):?(%d*)$')
  per, q0, b0 = tonumber(per), tonumber(q0), tonumber(b0)
  local unit = unit_of(u or '')
  local found, converted, small = {}, false, nil
  if per and q0 then found, converted, small = matches(per, q0, unit) end
  for _, m in ipairs(found) do
    local i, q = m[1], m[2]
    local bm = b0
    if m[3] and (not bm or m[3] < bm) then bm = m[3] end
    local st = stated[i]
    if not st then
      st = {q = q, per = per, q0 = q0, converted = converted}
      stated[i] = st
      order[#order + 1] = i
    elseif q < st.q then
      st.q, st.per, st.q0, st.converted = q, per, q0, converted
    end
    if bm and (not st.b or bm < st.b) then st.b = bm end
  end
  if per and #found == 0 and small then
    changes[#changes + 1] = string.format('unmapped %d %d %s %d', per, q0, u ~= '' and u or 'requests', ceiling.tiers[small].per)
  elseif per and #found == 0 then
    changes[#changes + 1] = string.format('unmatched %d %d %s', per, q0, u ~= '' and u or 'requests')
  end
end
for _, i in ipairs(order) do
  local st = stated[i]
  local t, q, b = ceiling.tiers[i], st.q, st.b
  local l = learned[t.key]
  -- (a burst no lower than the quota's own lowers nothing: a lowered
  -- quota lowers the burst with it)
  -- (a burst told is the bucket's, rounded: within burst_tol below the
  -- key's own it tells nothing, and changes no limits)
  if b and t.kind ~= 'b' then b = nil end -- (a window has no burst)
  if b then
    local own = math.min(t.burst, q)
    if b < own and b >= own - burst_tol(own) then b = nil end
    if b and (b < 1 or b >= own) then b = nil end
  end
  local lq = math.min(q, tier_quota(t))
  -- A burst told from a remaining the provider rounded down (and a
  -- refill rounded down, and a reset rounded to the millisecond) is
  -- what the bucket holds, a little below or a hair above: within
  -- burst_tol of the burst learned at the same quota it is the same
  -- bucket, and the burst learned stays (no change of limits, whose
  -- new generation would cost the refunds of every call under way). A
  -- small burst is raised by any higher one told, so that the bursts
  -- told converge up to the bucket.
  if b and l and l[2] > now and l[3] and l[1] == lq then
    local tl = burst_tol(l[3])
    if (b < l[3] and b >= l[3] - tl) or (b > l[3] and tl > 1 and b <= l[3] + tl) then b = l[3] end
  end
  if q < tier_quota(t) or b then
    if not l or l[1] ~= lq or l[3] ~= b or l[2] <= now then
      if lq < tier_quota(t) then
        if st.converted then
          changes[#changes + 1] = string.format('converted %d %d %d %d %d %d', i - 1, lq, tier_quota(t), t.per, st.q0, st.per)
        else
          changes[#changes + 1] = string.format('learned %d %d %d %d', i - 1, lq, tier_quota(t), t.per)
        end
      end
      if b and (not l or l[3] ~= b or l[2] <= now) then
        changes[#changes + 1] = string.format('burst %d %d %d %d', i - 1, b, t.burst, t.per)
      end
      relearned = true
    end
    -- (in force until learn_for after the provider last said it, and at
    -- least two of its periods: a quota per hour is said again within one)
    learned[t.key] = {lq, now + math.max(learn_for, 2 * t.p, 2 * st.per * 1000), b}
  elseif l and l[2] > now then
    changes[#changes + 1] = string.format('ceiling %d %d %d', i - 1, tier_quota(t), t.per)
    learned[t.key] = nil
    relearned = true
  end
end

-- What is in force now, with what was just learned.
local O = write_O(learned, adapt, now)
local spec = ceiling
if O then spec = apply_learned(ceiling, src, O, now) end
local tiers = spec.tiers

local fields, need = {}, 0
local ts, x, q, stored = read_T(h[2], now)
local owed = bucket_owed(stored, ts, tiers, now, 0)
local t_changed = false

-- lower_to brings tier i's tokens down to remaining (never up), as of a
-- reset reset_us away (0: not said, or a bucket refilling continuously).
-- None left until a near reset, a bucket refills from empty then: it owes
-- the time until the reset beyond its burst, a debt the provider imposed
-- (P: until when; Resume clears it, an operator winning over a provider).
-- A reset SUSPEND_FROM away or more is a suspension's (this script's, or
-- the middleware's for a 429), which Inspect shows and Resume ends: no
-- debt then, the bucket refilling while the key is suspended (a debt of
-- the whole reset, an hour at most, outlived an operator's Resume).
-- What the buckets owe above what the calls alone would is the
-- provider's part (read_P), which Resume gives back: what this response
-- brings a bucket down by, and the part a debt still in force kept.
local provider_until, parts = read_P(h[5] or nil)
if not (provider_until and provider_until > now) then parts = {} end
local function lower_to(i, remaining, reset_us)
    local t = tiers[i]
    if t.kind == 'b' then
      local has = tokens_at(t, owed[i])
      local want = (t.burst - remaining) * t.p
      if remaining == 0 and reset_us > 0 and reset_us < SUSPEND_FROM then
        want = want + reset_us * t.rate
        if not provider_until or provider_until < now + reset_us then provider_until = now + reset_us end
      end
      if want > owed[i] + SLACK * t.rate then
        local id = string.format('%d', t.id)
        parts[id] = debt_of(t, parts[id], owed[i]) + want - math.max(owed[i], 0)
        owed[i] = want
        t_changed = true
        changes[#changes + 1] = string.format('tokens %d %d %d', i - 1, math.max(math.floor(has), 0), remaining)
      end
    else
      local f = 'W' .. t.key
      local w = win_load(redis.call('HGET', key, f), t, now, 0)
      local has = t.n - win_count(w, t, now, 0)
      if remaining < has then
        -- The provider's other calls, counted so that they leave the
        -- window at the provider's reset (when it tells it), not a whole
        -- window from now.
        local at = now
        if reset_us > 0 and reset_us < t.p and not t.fixed then at = now + reset_us - t.p end
        win_add(w, t, at, has - remaining)
        local s, empty_in = win_write(w, t, now, 0)
        fields[#fields + 1] = f
        fields[#fields + 1] = s
        if empty_in > need then need = empty_in end
        changes[#changes + 1] = string.format('tokens %d %d %d', i - 1, math.max(has, 0), remaining)
      end
    end
end

-- targets are the tiers of unit (nil: requests) that a count left in a
-- window of window_ms is about: those of that period, else all of the unit.
local function targets(unit, window_ms)
  local out, all = {}, {}
  for i, t in ipairs(tiers) do
    if t.unit == unit then
      all[#all + 1] = i
      if window_ms > 0 and t.per == window_ms then out[#out + 1] = i end
    end
  end
  if #out == 0 then return all end
  return out
end

if remaining >= 0 then
  for _, i in ipairs(targets(nil, window_ms)) do lower_to(i, remaining, reset_us) end
end
for u, w, left in string.gmatch(unit_left, '([%w_%-]+):(%d+):(%d+)') do
  for _, i in ipairs(targets(unit_of(u), tonumber(w))) do lower_to(i, tonumber(left), 0) end
end

-- Out of quota until a reset far enough away for tasks to wait for it
-- parked (a suspension) rather than be decided again and again: the
-- whole fleet waits for it. A nearer reset is kept by the tiers above.
local until_ = finite(h[4])
if stop and remaining == 0 and reset_us >= SUSPEND_FROM then
  local want = now + math.min(reset_us, max_susp)
  if not until_ or until_ < want or until_ - now > MAX_WAIT then
    until_ = want
    fields[#fields + 1] = 's'
    fields[#fields + 1] = string.format('%d', until_)
    changes[#changes + 1] = string.format('suspended %d', want - now)
    -- Adaptive's clean intervals count from the end of a suspension,
    -- none while the key is still suspended (the factor in force now is
    -- kept).
    if ceiling.adaptive and adapt and adapt[2] < until_ and adapt_ppm(ceiling, adapt, now) < 1e6 then
      adapt = {adapt_ppm(ceiling, adapt, now), until_}
      O = write_O(learned, adapt, now)
    end
  end
end

if O ~= before then
  if O then
    fields[#fields + 1] = 'O'
    fields[#fields + 1] = O
  else
    redis.call('HDEL', key, 'O')
  end
end
if relearned and h[1] then
  set_config(key, kc, {'L', bump_gen(h[1])})
  -- The calls before now are of another generation, refunded nothing
  -- (adjust.lua): M starts afresh, so that what the buckets owed under the
  -- limits before (say, 10x too high) does not bound the refunds of the
  -- calls after.
  if ceiling.units then redis.call('HDEL', key, 'M') end
end
-- x_ttl: the TTL keep_alive asked for (us; nil: none), when T is written
-- with the expiry memo x it returned. The memo is what every decision
-- after trusts to spare a PEXPIRE, so the key must live that long: set to
-- need alone, the memo said 6 s where the key lived 3 s, the decisions
-- after never raised the TTL, and the hash expired with a bucket still
-- owing (PerSecond(2) admitted 2 calls 0.43 s after 2 more:
-- TestModelNearResetFairHoldersAheadKeepTheBound).
local x_ttl = nil
if t_changed then
  -- (M, what the buckets owed at least since its instants, stays: a bucket
  -- brought down owes more from now on, never less, so the least it owed
  -- before still bounds a refund of a call before now, and the refund is
  -- bounded by what it owes now as well: refund_room. Dropping M here lost
  -- every refund of the calls under way at each such response: bench L.)
  local longest = full_in(tiers, owed)
  if longest > need then need = longest end
  if q > now and q - now > need then need = q - now end
  x, x_ttl = keep_alive(key, need, x, now)
  fields[#fields + 1] = 'T'
  fields[#fields + 1] = write_T(tiers, owed, now, x, (q > now or q == -1) and q or 0)
  if provider_until and provider_until > now then
    fields[#fields + 1] = 'P'
    fields[#fields + 1] = write_P(provider_until, parts, tiers)
  end
end
-- A queue of reservations booked under the rates in force before keeps
-- each bucket's schedule (V) as times, spaced by the bucket's emission
-- interval then: when what is learned changes a bucket's rate, what the
-- schedule owes past the queue's end (q: its last booked instant and a
-- granule) is respaced to the rate in force, so that the bookings after
-- it are spaced at that rate. (A learned 2 a minute raised to 8 booked
-- the next task 60 s behind the queue, at 2 a minute's spacing, where 8's
-- was 15 s: the combined model's liveness.) The reservations already
-- booked keep their instants, and the time before the queue's end is not
-- respaced: it may be a wait (a suspension's) and not tokens owed
-- (respaced from now, a 5/s schedule behind a 60 s suspension, lowered
-- to 3/s, pushed the next booking 40 s past the suspension's end).
if q > now and h[7] then
  local old = ceiling
  if h[3] then old = apply_learned(ceiling, src, h[3], now) end
  local va, sw, virt = read_V(h[7])
  if va then
    local e0 = {}
    for _, t in ipairs(old.tiers) do
      if t.kind == 'b' then e0[t.id] = t.e end
    end
    local vt, respaced = {}, false
    local from = q - va -- (the queue's end, as V's times are: from va)
    for i, t in ipairs(tiers) do
      if t.kind == 'b' then
        -- (what the bucket owes says, as load_schedule starts a schedule)
        local owes = owed[i] / t.rate + (now - va)
        local v = virt[-t.id]
        if v == nil then
          v = owes
        elseif e0[t.id] and e0[t.id] ~= t.e and v > from then
          -- (never earlier than what the bucket owes: the tail may have
          -- been booked slower than e0, under an adaptive cut)
          v = math.max(from + (v - from) * t.e / e0[t.id], owes)
          respaced = true
        end
        vt[i] = v
      end
    end
    if respaced then
      fields[#fields + 1] = 'V'
      fields[#fields + 1] = write_V(va, sw, tiers, vt)
    end
  end
end
if #fields > 0 then
  redis.call('HSET', key, unpack(fields))
  -- The key lives as long as what it holds says (what other paths wrote
  -- lives as long as they said: no path shortens it).
  local longest = need
  if until_ and until_ - now > longest then longest = until_ - now end
  if O then
    for _, l in pairs(learned) do
      if l[2] - now > longest then longest = l[2] - now end
    end
  end
  if x_ttl and x_ttl > longest then longest = x_ttl end
  extend_to(key, longest)
  -- (the active tenants outlive the hash that counts them)
  if akey then extend_to(akey, longest + 1e6) end
end
local in_force = {}
for i, t in ipairs(ceiling.tiers) do
  local b = 0
  if tiers[i].kind == 'b' then b = tiers[i].burst end
  in_force[i] = string.format('%d:%d:%d:%s:%d', t.per, tier_quota(tiers[i]), tier_quota(t), t.unit or 'requests', b)
end
-- The generation of the limits in force after this call, so that a
-- process knows when the limits changed since what it was told.
local gen = ceiling.gen
if relearned and h[1] then gen = tonumber(string.match(bump_gen(h[1]), '#(%d+)')) or 0 end
changes[#changes + 1] = string.format('gen %d', gen)
changes[#changes + 1] = 'tiers ' .. table.concat(in_force, ' ')
return changes

-- adjust.lua: settle a cost after the fact (see admin.go): every tier of a
-- key in the unit settled (requests unless ARGV[6] names another) takes
-- delta more of it as of now, or gives -delta back; other units' tiers are
-- left as they are.
--
-- A surcharge is taken as of now (a bucket may go into debt; a window
-- counts it in the current sub-window). A refund is given back only as far
-- as it can be without any tier admitting more real calls than it would
-- have had the call cost that much less when it was admitted (at, under the
-- limits of generation gen, charged units so far):
--   a bucket gets back at most what is left of the call's own debit, which
--   refills at the rate from at on (given back in full later, a bucket
--   that refilled meanwhile would hold more than its burst of real calls);
--   a window takes it back only from the sub-window where the call was
--   counted (given back from a later one, the earlier one's calls would
--   leave the window while the calls that replace them join the later
--   ones), and nothing once that sub-window has left the window.
-- Without at, or for a call admitted under other limits (another
-- generation: its tier may not have counted it), a refund gives nothing
-- back.
--
-- On a key tenants share (fair.lua), the task's tenant (ARGV[7]) is
-- settled too, as its tiers are: its finish tag counted the estimate, and
-- moves on by a surcharge, back by a refund (never behind the clock), so
-- that a tenant that estimates low does not take the others' share.
-- Refunds reach the backlog. While a queue of reservations is outstanding,
-- its tasks were booked at their estimates: what a refund of another unit
-- than requests gives back is room none of them will take, and a task
-- already deferred comes back only at its instant. When the caller will
-- run them (ARGV[8]), the refund moves the schedule of the buckets it gave
-- back to (decide.lua's V) back by what it gave, as it moved the buckets,
-- and, for every booked task's worth given back since the queue opened
-- (B's credit; a booked task's worth is the larger of the settling call's
-- estimate, ARGV[9], and the mean estimate of the calls settled on the key,
-- B's third number: the script does not know what each booking cost, and
-- a task brought forward that does not fit is booked again behind the
-- queue, so the worth errs high), brings the latest reservation forward,
-- at most MAX_FORWARD a settlement: its instant becomes now, and its task
-- ID is returned with its old instant for the caller to run the task now
-- (asynq's RunTask) if it is still the task that booked it. The other reservations keep their instants and
-- the queue ends a task earlier: taken from the end and booked now, the
-- task leaves the schedule as long as it was, less the refund. The tiers
-- still decide when it comes back, as for any holder whose instant has
-- come: the schedule only plans. The latest first, so a backlog's last
-- tasks may run before earlier ones. Never on a key with a window (its
-- reserved calls are counted per sub-window at their instants), with
-- tenants (their turns are fair tags), or while suspended.
local FORWARD_AFTER = 1.5e6 -- us: reservations nearer come back by themselves soon (asynq holds a task until the whole second before its instant: throttle's forwardSoonest)
local MAX_FORWARD = 16     -- reservations brought forward by one settlement at most (the rest of the credit waits for the next)
local MEAN_WEIGHT = 0.25   -- weight of a settling call's estimate in the key's mean
local HOLDS_SEEN = 32      -- holds of tasks of several keys skipped among the latest reservations at most

-- bring_forward moves the schedule back by what each bucket gave back
-- (gave, of owed before: was; owed for the buckets of other units), adds
-- the least of it, in tokens, to the credit of the queue anchored as V's
-- (B: "anchor credit mean"), brings forward a reservation (the latest) for
-- each booked task's worth of credit (estimate: the settling call's), and
-- adds V and B to fields. It returns the IDs brought forward, each
-- followed by its old instant (us).
local function bring_forward(resv_key, tiers, was, owed, gave, estimate, V, B, now, fields)
  local va, sw, virt = read_V(V)
  if not va or estimate <= 0 then return {} end
  local tokens = nil
  local vt = {}
  for i, t in ipairs(tiers) do
    if t.kind == 'b' then
      local v = virt[-t.id]
      if v == nil then v = (was[i] or owed[i] or 0) / t.rate + (now - va) end
      if gave[i] then
        v = v - gave[i] / t.rate
        if not tokens or gave[i] / t.p < tokens then tokens = gave[i] / t.p end
      end
      vt[i] = v
    end
  end
  fields[#fields + 1] = 'V'
  fields[#fields + 1] = write_V(va, sw, tiers, vt)
  local credit = 0
  local pa, pc, pm = string.match(B or '', '^(%d+) (%S+) ?(%S*)$')
  if tonumber(pa) == va then credit = tonumber(pc) or 0 end
  if not (credit >= 0 and credit < math.huge) then credit = 0 end
  credit = credit + (tokens or 0)
  local mean = tonumber(pm)
  if mean and mean > 0 and mean < math.huge then
    mean = mean + (estimate - mean) * MEAN_WEIGHT
  else
    mean = estimate
  end
  local worth = math.max(estimate, mean)
  local out = {}
  local n = math.floor(credit / worth)
  if n > MAX_FORWARD then n = MAX_FORWARD end
  if n > 0 then
    -- (a task of several keys holds an instant it did not book here as
    -- '~' .. its ID, multi.lua's hold: no reservation of this schedule,
    -- and no task of that ID to run; skipped, among HOLDS_SEEN at most)
    local found = redis.call('ZREVRANGEBYSCORE', resv_key, '+inf', '(' .. fmt(now + FORWARD_AFTER), 'WITHSCORES', 'LIMIT', 0, n + HOLDS_SEEN)
    local moved = 0
    for j = 1, #found, 2 do
      if moved < n and string.sub(found[j], 1, 1) ~= '~' then
        redis.call('ZADD', resv_key, 'XX', now, found[j])
        out[#out + 1] = found[j]
        out[#out + 1] = found[j + 1]
        moved = moved + 1
      end
    end
    -- (credit nothing far enough ahead could take is not kept; credit
    -- beyond MAX_FORWARD's worth is not either)
    if moved < n then
      credit = 0
    else
      credit = math.min(credit - n * worth, MAX_FORWARD * worth)
    end
  end
  fields[#fields + 1] = 'B'
  fields[#fields + 1] = string.format('%d %.17g %.17g', va, credit, mean)
  return out
end

local key, kc, akey, resv_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local delta    = tonumber(ARGV[1])
local defaults = ARGV[2]
local at       = tonumber(ARGV[3]) or 0    -- us: when the call was admitted (0 unknown)
local charged  = tonumber(ARGV[4]) or 0    -- what the call was charged so far
local call_gen = tonumber(ARGV[5]) or -1   -- the limits' generation it was admitted under
local unit     = ARGV[6] or ''             -- the unit settled ('': requests)
local tenant   = ARGV[7]                   -- the task's tenant (nil: none said)
local bring    = ARGV[8] == '1'            -- the caller runs the reservations brought forward
local estimate = tonumber(ARGV[9]) or 0    -- what the call was charged of unit when admitted (0: charged)
if estimate <= 0 then estimate = charged end
local now = now_us()
local h = redis.call('HMGET', key, 'L', 'T', 'O', 'M', 'D', 'A', 's', 'V', 'B', 'AH', 'P')
local src = config_of(kc, h[1], h[5])
if not src and defaults ~= '' then src = defaults end
if not src or delta == 0 then return {} end
local spec = parse_limits(src)
if not spec then return {} end
if h[3] then spec = apply_learned(spec, src, h[3], now) end
local tiers = spec.tiers
local refund = delta < 0 and at > 0 and call_gen == spec.gen
-- Calls counted at an instant ahead (paced holders, decide.lua's A): the
-- buckets owe as of now what they will take then, and what a refund gives
-- back may have been lost by a full bucket up to the latest of them. So a
-- refund's refill rule is counted as of then (the refill since the call up
-- to then is not given back), and the least owed (M) counts what each
-- bucket owed as of those instants (decide.lua samples it at admission).
-- (A refund of 0.96 of a call just before a holder's instant admitted a
-- third call 30 ms after it, on a burst of 1.)
local ref_now = now
local ahead = finite(h[6])
if ahead and ahead > now then ref_now = ahead end
local ts, x, q, stored = read_T(h[2], now)
local owed = bucket_owed(stored, ts, tiers, now, 0)
local fields, need = {}, 0
local gave, was = {}, {} -- what each bucket gave back, and owed before
-- On a key with units, what each bucket owed at least since the call
-- (refund_room) may come back too; every change here is sampled.
local M = nil
if spec.units then M = read_M(h[4] or nil, tiers) end
-- The calls counted at instants ahead (paced holders, decide.lua's AH):
-- the calls made so far owe that much less until then, and M counts what
-- those owe, now and until the last of those instants (made_owed): a
-- refund that a full bucket would lose before a holder's instant is not
-- given back. (Counted from the buckets as they are, a refund of a call
-- made after a holder was admitted found room in the holder's cost, and
-- the call admitted after the holder's was one the provider refused:
-- bench L6.)
-- A provider's debt (P, see read_P): its part of what a bucket owes is
-- carried through the settlement, which changes what the calls alone owe
-- as much (down to nothing), so that Resume gives back no more than it.
local P_until, parts = read_P(h[11] or nil)
if not (P_until and P_until > now and next(parts)) then parts = nil end
local parts_changed = false
local AH = nil
if M and h[10] then
  AH = read_AH(h[10], now)
  if #AH == 0 then AH = nil end
end
for i, t in ipairs(tiers) do
  if (t.unit or '') ~= unit then
    -- (another unit's tier: not this settlement's)
  elseif t.kind == 'b' then
    local v = owed[i]
    was[i] = v
    local ahead = AH and ahead_of(AH, t, now) or 0
    if M and M[i] then sample_M(M, i, v - ahead, now, false) end
    local given = 0
    if delta > 0 then
      v = v + delta * t.p
    elseif refund then
      local want = math.min(-delta, charged) * t.p
      local back = want - math.max(0, ref_now - at) * t.rate
      local made = v
      if AH then made = made_owed(AH, t, v, now) end
      if M then back = math.max(back, math.min(want, refund_room(M, i, at, made))) end
      if back > 0 then
        local before = math.max(v, 0)
        v = math.max(v - back, 0)
        given = before - v
      end
    end
    if v < 0 then v = 0 end
    local id = parts and string.format('%d', t.id)
    if id and parts[id] then
      parts[id] = debt_through(t, parts[id], owed[i], v, function(calls)
        if delta > 0 then return calls + delta * t.p end
        return math.max(calls - given, 0)
      end)
      parts_changed = true
    end
    owed[i] = v
    -- Every interval since the call owed that much less had the call cost
    -- that much less: a second refund that fit alone must not give back
    -- what this one took from the room (two calls refunded 40 each of a
    -- bucket that owed 40 at least: 80 tokens, half of them tokens a full
    -- bucket would have lost). (And what it owes after, now included.)
    if M and M[i] then refund_given(M, i, at, given, v - ahead) end
    if given > 0 then gave[i] = given end
  else
    local f = 'W' .. t.key
    local w = win_load(redis.call('HGET', key, f), t, now, 0)
    if delta > 0 then
      win_add(w, t, now, delta)
    elseif refund then
      local idx = math.floor(at / t.sub)
      local c = w.c[-idx] or 0
      local take = math.min(c, -delta)
      if take > 0 then w.c[-idx] = c - take end
    end
    local s, empty_in = win_write(w, t, now, 0)
    if s then
      fields[#fields + 1] = f
      fields[#fields + 1] = s
    else
      redis.call('HDEL', key, f)
    end
    if empty_in > need then need = empty_in end
  end
end
local longest = full_in(tiers, owed)
if longest > need then need = longest end
if q > now and q - now > need then need = q - now end
if M then
  fields[#fields + 1] = 'M'
  fields[#fields + 1] = write_M(M, tiers)
end
need = keep_M(M, need)
local forward = {}
local until_ = finite(h[7])
if bring and refund and unit ~= '' and q > now and not spec.windows and not (until_ and until_ > now) and next(gave) then
  forward = bring_forward(resv_key, tiers, was, owed, gave, estimate, h[8], h[9], now, fields)
end
local t_field = write_T(tiers, owed, now, 0, (q > now or q == -1) and q or 0)
if not t_field and h[2] then redis.call('HDEL', key, 'T') end
-- (the lifetime after the deletions, which may have emptied the hash)
local ttl
local x0 = x
x, ttl = keep_alive(key, need, x, now)
if t_field then
  fields[#fields + 1] = 'T'
  fields[#fields + 1] = string.sub(t_field, 1, 8) .. bin_pack('<d', x) .. string.sub(t_field, 17)
end
-- The tenant's share: its finish tag moves with what it used.
if tenant and akey and q == -1 and redis.call('ZSCORE', akey, tenant) then
  local gh = redis.call('HMGET', key, 'G', 't:' .. tenant)
  local g, rec = read_G(gh[1] or nil, now), read_tenant(gh[2] or nil)
  if rec and g.W > 0 then
    local c = {}
    for i, t in ipairs(tiers) do
      if (t.unit or '') == unit then c[i] = math.abs(delta) else c[i] = 0 end
    end
    local u = cost_units(tiers, c)
    if delta < 0 then
      -- (never behind the clock: nobody is moved back for it)
      local back = math.min(u / rec.w, math.max(rec.F - g.V, 0))
      rec.F = rec.F - back
      rec.shift = rec.shift - back
      rec.units = math.max(rec.units - u, 0)
      if rec.F < g.Fmin then g.Fmin = rec.F end
      -- (the set's scores may be low, never high: fair_expire)
      redis.call('ZADD', akey, fmt(rec.F), tenant)
      fields[#fields + 1] = 'G'
      fields[#fields + 1] = pack_G(g)
    else
      rec.F = rec.F + u / rec.w
      rec.shift = rec.shift + u / rec.w
      rec.units = rec.units + u
      if rec.shift > g.Smax then
        g.Smax = rec.shift
        fields[#fields + 1] = 'G'
        fields[#fields + 1] = pack_G(g)
      end
    end
    fields[#fields + 1] = 't:' .. tenant
    fields[#fields + 1] = pack_tenant(rec)
  end
end
if parts_changed then
  fields[#fields + 1] = 'P'
  fields[#fields + 1] = write_P(P_until, parts, tiers)
end
if #fields > 0 then redis.call('HSET', key, unpack(fields)) end
if ttl then set_ttl(key, ttl) end
-- (the active tenants outlive the hash that counts them)
if x ~= x0 and akey then outlive(key, akey, 1e6) end
return forward

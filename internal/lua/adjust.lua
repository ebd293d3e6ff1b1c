-- adjust.lua: settle a cost after the fact (see admin.go): every tier of a
-- key in the unit settled (requests unless ARGV[7] names another) takes
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
-- Refunds reach the backlog. While a queue of reservations is outstanding,
-- its tasks were booked at their estimates: what a refund of another unit
-- than requests gives back is room none of them will take, and a task
-- already deferred comes back only at its instant. When the caller will
-- run them (ARGV[8]), the refund moves the schedule of the buckets it gave
-- back to (decide.lua's V) back by what it gave, as it moved the buckets,
-- and, for every charge's worth given back since the queue opened (P; the
-- charge of the call settling, the nearest thing to a booked task's cost
-- the script knows), brings the latest reservation forward: its instant
-- becomes now, and its task ID is returned for the caller to run the task
-- now (asynq's RunTask). The other reservations keep their instants and
-- the queue ends a task earlier: taken from the end and booked now, the
-- task leaves the schedule as long as it was, less the refund. The tiers
-- still decide when it comes back, as for any holder whose instant has
-- come: the schedule only plans. The latest first, so a backlog's last
-- tasks may run before earlier ones. Never on a key with a window (its
-- reserved calls are counted per sub-window at their instants), with
-- tenants (their turns are fair tags), or while suspended.
local FORWARD_AFTER = 1.5e6 -- us: reservations nearer come back by themselves soon (asynq holds a task until the whole second before its instant: throttle's forwardSoonest)

-- bring_forward moves the schedule back by what each bucket gave back
-- (gave, of owed before: was), adds the least of it, in tokens, to the
-- credit of the queue anchored as V's (P: "anchor credit"), brings forward
-- a reservation (the latest) for each charge's worth of credit, and adds
-- V and P to fields. It returns the IDs brought forward.
local function bring_forward(resv_key, tiers, was, gave, charged, V, P, now, fields)
  local va, sw, virt = read_V(V)
  if not va or charged <= 0 then return {} end
  local tokens = nil
  local vt = {}
  for i, t in ipairs(tiers) do
    if t.kind == 'b' then
      local v = virt[-t.id]
      if v == nil then v = was[i] / t.rate + (now - va) end
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
  local pa, pc = string.match(P or '', '^(%d+) (%S+)$')
  if tonumber(pa) == va then credit = tonumber(pc) or 0 end
  if not (credit >= 0 and credit < math.huge) then credit = 0 end
  credit = credit + (tokens or 0)
  local ids = {}
  local n = math.floor(credit / charged)
  if n > 0 then
    ids = redis.call('ZREVRANGEBYSCORE', resv_key, '+inf', '(' .. fmt(now + FORWARD_AFTER), 'LIMIT', 0, n)
    for _, id in ipairs(ids) do redis.call('ZADD', resv_key, 'XX', now, id) end
    -- (credit nothing far enough ahead could take is not kept)
    if #ids < n then credit = 0 else credit = credit - n * charged end
  end
  fields[#fields + 1] = 'P'
  fields[#fields + 1] = string.format('%d %.17g', va, credit)
  return ids
end

local key = KEYS[1]
local delta    = tonumber(ARGV[1])
local idle_us  = ARGV[2] * 1000
local defaults = ARGV[3]
local at       = tonumber(ARGV[4]) or 0    -- us: when the call was admitted (0 unknown)
local charged  = tonumber(ARGV[5]) or 0    -- what the call was charged so far
local call_gen = tonumber(ARGV[6]) or -1   -- the limits' generation it was admitted under
local unit     = ARGV[7] or ''             -- the unit settled ('': requests)
local bring    = ARGV[8] == '1'            -- the caller runs the reservations brought forward
local now = now_us()
local h = redis.call('HMGET', key, 'L', 'T', 'O', 'M', 's', 'V', 'P')
local src = h[1]
if not src and defaults ~= '' then src = defaults end
if not src or delta == 0 then return {} end
local spec = parse_limits(src)
if not spec then return {} end
if h[3] then spec = apply_learned(spec, src, h[3], now) end
local tiers = spec.tiers
local refund = delta < 0 and at > 0 and call_gen == spec.gen
local ts, x, q, stored = read_T(h[2], now)
local owed = bucket_owed(stored, ts, tiers, now, 0)
local fields, need = {}, 0
local gave, was = {}, {} -- what each bucket gave back, and owed before
-- On a key with units, what each bucket owed at least since the call
-- (refund_room) may come back too; every change here is sampled.
local M = nil
if spec.units then M = read_M(h[4] or nil, tiers) end
for i, t in ipairs(tiers) do
  if (t.unit or '') ~= unit then
    -- (another unit's tier: not this settlement's)
  elseif t.kind == 'b' then
    local v = owed[i]
    was[i] = v
    if M and M[i] then sample_M(M, i, v, now, false) end
    local given = 0
    if delta > 0 then
      v = v + delta * t.p
    elseif refund then
      local want = math.min(-delta, charged) * t.p
      local back = want - math.max(0, now - at) * t.rate
      if M then back = math.max(back, math.min(want, refund_room(M, i, at, v))) end
      if back > 0 then
        local before = math.max(v, 0)
        v = math.max(v - back, 0)
        given = before - v
      end
    end
    if v < 0 then v = 0 end
    owed[i] = v
    -- Every interval since the call owed that much less had the call cost
    -- that much less: a second refund that fit alone must not give back
    -- what this one took from the room (two calls refunded 40 each of a
    -- bucket that owed 40 at least: 80 tokens, half of them tokens a full
    -- bucket would have lost). (And what it owes after, now included.)
    if M and M[i] then refund_given(M, i, at, given, v) end
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
local ttl
x, ttl = keep_alive(need, h[1] ~= false, idle_us, x, now)
if M then
  fields[#fields + 1] = 'M'
  fields[#fields + 1] = write_M(M, tiers)
end
local forward = {}
local until_ = finite(h[5])
if bring and refund and unit ~= '' and q > now and not spec.windows and not (until_ and until_ > now) and next(gave) then
  forward = bring_forward(KEYS[2], tiers, was, gave, charged, h[6], h[7], now, fields)
end
local t_field = write_T(tiers, owed, now, x, (q > now or q == -1) and q or 0)
if t_field then
  fields[#fields + 1] = 'T'
  fields[#fields + 1] = t_field
elseif h[2] then
  redis.call('HDEL', key, 'T')
end
if #fields > 0 then redis.call('HSET', key, unpack(fields)) end
if ttl then expire_in(key, ttl) end
return forward

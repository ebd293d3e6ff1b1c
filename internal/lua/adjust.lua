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
local key = KEYS[1]
local delta    = tonumber(ARGV[1])
local idle_us  = ARGV[2] * 1000
local defaults = ARGV[3]
local at       = tonumber(ARGV[4]) or 0    -- us: when the call was admitted (0 unknown)
local charged  = tonumber(ARGV[5]) or 0    -- what the call was charged so far
local call_gen = tonumber(ARGV[6]) or -1   -- the limits' generation it was admitted under
local unit     = ARGV[7] or ''             -- the unit settled ('': requests)
local now = now_us()
local h = redis.call('HMGET', key, 'L', 'T', 'O', 'M')
local src = h[1]
if not src and defaults ~= '' then src = defaults end
if not src or delta == 0 then return 0 end
local spec = parse_limits(src)
if not spec then return 0 end
if h[3] then spec = apply_learned(spec, src, h[3], now) end
local tiers = spec.tiers
local refund = delta < 0 and at > 0 and call_gen == spec.gen
local ts, x, q, stored = read_T(h[2], now)
local owed = bucket_owed(stored, ts, tiers, now, 0)
local fields, need = {}, 0
-- On a key with units, what each bucket owed at least since the call
-- (refund_room) may come back too; every change here is sampled.
local M = nil
if spec.units then M = read_M(h[4] or nil, tiers) end
for i, t in ipairs(tiers) do
  if (t.unit or '') ~= unit then
    -- (another unit's tier: not this settlement's)
  elseif t.kind == 'b' then
    local v = owed[i]
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
local t_field = write_T(tiers, owed, now, x, (q > now or q == -1) and q or 0)
if t_field then
  fields[#fields + 1] = 'T'
  fields[#fields + 1] = t_field
elseif h[2] then
  redis.call('HDEL', key, 'T')
end
if #fields > 0 then redis.call('HSET', key, unpack(fields)) end
if ttl then expire_in(key, ttl) end
return 1

-- setlimits.lua: replace a key's limits atomically (see admin.go). Each new
-- tier takes over the state of the old tier of the same kind and period,
-- wherever it sits in the list: a bucket's tokens are brought up to date
-- under the old limits (from Redis, else the defaults the buckets were
-- computed under, else the caller's defaults), then clamped to the new
-- burst; a window keeps the calls it counted. A raise grants no sudden
-- burst, a lowered burst bites at once, and a tier whose period is new
-- starts full. The generation is bumped. The reservation queue is dropped:
-- its slots were spaced for the old limits; the reply names the tasks that
-- held one, for the caller to bring back to be decided anew. The fair
-- shares' state goes with it (fair.lua: the clock, the active tenants, the
-- start tags): the tenants' finish tags count the work those reservations
-- booked, and the tasks brought back would queue behind it. Limits equal
-- to those in force change nothing (but for the configuration's own copy,
-- written when it lacks them: a key configured before it existed).
-- The limits go to the configuration (:c, kept until Delete) and to the
-- key's hash, whose lifetime is its state's: no path shortens it.
local key, resv_key, kc, tenants_key, tags_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local MAX_BACK = 100000
local new_src  = ARGV[1]
local defaults = ARGV[2]

local new, field, why = parse_limits(new_src)
if not new then return {-1, field, why} end

local now = now_us()
local h = redis.call('HMGET', key, 'L', 'T', 'D', 's', 'O', 'P')
local has_copy = h[1] or h[3]   -- the hash holds its copy of the configuration
local cur = config_of(kc, h[1], h[3])
-- The limits already in force: nothing changes, not even the queue (every
-- worker of a fleet may set its limits when it starts).
if cur and string.gsub(cur, '%s*#%d+', '') == new_src then
  if redis.call('HEXISTS', kc, 'L') == 0 then redis.call('HSET', kc, 'L', cur) end
  return {1, new.gen, 0}
end
h[1] = cur or false
local old = nil
for _, src in ipairs({h[1] or '', h[3] or '', defaults}) do
  if src ~= '' then
    old = parse_limits(src)
    -- The tokens are brought up to date under the limits that were in
    -- force: learned ones included.
    if old and h[5] then old = apply_learned(old, src, h[5], now) end
    if old then break end
  end
end
local gen = string.match(h[1] or '', '#(%d+)')
gen = gen and tonumber(gen) or 0
if gen >= 1e15 then gen = 0 end
gen = gen + 1

-- What each new bucket owes (per_us units of tokens), at now.
local ts, _, _, stored = read_T(h[2], now)
local old_owed = old and bucket_owed(stored, ts, old.tiers, now, 0) or {}
-- ... and kept under the new limits as they will be in force.
local in_force = new
if h[5] then in_force = apply_learned(new, new_src, h[5], now) end
local owed = {}
-- A provider's debt (P, see read_P): its part of what a kept bucket owes
-- is carried over (the calls alone keep their tokens as much); a new
-- bucket has none.
local P_until, parts = read_P(h[6] or nil)
if not (P_until and P_until > now) then parts = nil end
local new_parts = {}
for i, t in ipairs(in_force.tiers) do
  local v = 0
  if t.kind == 'b' then
    local o = nil
    if old then
      for j, ot in ipairs(old.tiers) do
        if ot.key == t.key then o = j break end
      end
    end
    if o then
      -- Tokens kept, clamped to the new burst: owes what the new burst
      -- lacks of them.
      v = old_owed[o] - (old.tiers[o].burst - t.burst) * t.p
    elseif stored[-t.id] then
      -- State without the limits it was computed under: the tokens it owed
      -- at ts, with no refill since (the rate it had is unknown).
      v = stored[-t.id]
      if ts and now < ts then v = v + math.min(ts - now, MAX_SKEW) * t.rate end
    end
    if v < 0 then v = 0 end
    -- (debt a surcharge left is kept; only garbage is read as empty)
    if v > t.full + MAX_BURST * t.p then v = t.full end
    local id = string.format('%d', t.id)
    if o and parts and parts[id] then
      local shift = (old.tiers[o].burst - t.burst) * t.p
      new_parts[id] = debt_through(old.tiers[o], parts[id], old_owed[o], v, function(calls)
        return math.min(math.max(calls - shift, 0), v)
      end)
    end
  end
  owed[i] = v
end

local need = full_in(in_force.tiers, owed)
local L = new_src .. ' #' .. string.format('%d', gen)
-- Windows that are gone lose their counts; the others keep them.
local drop = {'T', 'D', 'V', 'M', 'B', 'A', 'AH'}
if old then
  for _, ot in ipairs(old.tiers) do
    if ot.kind == 'w' then
      local kept = false
      for _, t in ipairs(new.tiers) do
        if t.key == ot.key then kept = true end
      end
      if not kept then drop[#drop + 1] = 'W' .. ot.key end
    end
  end
end
redis.call('HDEL', key, unpack(drop))
-- A hash that lost its copy of the configuration (it expired idle, or
-- never had one) gets all of :c back first: a hash with L is read as the
-- whole configuration, and the tenants' weights would be gone from it.
if not has_copy and kc and kc ~= '' then restore_config(key, kc) end
set_config(key, kc, {'L', L})
-- (the lifetime after the writes: the deletions may have emptied the hash,
-- and the limits made a new one)
local x, ttl = keep_alive(key, need, 0, now)
local t_field = write_T(in_force.tiers, owed, now, x, 0)
if t_field then redis.call('HSET', key, 'T', t_field) end
if parts and t_field then
  redis.call('HSET', key, 'P', write_P(P_until, new_parts, in_force.tiers))
elseif parts then
  redis.call('HDEL', key, 'P')
end
if ttl then set_ttl(key, ttl) end
-- The tasks that held a reservation (the caller brings them back to be
-- decided under the new limits; at most MAX_BACK of them).
local held = redis.call('ZRANGE', resv_key, 0, MAX_BACK - 1)
redis.call('DEL', resv_key)
-- The fair shares' state goes too, tenants' records included (a record
-- left behind counted an inactive tenant's weight in the next SetWeights).
drop_fair(key, tenants_key, tags_key)
local out = {1, gen, 1}
for i = 1, #held do out[3 + i] = held[i] end
return out

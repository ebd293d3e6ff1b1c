-- setlimits.lua: replace a key's limits atomically (see setlimits.go).
-- Each new tier takes over the tokens of the old tier with the same period,
-- wherever it sits in the list: they are brought up to date under the old
-- limits (from Redis, else the defaults the buckets were computed under,
-- else the caller's defaults), then clamped to the new burst. A raise keeps
-- the tokens (no sudden burst), a lowered burst bites at once, and a tier
-- whose period is new starts full. The reservation queue is dropped: its
-- slots were spaced for the old limits; tasks that held one come back when
-- they were told to and are decided anew.
local key, resv_key = KEYS[1], KEYS[2]
local idle_us  = ARGV[1] * 1000
local new_src  = ARGV[2]
local defaults = ARGV[3]

local new, field, why = parse_limits(new_src)
if not new then return {-1, field, why} end

local now = now_us()
local h = redis.call('HMGET', key, 'L', 'T', 'D', 's', 'g')
local old = nil
for _, src in ipairs({h[1] or '', h[3] or '', defaults}) do
  if src ~= '' then
    old = parse_limits(src)
    if old then break end
  end
end

-- What each new tier owes (per_us units of tokens), at now.
local owed = {}
local stored = {}
local ts = h[2] and string.match(h[2], '^(%d+) ')
ts = ts and tonumber(ts)
if ts then stored = read_pairs(h[2], ' (%d+):(%d+)') end
local old_owed = old and bucket_owed(h[2], old, now) or {}
for i, t in ipairs(new) do
  local v = 0
  local o = nil
  if old then
    for j, ot in ipairs(old) do
      if ot.per == t.per then o = j break end
    end
  end
  if o then
    -- Tokens kept, clamped to the new burst: owes what the new burst
    -- lacks of them.
    v = old_owed[o] - (old[o].burst - t.burst) * t.p
  elseif stored[t.key] then
    -- State without the limits it was computed under: the tokens it owed
    -- at ts, with no refill since (the rate it had is unknown).
    v = stored[t.key]
    if now < ts then v = v + (ts - now) * t.rate end
  end
  if v < 0 then v = 0 end
  if v > t.full + MAX_SKEW * t.rate then v = t.full end
  owed[i] = v
end

local fields = {'L', new_src}
local t_field, need = write_owed(new, owed, now)
if t_field then
  fields[#fields + 1] = 'T'
  fields[#fields + 1] = t_field
end
local until_ = finite(h[4])
if until_ and until_ - now > need then need = until_ - now end
-- The expiry is recomputed for the new limits: forget the memo.
local ttl = keep_alive(need, true, idle_us, nil, now, fields)
local gen = finite(h[5]) or 0
if gen < 0 or gen >= 1e15 or gen ~= math.floor(gen) then gen = 0 end
gen = gen + 1
fields[#fields + 1] = 'g'
fields[#fields + 1] = string.format('%d', gen)
redis.call('HDEL', key, 'T', 'D', 'q', 'a', 'V')
redis.call('HSET', key, unpack(fields))
expire_in(key, ttl)
redis.call('DEL', resv_key)
return {1, gen}

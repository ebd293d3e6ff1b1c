-- suspend.lua: suspend a key fleet-wide, extending and never shortening an
-- existing suspension (see admin.go for the contract). With adaptive limits
-- (an 'a' token in L), a new suspension (not one extending the last) also
-- cuts the rate tiers to ADAPT_CUT of what was in force, fleet-wide, once
-- (unless ARGV[3] is '1': a spend cap, which says nothing of the rate);
-- one that extends the last moves the start of the clean intervals to its
-- new end.
local key, kc, akey = KEYS[1], KEYS[2], KEYS[3]
local d, max = tonumber(ARGV[1]), tonumber(ARGV[2])
local adapts = ARGV[3] ~= '1'   -- '1': no adaptive cut (a spend cap is no rate limit)
if d > max then d = max end
local now = now_us()
local until_ = now + d
local h = redis.call('HMGET', key, 's', 'L', 'O', 'D')
h[2] = config_of(kc, h[2], h[4]) or false
local cur = finite(h[1])
-- A stored end beyond any honest wait is garbage, not a suspension to keep.
local fresh = not cur or cur <= now
if cur and cur > until_ and cur - now <= MAX_WAIT then until_ = cur end
local fields = {'s', string.format('%d', until_)}
local ppm = -1
local spec = h[2] and parse_limits(h[2])
if spec and spec.adaptive and adapts then
  local learned, adapt = read_O(h[3])
  if fresh then
    ppm = math.max(ADAPT_FLOOR, math.floor(adapt_ppm(spec, adapt, now) * ADAPT_CUT))
    -- Clean intervals count from the end of the suspension.
    fields[#fields + 1] = 'O'
    fields[#fields + 1] = write_O(learned, {ppm, until_}, now)
    set_config(key, kc, {'L', bump_gen(h[2])})
  elseif adapt and adapt[2] < until_ and adapt_ppm(spec, adapt, now) < 1e6 then
    -- Extended: clean intervals count from the new end, none while the
    -- key is still suspended (the factor in force now is kept).
    fields[#fields + 1] = 'O'
    fields[#fields + 1] = write_O(learned, {adapt_ppm(spec, adapt, now), until_}, now)
  end
end
redis.call('HSET', key, unpack(fields))
-- The key lives at least until the suspension ends (never shorter than it did).
extend_to(key, until_ - now)
-- (the active tenants outlive the hash that counts them)
if akey then extend_to(akey, until_ - now + 1e6) end
return {string.format('%d', until_ - now), ppm}

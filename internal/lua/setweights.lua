-- setweights.lua: set the weights of a key's tenants (see admin.go),
-- replacing the ones set before: a tenant not named weighs 1.
--
--   KEYS[1] bucket hash   KEYS[2] the active tenants (fair.lua)
--   ARGV[1] the limits' inactivity expiry, ms: the weights live as long
--   then tenant, weight, ...: the weights (whole numbers, 1 to 1e6)
--
-- An active tenant (one with work booked: in the set of active tenants,
-- while the clock counts any) counts with its new weight at once: the sum
-- W of the fair clock follows. A record of a tenant that is not active is
-- stale and counts nothing: counted, it gave an idle key a weight no
-- tenant holds, and a tenant alone on it a fraction of the rate. Weights live in fields
-- w:<tenant>, listed in WL (one name per line: names are printable).
local key, akey = KEYS[1], KEYS[2]
local now = now_us()
local h = redis.call('HMGET', key, 'WL', 'G')
local new, names = {}, {}
local idle_ms = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  new[ARGV[i]] = tonumber(ARGV[i + 1])
  names[#names + 1] = ARGV[i]
end
local touched, del = {}, {}
for name in string.gmatch(h[1] or '', '[^\n]+') do
  if new[name] == nil then
    touched[#touched + 1] = name
    del[#del + 1] = 'w:' .. name
  end
end
for _, name in ipairs(names) do touched[#touched + 1] = name end
local g = read_G(h[2] or nil, now)
local fields = {}
local changed = false
for _, name in ipairs(touched) do
  local rec = nil
  if g.W > 0 and (not akey or redis.call('ZSCORE', akey, name)) then
    rec = read_tenant(redis.call('HGET', key, 't:' .. name) or nil)
  end
  if rec then
    local w = new[name] or 1
    g.W = g.W - rec.w + w
    fields[#fields + 1] = 't:' .. name
    fields[#fields + 1] = bin_pack('<ddd', rec.F, w, rec.units)
    changed = true
  end
end
if changed then
  fields[#fields + 1] = 'G'
  fields[#fields + 1] = bin_pack('<dddddd', g.V, g.tV, g.W, g.Fmin, g.sw, g.Vs)
end
for _, name in ipairs(names) do
  fields[#fields + 1] = 'w:' .. name
  fields[#fields + 1] = string.format('%d', new[name])
end
if #names > 0 then
  fields[#fields + 1] = 'WL'
  fields[#fields + 1] = table.concat(names, '\n')
else
  del[#del + 1] = 'WL'
end
if #del > 0 then redis.call('HDEL', key, unpack(del)) end
if #fields > 0 then
  redis.call('HSET', key, unpack(fields))
  if redis.call('PTTL', key) < idle_ms then redis.call('PEXPIRE', key, idle_ms) end
end
return #names

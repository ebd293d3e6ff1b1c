-- setweights.lua: set the weights of a key's tenants (see admin.go),
-- replacing the ones set before: a tenant not named weighs 1.
--
--   KEYS[1] bucket hash   KEYS[2] the active tenants (fair.lua)
--   KEYS[3] the configuration (lib.lua: kept until Delete)
--   ARGV tenant, weight, ...: the weights (whole numbers, 1 to 1e6)
--
-- An active tenant (one with work booked: in the set of active tenants,
-- while the clock counts any) counts with its new weight at once: the sum
-- W of the fair clock follows. A record of a tenant that is not active is
-- stale and counts nothing: counted, it gave an idle key a weight no
-- tenant holds, and a tenant alone on it a fraction of the rate. Weights
-- live in fields w:<tenant>, listed in WL (one name per line: names are
-- printable), in the configuration and its copy in the key's hash.
local key, akey, kc = KEYS[1], KEYS[2], KEYS[3]
local now = now_us()
local h = redis.call('HMGET', key, 'WL', 'G')
local wl = h[1] or redis.call('HGET', kc, 'WL') or nil
local new, names = {}, {}
for i = 1, #ARGV, 2 do
  new[ARGV[i]] = tonumber(ARGV[i + 1])
  names[#names + 1] = ARGV[i]
end
local touched, del = {}, {}
for name in string.gmatch(wl or '', '[^\n]+') do
  if new[name] == nil then
    touched[#touched + 1] = name
    del[#del + 1] = 'w:' .. name
  end
end
for _, name in ipairs(names) do touched[#touched + 1] = name end
local g = read_G(h[2] or nil, now)
local state = {}
local changed = false
for _, name in ipairs(touched) do
  local rec = nil
  if g.W > 0 and redis.call('ZSCORE', akey, name) then
    rec = read_tenant(redis.call('HGET', key, 't:' .. name) or nil)
  end
  if rec then
    local w = new[name] or 1
    g.W = g.W - rec.w + w
    -- The work it has booked is so much virtual time at its weight: at its
    -- new weight, that much less (or more). Its finish tag moves with it,
    -- and its booked tasks' tags by the same (the shift; read_tenant): kept
    -- as they were, work booked at a weight of 1 took 17 times longer
    -- under a weight of 8 out of 17.
    if rec.F > g.V and w ~= rec.w then
      local F = g.V + (rec.F - g.V) * rec.w / w
      rec.shift = rec.shift + (F - rec.F)
      rec.F = F
      if F < g.Fmin then g.Fmin = F end
      if rec.shift > g.Smax then g.Smax = rec.shift end
      redis.call('ZADD', akey, fmt(F), name)
    end
    state[#state + 1] = 't:' .. name
    state[#state + 1] = pack_tenant(rec, w)
    changed = true
  end
end
if changed then
  state[#state + 1] = 'G'
  state[#state + 1] = pack_G(g)
end
local config = {}
for _, name in ipairs(names) do
  config[#config + 1] = 'w:' .. name
  config[#config + 1] = string.format('%d', new[name])
end
if #names > 0 then
  config[#config + 1] = 'WL'
  config[#config + 1] = table.concat(names, '\n')
else
  del[#del + 1] = 'WL'
end
set_config(key, kc, config, del)
if #state > 0 then redis.call('HSET', key, unpack(state)) end
-- (the hash may be new: it lives at least a second, then with its state)
extend_to(key, 1e6)
return #names

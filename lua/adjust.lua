-- adjust.lua: settle a cost after the fact (see admin.go): every tier of a
-- key takes delta more calls' worth as of now, or gives -delta back. A
-- bucket never holds more than its burst; a window gives back from its
-- latest calls and never counts below zero.
local key = KEYS[1]
local delta    = tonumber(ARGV[1])
local idle_us  = ARGV[2] * 1000
local defaults = ARGV[3]
local now = now_us()
local h = redis.call('HMGET', key, 'L', 'T', 'O')
local src = h[1]
if not src and defaults ~= '' then src = defaults end
if not src or delta == 0 then return 0 end
local spec = parse_limits(src)
if not spec then return 0 end
if h[3] then spec = apply_learned(spec, src, h[3], now) end
local tiers = spec.tiers
local ts, x, q, stored = read_T(h[2])
local owed = bucket_owed(stored, ts, tiers, now, 0)
local fields, need = {}, 0
for i, t in ipairs(tiers) do
  if t.kind == 'b' then
    local v = owed[i] + delta * t.p
    if v < 0 then v = 0 end
    owed[i] = v
  else
    local f = 'W' .. t.key
    local w = win_load(redis.call('HGET', key, f), t, now, 0)
    if delta > 0 then
      win_add(w, t, now, delta)
    else
      local back = -delta
      for idx = math.floor(now / t.sub), math.floor((now - t.p) / t.sub) - 1, -1 do
        local c = w.c[-idx] or 0
        local take = math.min(c, back)
        if take > 0 then
          w.c[-idx] = c - take
          back = back - take
        end
        if back == 0 then break end
      end
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
local _, full_in = write_T(tiers, owed, now, 0, 0)
if full_in > need then need = full_in end
if q > now and q - now > need then need = q - now end
local ttl
x, ttl = keep_alive(need, h[1] ~= nil, idle_us, x, now)
local t_field = write_T(tiers, owed, now, x, q > now and q or 0)
if t_field then
  fields[#fields + 1] = 'T'
  fields[#fields + 1] = t_field
elseif h[2] then
  redis.call('HDEL', key, 'T')
end
if #fields > 0 then redis.call('HSET', key, unpack(fields)) end
if ttl then expire_in(key, ttl) end
return 1

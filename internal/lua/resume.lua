-- resume.lua: end a key's suspension at once (see admin.go). The
-- reservation schedule built during the suspension is dropped with it: its
-- reserved times all lie after the old end, and fresh callers would wait
-- behind them (so are the windows' reserved calls). So is the state of
-- fair shares (fair.lua: the clock, the active tenants and their records,
-- the start tags): the tenants' finish tags count the work those
-- reservations booked, and the tasks brought back, decided as fresh ones,
-- would queue behind their own work and never be reached. Weights stay.
-- The reply names the tasks that held a reservation, whichever path booked
-- it (the middleware, or Limiter.Enqueue), for the caller to bring back.
local key, resv_key, tenants_key, tags_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local MAX_BACK = 100000
local now = now_us()
local h = redis.call('HMGET', key, 's', 'T')
local until_ = finite(h[1])
if until_ == nil or until_ <= now then
  redis.call('HDEL', key, 's')
  return {'0'}
end
local held = redis.call('ZRANGE', resv_key, 0, MAX_BACK - 1)
redis.call('HDEL', key, 's', 'V')
redis.call('DEL', resv_key)
local ts, x, q, stored = read_T(h[2], now)
if ts and q ~= 0 then
  -- The same field, without the queue's end (nor the mark of active
  -- tenants, -1: none is active now).
  redis.call('HSET', key, 'T', string.sub(h[2], 1, 16) .. bin_pack('<d', 0) .. string.sub(h[2], 25))
end
drop_fair(key, tenants_key, tags_key)
for _, f in ipairs(redis.call('HKEYS', key)) do
  if string.sub(f, 1, 1) == 'W' then
    local w = redis.call('HGET', key, f)
    local stripped = string.gsub(w, '|.*$', '')
    if stripped ~= w then redis.call('HSET', key, f, stripped) end
  end
end
local out = {string.format('%d', math.min(until_ - now, MAX_WAIT))}
for i = 1, #held do out[1 + i] = held[i] end
return out

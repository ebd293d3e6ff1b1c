-- resume.lua: end a key's suspension at once (see admin.go). The
-- reservation schedule built during the suspension is dropped with it: its
-- reserved times all lie after the old end, and fresh callers would wait
-- behind them (so are the windows' reserved calls). Tasks that held one come back when
-- they were told to and are decided anew.
local key, resv_key = KEYS[1], KEYS[2]
local now = now_us()
local h = redis.call('HMGET', key, 's', 'T')
local until_ = finite(h[1])
if until_ == nil or until_ <= now then
  redis.call('HDEL', key, 's')
  return '0'
end
redis.call('HDEL', key, 's', 'V')
redis.call('DEL', resv_key)
local ts, x, q, stored = read_T(h[2], now)
if ts and q > 0 then
  -- The same field, without the queue's end.
  redis.call('HSET', key, 'T', string.sub(h[2], 1, 16) .. bin_pack('<d', 0) .. string.sub(h[2], 25))
end
for _, f in ipairs(redis.call('HKEYS', key)) do
  if string.sub(f, 1, 1) == 'W' then
    local w = redis.call('HGET', key, f)
    local stripped = string.gsub(w, '|.*$', '')
    if stripped ~= w then redis.call('HSET', key, f, stripped) end
  end
end
return string.format('%d', math.min(until_ - now, MAX_WAIT))

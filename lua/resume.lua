-- resume.lua: end a key's suspension at once (see admin.go). The
-- reservation schedule built during the suspension is dropped with it: its
-- slots all lie after the old end, and fresh callers would wait behind them.
-- Tasks that held one come back when they were told to and are decided anew.
local key, resv_key, old_suspend = KEYS[1], KEYS[2], KEYS[3]
local now = now_us()
local until_ = finite(redis.call('HGET', key, 's'))
redis.call('DEL', old_suspend)
if until_ == nil or until_ <= now then
  redis.call('HDEL', key, 's')
  return '0'
end
redis.call('HDEL', key, 's', 'q', 'a', 'V')
redis.call('DEL', resv_key)
return string.format('%d', math.min(until_ - now, MAX_WAIT))

-- setlimits.lua: replace a key's limits atomically (see lua.go for the contract).
-- Tokens are first brought up to date under the old limits (from Redis, or
-- the caller's defaults when Redis has none), then clamped to the new bursts,
-- so a change neither grants a fresh burst nor loses debt.
-- The reservation queue is dropped: its slots were spaced for the old limits.
-- Tasks that held one come back when they were told to and are decided anew.
local cfg_key, state_key, resv_key = KEYS[1], KEYS[2], KEYS[3]
local idle_ms = tonumber(ARGV[1])
local NEW_AT = 2
local n_new = tonumber(ARGV[NEW_AT]) or 0
local DEFAULTS_AT = NEW_AT + 1 + 3 * n_new

local now = now_us()
local new, field, why = tiers_from_argv(ARGV, NEW_AT)
if not new then return {-1, field or 'tiers', why or 'missing'} end

local old = load_tiers(cfg_key, ARGV, DEFAULTS_AT)   -- nil when none or invalid
local state = read_state(state_key)
if old and state.ts then
  local tokens = refill(state, old, now)
  local kept = {}
  for i, t in ipairs(new) do
    local v = tokens[i] or t.burst
    if v > t.burst then v = t.burst end
    kept[i] = v
  end
  local fields = {}
  write_tokens(fields, state, new, kept, now)
  redis.call('HSET', state_key, unpack(fields))
  drop_extra_tiers(state_key, state, new)
  -- The next decision recomputes the expiry it needs (xp unknown).
  redis.call('HDEL', state_key, 'xp')
  expire_in(state_key, full_after(state, new, kept, now) + 1e6)
end

local args = {'tiers', ARGV[NEW_AT]}
for i = 1, #new do
  local at = NEW_AT + 1 + (i - 1) * 3
  args[#args + 1] = 'rate:' .. i;   args[#args + 1] = ARGV[at]
  args[#args + 1] = 'per_ms:' .. i; args[#args + 1] = ARGV[at + 1]
  args[#args + 1] = 'burst:' .. i;  args[#args + 1] = ARGV[at + 2]
end
redis.call('DEL', cfg_key, resv_key)
redis.call('HDEL', state_key, 'vnext', 'va', 'vt:1', 'vt:2', 'vt:3', 'vt:4', 'cr')
redis.call('HSET', cfg_key, unpack(args))
expire_in(cfg_key, idle_ms * 1000)
return {1}

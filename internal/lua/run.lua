-- run.lua: the decide function itself, after decide.lua and fair.lua.

-- OWED and STORED are the tables of what the buckets owe and what T
-- stored, made once per function library and refilled by every run (a new
-- one per run costs a lone Take 1k instructions in allocation and garbage
-- collection).
local OWED, STORED = {}, {}

-- COSTV is the cost vector of a lone caller on a key with units whose
-- cost is not kept (cost_miss), refilled by every such run: take_now only
-- reads it.
local COSTV = {}

-- MREC is the M field's records as read (read_M), refilled by every run of
-- a key with units that samples a change.
local MREC = {}

-- HM_FIELDS are the hash fields every run reads first (h[1] to h[8]).
local HM_FIELDS = {'L', 'T', 's', 'O', 'V', 'M', 'D', 'AH'}
local D_AT, D_AT_FAIR = 7, 8   -- where D is in HM_FIELDS, and in fair_fields

-- fair_fields adds to the run's first HMGET what the fair path reads: the
-- clock, the last yield (fair_yields), and for each caller (ARGV from 2,
-- triples task ID, cost, tenant) its tenant's record and weight.
local function fair_fields(ARGV, n)
  local f = {'L', 'T', 's', 'O', 'V', 'G', 'Y', 'D'}
  for k = 1, n do
    local tenant = ARGV[CALLERS_AT + 3 * (k - 1) + 2] or ''
    f[#f + 1] = 't:' .. tenant
    f[#f + 1] = 'w:' .. tenant
  end
  return f
end

-- fair_tags reads the start tags of the callers' reservations (KEYS[6],
-- by task ID) into stags, in one command; none for callers without an ID.
local function fair_tags(KEYS, ARGV, n, stags)
  local ids = {}
  for k = 1, n do
    local id = ARGV[CALLERS_AT + 3 * (k - 1)] or ''
    if id ~= '' then ids[#ids + 1] = id end
  end
  if #ids == 0 then return end
  local v = redis.call('ZMSCORE', KEYS[6], unpack(ids))
  for i = 1, #ids do
    local s = tonumber(v[i])
    if s and s == s and s > -math.huge and s < math.huge then stags[ids[i]] = s end
  end
end

-- weight_of reads a tenant's weight field (absent or not a whole number
-- from 1 to 1e6: 1).
local function weight_of(raw)
  local w = tonumber(raw)
  if not w or w < 1 or w > 1e6 or w ~= math.floor(w) then return 1 end
  return w
end

-- decide_fair_run decides for the callers of a fair run: triples (task
-- ID, cost, tenant) from ARGV[2].
local function decide_fair_run(r, KEYS, ARGV, h, n)
  fair_state(r, KEYS, {G = h[6] or nil})
  r.yielded = h[7] or nil
  r.taken, r.write_extra = true, fair_write
  r.vnext, r.queue_open = 0, false
  fair_tags(KEYS, ARGV, n, r.stags)
  local replies = {}
  for k = 1, n do
    local at = CALLERS_AT + 3 * (k - 1)
    local id, tenant = ARGV[at] or '', ARGV[at + 2] or ''
    local c = cost_vec(ARGV[at + 1] or '1', r.spec)
    local base = D_AT_FAIR + 2 * (k - 1)
    tenant_of(r, tenant, h[base + 1] or nil)
    if k == 1 then fair_clock(r) end
    replies[k] = decide_fair(r, id, c, tenant, weight_of(h[base + 2]))
  end
  return replies
end

-- decide_run is the decide function: it decides for every caller of the
-- run and returns their replies joined by ';'.
local function decide_run(KEYS, ARGV)
  local o = read_options(ARGV[1])
  local stride = o.fair and 3 or 2
  local n = math.floor((#ARGV - 1) / stride)
  if n < 1 then n = 1 end
  -- The first caller's task ID and cost; a lone caller without a task ID
  -- sends its cost alone (AppendCallers, decide.go).
  local lone_id, lone_cost = ARGV[CALLERS_AT], ARGV[CALLERS_AT + 1]
  if #ARGV == CALLERS_AT and not o.fair then
    lone_cost = lone_id -- (then the ID: gopher-lua may assign in order)
    lone_id = ''
  end
  local now = now_us()
  local fields = o.fair and fair_fields(ARGV, n) or HM_FIELDS
  local h = redis.call('HMGET', KEYS[1], unpack(fields))
  if not h[1] and not h[o.fair and D_AT_FAIR or D_AT] then
    -- No limits in the hash, and no mark of a key on defaults: the hash
    -- may have expired with its state; the configuration (limits,
    -- weights) is copied back from :c, and read again with it.
    local _, any = restore_config(KEYS[1], KEYS[4])
    if any then h = redis.call('HMGET', KEYS[1], unpack(fields)) end
  end
  local spec, L, until_ = read_limits(o, h, now)
  if not spec then return all_n(L, n) end
  local ts, x, vnext, stored = read_T(h[2], now, STORED)
  -- Tenants share this key (-1): a caller that did not say its tenant is
  -- told to ask again as the default tenant.
  if vnext < 0 and not o.fair then return all_n('-4', n) end
  if vnext > now + o.horizon + MAX_SKEW then vnext = 0 end
  local owed = bucket_owed(stored, ts, spec.tiers, now, o.headroom, OWED)
  -- A key with units keeps what its buckets owed at least (M), sampled
  -- before this run changes anything, for refunds (refund_room).
  -- It is written back only when a sample changed it (most samples do
  -- not lower the least owed): Mw, nil when it stays as it is.
  -- (AH: the calls counted at instants ahead, which the calls made so far
  -- do not owe yet: M samples what those owe)
  local Mw, AH, AH_dropped = nil, nil, false
  if spec.units then
    local rawM, rawAH = h[6], h[8]
    if o.fair then
      local f = redis.call('HMGET', KEYS[1], 'M', 'AH') -- (h[6] is G there)
      rawM, rawAH = f[1], f[2]
    end
    if rawAH then AH, AH_dropped = read_AH(rawAH, now) end
    local k, same = spec.m1, false
    if AH and #AH > 0 then k = nil end
    if k and rawM and #rawM >= 32 then
      -- One bucket of another unit, the common case: sample_M's rules on
      -- its latest interval as read (read_M's), without building M when
      -- they change nothing: a sample no lower than the interval's least,
      -- within M_SLICE of its start.
      if not bin_pack then pick_codec() end
      local id, cnt = bin_unpack('<dd', rawM)
      if id == spec.tiers[k].id and #rawM == 16 + 16 * cnt then
        local st, w = bin_unpack('<dd', rawM, #rawM - 15)
        local v = owed[k]
        if v < 0 then v = 0 end
        same = st == st and w == w and not (v < w) and now - st < M_SLICE
      end
    end
    if not same then
      local M
      M, same = read_M(rawM or nil, spec.tiers, MREC)
      local tiers = spec.tiers
      for i = 1, #tiers do
        local t = tiers[i]
        local v = owed[i]
        if AH and t.kind == 'b' then v = v - ahead_of(AH, t, now) end
        if t.kind == 'b' and t.unit and sample_M(M, i, v, now, true) then same = false end
      end
      if not same then Mw = M end
    end
  end
  -- The common case: one caller admitted now. With tenants, while none is
  -- active (T's queue end is not -1): nobody's turn is at stake, and a
  -- tenant becomes active once it is refused. (Then no reservation of the
  -- key has a start tag that matters: its tenant's work is done.)
  if n == 1 and not (until_ and until_ > now) and not spec.windows and not spec.inflight and
      vnext <= now and not o.book and vnext >= 0 then
    local raw, c = lone_cost, 1
    if spec.units then
      raw = raw or '1'
      c = spec.costs[raw] or cost_miss(raw, spec, COSTV)
    elseif raw then
      c = cost_vec(raw, spec)
    end
    local reply = take_now(KEYS[1], KEYS[4], o, now, L, h[2] ~= false, spec, owed, x, c, Mw)
    if reply then return reply end
  end
  local r = run_state(KEYS, o, now, L, h, spec, until_, owed, x, vnext)
  r.M = Mw
  if spec.units then r.AH, r.AH_changed = AH or {}, AH_dropped end
  local replies
  if o.fair and #spec.tiers > 0 then
    replies = decide_fair_run(r, KEYS, ARGV, h, n)
  else
    -- (A key of slots in flight alone has no rate to share: first come,
    -- first served, as without tenants.)
    replies = {}
    for k = 1, n do
      local at = CALLERS_AT + stride * (k - 1)
      local id, raw = ARGV[at], ARGV[at + 1]
      if k == 1 then id, raw = lone_id, lone_cost end
      replies[k] = decide_one(r, id or '', cost_vec(raw or '1', spec))
    end
  end
  write_back(r)
  if n == 1 then return replies[1] end
  return table.concat(replies, ';')
end

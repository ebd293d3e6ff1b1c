-- decide.lua: the throttling decision (decide.go states its keys, arguments
-- and reply). In a function library these functions are defined once, when
-- the library loads; the decide function is decide_run, at the end.
--
-- The specification is in Go: the reference models of
-- throttle/property_test.go (token buckets, windows, reservations, pacing,
-- leases, learned limits) and throttle/property_slots_test.go (in-flight
-- limits), which rapid checks this script against, call by call. A change
-- of rule starts there.
--
-- One run decides for each caller it is given, in order, as if each had
-- called alone at the same instant: the decisions one process asks for at
-- once share one script run, one clock reading and one write. For each
-- caller (decide_one):
--   1. a cost that no configured tier can ever hold is refused for good;
--   2. a booking under an ID that holds a reservation changes nothing;
--   3. a holder of a reservation not due yet waits for it; paced, one due
--      within a granule is admitted at its instant (holder_turn);
--   4. otherwise it takes its cost from every tier at once, all or none
--      (short, admit), unless the key is suspended, a queue of reservations
--      is outstanding, or every slot of the in-flight limit is held;
--   5. refused by the slots alone, it is told when one is expected to free
--      (slot_wait); otherwise, with a horizon and a task ID, it reserves
--      the earliest instant every tier admits it (reserve), or it is told
--      when to come back.
-- Then the run writes what changed, once (write_back). A lone caller on
-- buckets alone that step 4 admits is decided by take_now, on the same
-- helpers, without building the state below: the common case, kept cheap.
--
-- The state of one run is the table r (run_state), passed to each function:
--   now            Redis TIME (us)
--   o              the run's options (read_options)
--   L, hasT        the key's L field (nil: defaults apply), whether T exists
--   tiers, gen     the limits in force and their generation; spec: all of it
--   until_         the suspension's end, suspended: whether it is in force
--   owed           what each bucket owes of its burst (bucket_owed)
--   x, vnext       the key's expiry memo; when the queue of reservations ends
--   wins           each window's state (window.lua), keys with a window only
--   slot_n, held   the in-flight limit and the slots held now
--   lanes          when each slot is next expected free, once asked
--   queue_open     a queue of reservations is outstanding (holders to look up)
--   paced          reserved instants are exact, not whole granules
--   va, sw, vt     the reservation schedule of the buckets, once loaded
--   V              the V field it is loaded from
--   taken, scheduled, holds   what this run changed

local PACE_EARLY, SWEEP_EVERY, options, n_options, read_options, CALLERS_AT
local read_limits, run_state, denied, align, short, take
local admit, slot_wait, reserve_windows, load_schedule, earliest_fit, book_schedule
local hold_resv, reserve, holder_turn, cost_refused, reservation_of, decide_one
local write_back, take_now
do
  PACE_EARLY = 200000   -- us a paced holder may come back before its granule
  SWEEP_EVERY = 1e6     -- us between two sweeps of lapsed reservations
  -- A holder at its reserved instant is let through when short by at most
  -- HOLDER_SLACK us: instants are rounded up to whole microseconds, so the
  -- tokens its predecessors took at their rounded instants can fall due a
  -- fraction of a microsecond after its own.
  local HOLDER_SLACK = 1

  -- read_options reads the run's options (ARGV[1], see decide.go). A Limiter
  -- sends a few distinct ones, one per kind of call: each is parsed once and
  -- kept between calls of the function library, like parsed limits (under
  -- EVAL, for one call). The table is shared: nothing writes to it.
  options, n_options = {}, 0
  function read_options(s)
    local o = options[s]
    if o then return o end
    local g, hz, lp, lease, hr, flags, se, defaults =
      string.match(s, '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)|(.*)$')
    if not g then error('decide: options "' .. string.sub(s, 1, 60) .. '" are not as decide.go writes them') end
    flags = tonumber(flags)
    o = {
      granule = tonumber(g),         -- us; 0: callers come back at any instant
      horizon = tonumber(hz),        -- us; 0: never reserve
      lapse = tonumber(lp),          -- us a reservation is kept after its instant
      lease = tonumber(lease),       -- tokens a caller may take for its process (0: none)
      headroom = tonumber(hr),       -- us of dispatch jitter to keep room for
      book = flags % 2 == 1,         -- always reserve (Enqueue)
      pace = math.floor(flags / 2) % 2 == 1,   -- admit a holder at its instant
      probe = math.floor(flags / 4) % 2 == 1,  -- a slot waiter asking again keeps its place
      fair = math.floor(flags / 8) % 2 == 1,   -- callers say their tenant (fair.lua)
      -- us a paced holder is admitted ahead at most, when the caller waits
      -- in its worker and asks again (holder_turn; nil: a granule and
      -- PACE_EARLY)
      near = math.floor(flags / 16) % 2 == 1 and 100000 or nil,
      slot_expiry = tonumber(se),    -- us a slot is held without renewal
      defaults = defaults,           -- limits when the key has none in Redis ('': none)
    }
    if n_options >= 64 then options, n_options = {}, 0 end
    options[s] = o
    n_options = n_options + 1
    return o
  end
  CALLERS_AT = 2   -- ARGV: the options, then (task ID, cost[, tenant]) per caller; none: one, ('', 1); a cost alone: one, ('', cost)

  -- is_paced says whether reserved instants are exact. With a bucket whose
  -- burst is below its rate per granule, instants on whole granules would
  -- drain a backlog at burst per granule, and a slow bucket (a token per
  -- granule or slower) whose burst cannot absorb a granule's delay would lose
  -- up to a granule per instant; paced, a holder back in the granule before
  -- its instant (or a little earlier: worker clocks) is admitted at the
  -- instant and waits for it. A window frees its calls a sub-window and the
  -- headroom after a whole period, never on a granule: on whole granules a
  -- backlog would lose up to a granule per period (half the quota of a
  -- one-second window), so windows are paced too.
  local function is_paced(o, tiers)
    if not o.pace or o.granule == 0 then return false end
    for _, t in ipairs(tiers) do
      if t.kind == 'w' then return true end
      if t.burst * t.e - o.headroom < o.granule or
          (t.e >= o.granule and (t.burst - 1) * t.e - o.headroom < o.granule) then
        return true
      end
    end
    return false
  end

  -- read_limits reads the suspension and the limits in force from the hash
  -- fields h (L, T, s, O). It returns the limits, L and the suspension's
  -- end, or nil and the reply every caller gets (no limits, bad limits).
  function read_limits(o, h, now)
    local L = h[1] or nil   -- (a missing field reads false)
    -- Suspension comes first. (An end beyond any honest wait is garbage.)
    local until_ = finite(h[3])
    if until_ and until_ - now > MAX_WAIT then until_ = nil end
    -- Limits, validated: a decision never crashes on bad ones.
    local src = L
    if not src and o.defaults ~= '' then src = o.defaults end
    if not src then
      if until_ and until_ > now then
        return nil, string.format('0|%d|0|suspended|0|0|0', math.ceil(until_ - now))
      end
      return nil, '-2'
    end
    local spec, field, why = parse_limits(src)
    if not spec then
      if not L then field = 'default ' .. field end
      return nil, '-1|' .. field .. '|' .. why
    end
    -- Quotas learned from the provider (or adaptive mode) lower the limits.
    if h[4] then spec = apply_learned(spec, src, h[4], now) end
    return spec, L, until_
  end

  -- run_state makes the state of a run (see the top of this file) and reads
  -- what the general path needs beyond the hash: windows and slots held.
  function run_state(KEYS, o, now, L, h, spec, until_, owed, x, vnext)
    local r = {
      key = KEYS[1], resv_key = KEYS[2], slots_key = KEYS[3], kc = KEYS[4], o = o, now = now,
      L = L, hasT = h[2] ~= false, V = h[5] or nil, O = h[4] or nil, spec = spec, tiers = spec.tiers, gen = spec.gen,
      until_ = until_, suspended = until_ ~= nil and until_ > now,
      owed = owed, x = x, vnext = vnext,
      held = 0, slot_n = spec.inflight, holds = 0,
      -- Reservations matter only while a queue of them is outstanding.
      -- Without one, a task that held one is decided like any other (it
      -- cannot jump a queue that is not there), so the common case reads no
      -- reservation at all.
      queue_open = o.horizon > 0 and vnext > now,
      paced = is_paced(o, spec.tiers),
    }
    if spec.windows then
      local names = {}
      for _, t in ipairs(r.tiers) do
        if t.kind == 'w' then names[#names + 1] = 'W' .. t.key end
      end
      local raw = redis.call('HMGET', r.key, unpack(names))
      r.wins = {}
      local k = 0
      for i, t in ipairs(r.tiers) do
        if t.kind == 'w' then
          k = k + 1
          r.wins[i] = win_load(raw[k], t, now, o.headroom)
        end
      end
    end
    if r.slot_n then
      -- Slots whose holder stopped renewing them (a worker killed) are free.
      redis.call('ZREMRANGEBYSCORE', r.slots_key, '-inf', '(' .. fmt(now))
      r.held = redis.call('ZCARD', r.slots_key)
    end
    return r
  end

  -- denied formats a refusal: retry after (us), who refused, the caller's
  -- reserved instant (0: none).
  function denied(r, retry, by, at)
    if retry > MAX_WAIT then retry = MAX_WAIT end
    return string.format('0|%d|0|%s|%d|0|%d', math.ceil(retry), by, at, r.gen)
  end

  -- align puts an instant where a caller can come back: a whole granule, or
  -- any whole microsecond when paced.
  function align(r, abs)
    abs = math.ceil(abs)
    local g = r.o.granule
    if g > 0 and not r.paced then abs = math.ceil(abs / g) * g end
    return abs
  end

  -- window_free returns when window tier i has room for c calls at or after
  -- at (at + MAX_WAIT: not in sight). A holder does not wait for other
  -- holders' reservations whose sub-window has passed: they are late (asynq
  -- brings a task back up to a second after its instant) and take their turn
  -- when they come. Counted, they kept a window's room idle while on their
  -- way, and a window paired with a bucket drifted later every period until
  -- a holder missed its turn.
  local function window_free(r, i, t, c, at, holder)
    local w, stale = r.wins[i], nil
    if holder then
      local cur = math.floor(r.now / t.sub)
      for k, v in pairs(w.r) do
        if -k < cur then
          stale = stale or {}
          stale[k] = v
        end
      end
      if stale then
        for k in pairs(stale) do w.r[k] = nil end
      end
    end
    local free = win_free(w, t, at, c, r.o.headroom, at + MAX_WAIT)
    if stale then
      for k, v in pairs(stale) do w.r[k] = v end
    end
    return free or at + MAX_WAIT
  end

  -- lowered_until returns the instant from which window tier t (lowered by
  -- what was learned, or by adaptive mode) is at its configured ceiling
  -- again: the learned quota's end, and the adaptive rate's full recovery.
  -- A cost the ceiling holds and the lowered tier cannot waits for it: the
  -- window it exceeds is a temporary one, with a known end.
  local function lowered_until(r, t)
    if not r.learned then r.learned, r.adapt = read_O(r.O) end
    local from = r.now
    local l = r.learned[t.key]
    if learned_lowers(l, t.ceiling, from) then from = l[2] end
    local a = r.adapt
    if a and r.spec.adaptive and a[1] < 1e6 then
      local back = a[2] + math.ceil((1e6 - a[1]) / ADAPT_STEP) * r.spec.adaptive
      if back > from then from = back end
    end
    return from
  end

  -- above_lowered reports whether c calls exceed what window tier t holds
  -- only because it is lowered (its ceiling holds them).
  local function above_lowered(t, c)
    return t.kind == 'w' and t.ceiling ~= nil and c > t.n and c <= t.ceiling.n
  end

  -- short returns the tier that refuses c calls at at (0: none) and how long
  -- until it would not. holder: the caller is at its reserved instant.
  function short(r, c, at, holder)
    local tier, wait, now, headroom = 0, 0, r.now, r.o.headroom
    for i, t in ipairs(r.tiers) do
      local w, ci = 0, cv(c, i)
      if ci == 0 then
        -- (a task that uses none of the tier's unit)
      elseif t.kind == 'b' then
        local v = r.owed[i]
        -- At an instant ahead, the bucket owes less by the time between, down
        -- to minus the headroom as bucket_owed reads a full bucket: a bucket
        -- full for that long has room for the headroom, and a floor of 0
        -- would refuse every holder of a burst equal to its cost ahead of now.
        if at > now then v = math.max(-headroom * t.rate, v - (at - now) * t.rate) end
        w = wait_for(t, v, ci, headroom)
      elseif above_lowered(t, ci) then
        -- (no instant while the tier is lowered: the first one after, under
        -- the configured window)
        local from = math.max(at, lowered_until(r, t))
        w = window_free(r, i, t.ceiling, ci, from, holder) - at
      else
        w = window_free(r, i, t, ci, at, holder) - at
      end
      if w > wait and not (holder and w <= HOLDER_SLACK) then tier, wait = i, w end
    end
    return tier, wait
  end

  -- hold_slot gives the caller a slot of the in-flight limit, named
  -- "taskID@start_us.k": unique even for two runs in the same microsecond (a
  -- clock that does not move, or a very fast Redis). The reply is split on
  -- '|' and ';': a task ID with those is spelled with '_'.
  local function hold_slot(r, id)
    local who = string.gsub(id ~= '' and id or 'x', '[|;]', '_')
    local stamp = who .. '@' .. string.format('%d', r.now) .. '.'
    local name
    repeat
      name = stamp .. r.holds
      r.holds = r.holds + 1
    until redis.call('ZADD', r.slots_key, 'NX', r.now + r.o.slot_expiry, name) == 1
    r.held = r.held + 1
    return name
  end

  -- bucket_take takes c from token bucket t owing owed (counted from 0 if
  -- it owes less: a full bucket holds no more than its burst) and returns
  -- what it owes then, and the tokens left.
  local function bucket_take(t, owed, c)
    if owed < 0 then owed = 0 end
    owed = owed + c * t.p
    return owed, t.burst - owed / t.p
  end

  -- take takes c from every tier at at and returns the tokens (or calls) left
  -- in the tightest one. (A bucket owes less at an instant ahead, but no less
  -- than nothing there.)
  function take(r, c, at)
    local remaining, now = math.huge, r.now
    for i, t in ipairs(r.tiers) do
      local left, ci = nil, cv(c, i)
      if t.kind == 'b' then
        if ci > 0 then
          r.owed[i], left = bucket_take(t, math.max(r.owed[i], (at - now) * t.rate), ci)
        else
          left = tokens_at(t, r.owed[i])
        end
      else
        if ci > 0 then win_add(r.wins[i], t, at, ci) end
        left = t.n - win_count(r.wins[i], t, at, r.o.headroom)
      end
      if left < remaining then remaining = left end
    end
    r.taken = true
    return remaining
  end

  -- lease_more takes more tokens for the caller's process to hand out itself
  -- (Lease), only while every tier keeps at least lease tokens behind, so
  -- leases never compete for the last tokens. They are taken here, so the
  -- bound holds whatever the process does with them. It returns how many.
  -- (Buckets only: see admit.)
  local function lease_more(tiers, owed, lease, c, remaining)
    local extra = math.floor(remaining) - lease
    if extra > lease - c then extra = lease - c end
    if extra <= 0 then return 0 end
    for i, t in ipairs(tiers) do owed[i] = owed[i] + extra * t.p end
    return extra
  end

  -- debt_ahead carries a provider's part of what the buckets owe (P, see
  -- read_P) through the take of c at at, an instant ahead, before it is
  -- taken: the calls alone, owing less, lose the refill until at that the
  -- buckets in debt do not (their part shrinks by it), so that Resume gives
  -- back no more than the provider's part. (Rare: a key in a provider's
  -- debt with a paced holder due; P is read once per run.)
  local function debt_ahead(r, c, at)
    if r.P == nil then
      r.P = false
      local raw = redis.call('HGET', r.key, 'P')
      if raw then
        local u, parts = read_P(raw)
        if u and u > r.now and next(parts) then r.P, r.P_until = parts, u end
      end
    end
    if not r.P then return end
    local changed = false
    for i, t in ipairs(r.tiers) do
      local ci, id = cv(c, i), string.format('%d', t.id)
      if t.kind == 'b' and ci > 0 and r.P[id] then
        local fa = (at - r.now) * t.rate
        local function took(v) return math.max(v, fa, 0) + ci * t.p end
        r.P[id] = debt_through(t, r.P[id], r.owed[i], took(r.owed[i]), took)
        changed = true
      end
    end
    if changed then redis.call('HSET', r.key, 'P', write_P(r.P_until, r.P, r.tiers)) end
  end

  -- admit takes c from every tier at at (now, or for a paced holder an
  -- instant ahead when every tier admits it), takes up the caller's
  -- reservation resv, gives it a slot of the in-flight limit and maybe a
  -- lease, and returns the reply.
  function admit(r, resv, id, c, at)
    local e = nil -- (the call counted ahead, on a key with units)
    if at > r.now then
      -- A call counted at an instant ahead: a refund of an earlier call is
      -- bounded by what refills until then (adjust.lua's ref_now); and what a
      -- bucket of another unit owes then, before it, is what the least it
      -- owed (M) must count, not what it owes now: had the earlier call cost
      -- less, the bucket may be full by then, and lose the refill.
      -- The calls counted at instants after at are left out of what it owes
      -- then, and this call is counted ahead (AH) until it is made: the
      -- buckets owe as of now what the calls made so far do not (read_AH).
      if not r.ahead or at > r.ahead then r.ahead = at end
      if r.spec.units then
        if not r.M then r.M = read_M(redis.call('HGET', r.key, 'M') or nil, r.tiers) end
        if not r.AH then r.AH = read_AH(redis.call('HGET', r.key, 'AH') or nil, r.now) end
        e = {at = math.ceil(at)}
        for i, t in ipairs(r.tiers) do
          if t.kind == 'b' and t.unit and cv(c, i) > 0 then
            if r.M[i] then sample_M(r.M, i, r.owed[i] - (at - r.now) * t.rate - ahead_of(r.AH, t, at - 1), r.now, false) end
            e[t.key] = r.owed[i] < 0 and 0 or r.owed[i]
          end
        end
      end
    end
    if at > r.now then debt_ahead(r, c, at) end
    local remaining = take(r, c, at)
    if e then
      -- (what the take added: the call's cost and the refill lost until at)
      for i, t in ipairs(r.tiers) do
        if e[t.key] then e[t.key] = r.owed[i] - e[t.key] end
      end
      local k = #r.AH + 1
      while k > 1 and r.AH[k - 1].at > e.at do
        r.AH[k] = r.AH[k - 1]
        k = k - 1
      end
      r.AH[k] = e
      r.AH_changed = true
    end
    if resv then
      redis.call('ZREM', r.resv_key, id)
      r.resv_removed = true
    end
    local slot = nil
    if r.slot_n then slot = hold_slot(r, id) end
    -- No lease on a key with a window: a leased call the process does not
    -- make within the lease is lost for a whole window there (a bucket has
    -- it back in 1/rate), and a fleet starting on a fresh window of 100 lost
    -- half of it that way. None for a holder or a paced admission either.
    local extra = 0
    if r.o.lease > 1 and not resv and at == r.now and not slot and not r.wins and not r.g and not r.spec.units then
      extra = lease_more(r.tiers, r.owed, r.o.lease, c, remaining)
      remaining = remaining - extra
    end
    if remaining == math.huge then remaining = r.slot_n - r.held end
    if remaining < 0 then remaining = 0 end
    local reply = string.format('1|%d|%d||%d|%d|%d', math.ceil(at - r.now), math.floor(remaining), math.ceil(at), extra, r.gen)
    if slot then return reply .. '|' .. slot end
    return reply
  end

  -- slot_lanes works out when each slot of the in-flight limit is next
  -- expected free, from the moving average of how long slots were held (R)
  -- and the lanes kept while callers wait (FL).
  local function slot_lanes(r)
    local now, n = r.now, r.slot_n
    local raw = redis.call('HMGET', r.key, 'FL', 'R')
    local holders = redis.call('ZRANGE', r.slots_key, 0, -1)
    local avg = slot_avg(raw[2], 0)
    local lanes = {}
    if avg == 0 then
      -- No slot of the key was released yet: nothing to predict from. The
      -- guess is a second (asynq's resolution), or as long as the oldest
      -- holder has been running; a waiter is not sent further than one guess
      -- ahead (it comes back and asks again), and the guess is not kept.
      avg = 1e6
      for _, m in ipairs(holders) do
        local st = slot_start(m)
        if st and now - st > avg then avg = now - st end
      end
      avg = math.min(avg, r.o.slot_expiry)
      lanes.guess = now + avg
    else
      for v in string.gmatch(raw[1] or '', '(%d+)') do lanes[#lanes + 1] = tonumber(v) end
    end
    if #lanes ~= n or lanes[1] < now then
      -- Fresh lanes: each holder is expected to hold its slot for the
      -- average, and one that has held it longer, as long again as it is
      -- over (at least 50 ms); while no average is known, as long again as
      -- it has held it (at least the guess). Predicted free "now", a waiter
      -- would ask again and again while a slow holder runs: tasks behind a
      -- slot held 12 s were deferred 60 times. Free slots are free now.
      local fresh = {guess = lanes.guess}
      for _, m in ipairs(holders) do
        local st = slot_start(m) or now
        local ends = st + avg
        if lanes.guess then
          ends = now + math.max(now - st, 1e6)
        elseif ends < now + 50000 then
          ends = now + math.max(now - ends, 50000)
        end
        fresh[#fresh + 1] = ends
      end
      while #fresh < n do fresh[#fresh + 1] = now end
      table.sort(fresh)
      lanes = fresh
    end
    lanes.avg = avg
    return lanes
  end

  -- slot_wait returns when a slot is expected free for this caller: the
  -- earliest lane, which is then next free a run later. (A probe was given
  -- its place before: it is told the earliest lane and takes none.)
  function slot_wait(r)
    if not r.lanes then r.lanes = slot_lanes(r) end
    local lanes = r.lanes
    local at = lanes[1]
    if not r.o.probe then
      lanes[1] = at + lanes.avg
      table.sort(lanes)
    end
    if lanes.guess and at > lanes.guess then at = lanes.guess end
    return at
  end

  -- reserve_windows counts c calls reserved at the instant at in every
  -- window (sign -1: takes them away).
  function reserve_windows(r, at, c, sign)
    if not r.wins then return end
    for i, t in ipairs(r.tiers) do
      local ci = cv(c, i)
      if t.kind == 'w' and ci > 0 then
        if sign > 0 then win_reserve(r.wins[i], t, at, ci) else win_unreserve(r.wins[i], t, at, ci) end
      end
    end
    r.taken = true
  end

  -- load_schedule reads the reservation schedule. Each token bucket keeps a
  -- virtual schedule (GCRA: theoretical arrival time, emission interval
  -- per/rate, tolerance burst-cost intervals less the headroom) that
  -- simulates it at the instants reserved tasks come back; a window counts
  -- reserved calls with its calls. A fresh queue starts from the real state.
  -- Bucket schedule times are relative to the queue's anchor va (whole us),
  -- so fractions of a microsecond survive.
  function load_schedule(r)
    if r.vt then return end
    local va, sw, virt = nil, 0, nil
    if r.vnext > r.now then va, sw, virt = read_V(r.V) end
    if not va then va, sw, virt = r.now, 0, {} end
    local vt = {}
    for i, t in ipairs(r.tiers) do
      if t.kind == 'b' then
        local v = virt[-t.id]
        if v == nil then v = r.owed[i] / t.rate + (r.now - va) end
        vt[i] = v
      end
    end
    r.va, r.sw, r.vt = va, sw, vt
  end

  -- earliest_fit returns the first instant at or after earliest (aligned)
  -- at which every tier's schedule admits c. With a granule, instants fall on
  -- granule boundaries (unless paced), because that is when asynq brings
  -- deferred tasks back: all the tasks of one granule arrive at once and must
  -- fit in what every tier holds at that instant.
  function earliest_fit(r, c, earliest)
    local o = r.o
    local s = align(r, earliest)
    local limit = r.now + o.horizon + o.granule
    for _ = 1, 2 * #r.tiers + 1 do
      local moved = false
      for i, t in ipairs(r.tiers) do
        local start, ci = s, cv(c, i)
        if ci == 0 then
          -- (nothing to take from it)
        elseif t.kind == 'b' then
          start = r.va + r.vt[i] - (t.burst - ci) * t.e + o.headroom
        elseif above_lowered(t, ci) then
          -- (after the lowered window ends, under the configured one; an end
          -- beyond the horizon is when to come back to book)
          local from = math.max(s, lowered_until(r, t))
          if from > limit then
            start = from
          else
            start = win_free(r.wins[i], t.ceiling, from, ci, o.headroom, limit) or (limit + 1)
          end
        else
          start = win_free(r.wins[i], t, s, ci, o.headroom, limit) or (limit + 1)
        end
        if start > s + SLACK then s, moved = align(r, start), true end
      end
      if not moved then break end
    end
    return s
  end

  -- book_schedule reserves c at the instant at in every tier's schedule.
  -- Fresh callers wait until the last reserved granule has come back.
  function book_schedule(r, c, at)
    local gap = r.o.granule
    for i, t in ipairs(r.tiers) do
      local ci = cv(c, i)
      if t.kind == 'b' and ci > 0 then
        local rel = at - r.va
        if r.vt[i] > rel then r.vt[i] = r.vt[i] + ci * t.e else r.vt[i] = rel + ci * t.e end
        if r.o.granule == 0 and t.e > gap then gap = t.e end
      end
    end
    reserve_windows(r, at, c, 1)
    if at + gap > r.vnext then r.vnext = math.ceil(at + gap) end
    r.scheduled = true
  end

  -- hold_resv holds the caller's reservation for at in key r's reservations
  -- (reserve's, and multi.lua's for a task of several keys where its
  -- instant is booked), and keeps the set alive.
  function hold_resv(r, id, at)
    local now, o = r.now, r.o
    -- (a set this run emptied is made anew by the ZADD below, with no TTL)
    local refresh = not r.queue_open or r.resv_removed
    if now - r.sw >= SWEEP_EVERY then
      -- Reservations whose task never came back lapse; they are swept at
      -- most once a second (each sweep is a command), and found lapsed by
      -- their holder's lookup meanwhile.
      redis.call('ZREMRANGEBYSCORE', r.resv_key, '-inf', '(' .. fmt(now - o.lapse))
      r.sw, refresh = now, true
    end
    redis.call('ZADD', r.resv_key, at, id)
    -- (a set emptied meanwhile, by another run's admission of its last
    -- holder, is made anew by the ZADD, with no TTL: one member tells)
    if not refresh and redis.call('ZCARD', r.resv_key) == 1 then refresh = true end
    if refresh then
      -- The reservations live until the last one lapses. Set when a queue
      -- opens (the set may be new) and at most once a second while it is
      -- open, for every booking the next second may make (up to the
      -- horizon ahead): not a PEXPIRE per booking.
      extend_to(r.resv_key, r.vnext - now + o.lapse + o.horizon + SWEEP_EVERY)
    end
  end

  -- reserve gives the caller (refused by, and free no earlier than earliest)
  -- the earliest instant within the horizon that every tier admits it at,
  -- and returns the reply. could_run: nothing but the queue or a suspension
  -- refused it.
  function reserve(r, id, c, resv, earliest, by, could_run)
    local now, o = r.now, r.o
    if resv and resv >= earliest then
      reserve_windows(r, resv, c, 1)
      return denied(r, resv - now, by, resv)
    end
    load_schedule(r)
    local at = earliest_fit(r, c, earliest)
    if at - now > o.horizon then
      -- Beyond the horizon: come back when an instant can be reserved.
      if resv then
        redis.call('ZREM', r.resv_key, id)
        r.resv_removed = true
      end
      return denied(r, at - o.horizon - now, by, 0)
    end
    book_schedule(r, c, at)
    -- The schedule has room right now (a queued caller at a granule
    -- boundary, say): run now rather than "retry in 0".
    if at <= now and could_run and not r.suspended and not o.book then
      reserve_windows(r, at, c, -1)
      return admit(r, resv, id, c, now)
    end
    hold_resv(r, id, at)
    return denied(r, math.max(at - now, 0), by, at)
  end

  -- holder_turn decides for a caller holding a reservation for resv: not due
  -- yet, it waits for it. Within a granule of it, it is let through: paced,
  -- it is admitted at its instant and told how long to wait for it;
  -- otherwise the tiers decide at once (a worker clock a few milliseconds
  -- behind Redis must not cost a whole extra deferral, and the tiers alone
  -- keep the bound). It returns the reply, or nil to decide as at now.
  function holder_turn(r, id, c, resv)
    local now = r.now
    local early = r.o.granule
    if r.paced then early = early + PACE_EARLY end
    -- A caller that waits in its worker and asks again (o.near: the
    -- middleware, with the time to) is admitted at most o.near ahead of
    -- the instant its call is counted at, on a key with units and without
    -- windows; from further ahead it is told to wait, and asks again then.
    -- A call counted at an instant ahead is counted as of then (take): the
    -- room a bucket has before that instant goes unused, and on a key with
    -- units refunds make room there for the tasks they bring forward. (A
    -- second's holders admitted ahead at once, as asynq hands them over,
    -- left that room idle and the provider's bucket full: bench L5 drained
    -- at 0.86-0.88 of the tokens limit in a third of runs.) A key without
    -- units books its schedule exactly, and a second decision per task
    -- would cost it Redis commands for nothing (bench A2: 1.83x to 2.16x
    -- asynq's per task through Limiter.Enqueue).
    local near = r.o.near
    if not r.paced or r.spec.windows or not r.spec.units then near = nil end
    if now < resv - early then
      reserve_windows(r, resv, c, 1)
      return denied(r, resv - now, 'reserved', resv)
    end
    -- (told 'near': the caller asks again at its instant from its worker;
    -- a task told 'reserved' goes back to asynq for it)
    if near and resv - now > near then
      reserve_windows(r, resv, c, 1)
      return denied(r, resv - now, 'near', resv)
    end
    if not r.paced then return nil end
    -- The holders of one granule come back together, in any order, and take
    -- their turns first come first served at the instant every tier admits
    -- them (the schedule made room for them in this granule).
    local at = now
    for _ = 1, 3 do
      local tier, wait = short(r, c, at, true)
      if tier == 0 then break end
      at = at + wait
    end
    if near and at - now > near and at - now <= early then
      reserve_windows(r, resv, c, 1)
      return denied(r, at - now, 'near', resv)
    end
    if at - now <= early and short(r, c, at, true) == 0 and not (r.slot_n and r.held >= r.slot_n) then
      return admit(r, resv, id, c, at)
    end
    return nil
  end

  -- cost_refused refuses for good a cost that no configured tier can ever
  -- hold; one above a tier lowered by what was learned waits for the tier to
  -- come back up. The reply names the tier as its caller's limits do: its
  -- position, and its kind, numbers and unit.
  function cost_refused(r, c)
    for i, t in ipairs(r.tiers) do
      local ct = t.ceiling or t
      local most, kind, n = ct.burst, 'b', ct.rate
      if t.kind == 'w' then
        most, n, kind = ct.n, ct.n, 'w'
        if ct.fixed then kind = 'x' end
      end
      if cv(c, i) > most then
        return '-3|' .. i .. '|' .. string.format('%d', most) .. '|' .. kind .. '|' .. string.format('%d', n) ..
          '|' .. string.format('%d', ct.per) .. '|' .. string.format('%d', most) .. '|' .. (t.unit or '')
      end
    end
    return nil
  end

  -- reservation_of returns the caller's reserved instant, or nil; one lapsed
  -- (its task never came back) is dropped, and the caller is a fresh one.
  function reservation_of(r, id)
    local at = finite(redis.call('ZSCORE', r.resv_key, id))
    if at and at < r.now - r.o.lapse then
      redis.call('ZREM', r.resv_key, id)
      r.resv_removed = true
      return nil
    end
    return at
  end

  -- decide_one decides for one caller (task ID id, cost c).
  function decide_one(r, id, c)
    local o, now = r.o, r.now
    local refused = cost_refused(r, c)
    if refused then return refused end
    local resv = nil
    if o.book and id ~= '' then
      -- A booking under an ID that holds a reservation is another task's (an
      -- enqueue of an ID in use, which asynq will refuse): it changes
      -- nothing, neither the reservation nor any tier.
      local held = finite(redis.call('ZSCORE', r.resv_key, id))
      if held and held >= now - o.lapse then return string.format('0|0|0|booked|0|0|%d', r.gen) end
    elseif r.queue_open and id ~= '' then
      resv = reservation_of(r, id)
    end
    -- A holder's reserved calls leave the windows while it is decided, and
    -- go back where it ends up: admitted, on its instant again, or another.
    if resv then reserve_windows(r, resv, c, -1) end
    if resv and not r.suspended then
      local reply = holder_turn(r, id, c, resv)
      if reply then return reply end
    end

    -- Take from all tiers or none. A caller without a due reservation may
    -- not take what the queue of reservations has been promised.
    local tier, wait = short(r, c, now, resv ~= nil and now >= resv)
    local queued = resv == nil and r.vnext > now
    local no_slot = r.slot_n ~= nil and r.held >= r.slot_n and not o.book
    if not r.suspended and tier == 0 and not queued and not no_slot and not o.book then
      return admit(r, resv, id, c, now)
    end

    -- Refused: work out who refused and when the caller may run.
    local by, earliest = 'tier:' .. tier, now + wait
    if r.suspended then
      by = 'suspended'
      if r.until_ > earliest then earliest = r.until_ end
    elseif tier == 0 and no_slot and not queued then
      -- Only the slots refuse: come back when one is expected free, in the
      -- order callers were refused (no reservation: a slot frees when its
      -- holder ends, not on a schedule).
      local at = slot_wait(r)
      if resv then reserve_windows(r, resv, c, 1) end
      return denied(r, math.max(at - now, 1000), 'inflight', resv or 0)
    elseif tier == 0 then
      by = 'queue'
    end
    if o.horizon > 0 and id ~= '' then
      return reserve(r, id, c, resv, earliest, by, tier == 0 and not no_slot)
    end
    if queued and r.vnext > earliest then
      earliest = r.vnext
      if not r.suspended then by = 'queue' end
    end
    return denied(r, earliest - now, by, 0)
  end

  -- write_back writes what the run changed, once, and keeps the key alive
  -- (keep_alive): never shorter than the time the tiers need to refill, the
  -- queue of reservations, the suspension, or what any other path needs.
  function write_back(r)
    local now = r.now
    if r.taken or r.scheduled then
      local fields, del, need = {}, {}, full_in(r.tiers, r.owed)
      if r.write_extra then r.write_extra(r, fields) end
      for i, t in ipairs(r.tiers) do
        if t.kind == 'w' then
          local s, empty_in = win_write(r.wins[i], t, now, r.o.headroom)
          if s then
            fields[#fields + 1] = 'W' .. t.key
            fields[#fields + 1] = s
          else
            del[#del + 1] = 'W' .. t.key
          end
          if empty_in > need then need = empty_in end
        end
      end
      if r.scheduled then
        for i, t in ipairs(r.tiers) do
          if t.kind == 'b' and r.va + r.vt[i] - now > need then need = r.va + r.vt[i] - now end
        end
        fields[#fields + 1] = 'V'
        fields[#fields + 1] = write_V(r.va, r.sw, r.tiers, r.vt)
      end
      if r.vnext - now > need then need = r.vnext - now end
      if r.fair_need and r.fair_need > need then need = r.fair_need end
      if r.M then
        fields[#fields + 1] = 'M'
        fields[#fields + 1] = write_M(r.M, r.tiers)
      end
      if r.AH_changed then
        local s = write_AH(r.AH)
        if s then
          fields[#fields + 1] = 'AH'
          fields[#fields + 1] = s
        else
          del[#del + 1] = 'AH'
        end
      end
      need = keep_M(r.M, need)
      if r.ahead then
        fields[#fields + 1] = 'A'
        fields[#fields + 1] = string.format('%d', math.ceil(r.ahead))
      end
      if r.suspended and r.until_ - now > need then need = r.until_ - now end
      local q = r.q_override or (r.vnext > now and r.vnext or 0)
      local T = write_T(r.tiers, r.owed, now, 0, q)
      if not T and r.hasT then del[#del + 1] = 'T' end
      -- (deletions first: keep_alive reads the lifetime of the hash they
      -- leave, which the writes below may make anew)
      if #del > 0 then redis.call('HDEL', r.key, unpack(del)) end
      local ttl
      local x0 = r.x
      r.x, ttl = keep_alive(r.key, need, r.x, now)
      if T then
        -- (x, T's second double, now known)
        fields[#fields + 1] = 'T'
        fields[#fields + 1] = string.sub(T, 1, 8) .. bin_pack('<d', r.x) .. string.sub(T, 17)
        if not r.L and not r.hasT then
          -- Record the defaults the buckets are computed under, for SetLimits.
          fields[#fields + 1] = 'D'
          fields[#fields + 1] = r.o.defaults
        end
      end
      if #fields > 0 then redis.call('HSET', r.key, unpack(fields)) end
      if ttl then
        set_ttl(r.key, ttl)
        -- (a key configured before :c existed: its limits outlive the hash)
        if r.L then save_config(r.key, r.kc) end
      end
      -- The active tenants (fair.lua) outlive the hash that counts them,
      -- however its lifetime was raised (another path's suspension, say: a
      -- record of an active tenant outlived the set that lists it).
      if r.akey and (r.x ~= x0 or r.akey_new) then outlive(r.key, r.akey, 1e6) end
    end
    if r.lanes and not r.lanes.guess then
      local l = {}
      for i = 1, #r.lanes do l[i] = string.format('%d', r.lanes[i]) end
      redis.call('HSET', r.key, 'FL', table.concat(l, ' '))
    end
    if r.slot_n and r.held > 0 then
      -- The slots live as long as their longest expiry: this process's, or
      -- a longer one another process gave its live holders.
      extend_to(r.slots_key, r.o.slot_expiry)
    end
  end

  -- take_now decides the common case without the general machinery: one
  -- caller, on buckets alone, no suspension, no queue, no booking. It
  -- admits the caller when every bucket has c tokens and room for the
  -- headroom (the rules of short and admit, on the same helpers), writes T
  -- and returns the reply; otherwise it returns nil, changing nothing, and
  -- the general path decides. (The general path cost a lone Take 137k
  -- instructions, this one 107k: bench/callgrind.sh, Redis 7.0.) M is the
  -- M field's records when a sample changed them (nil: the field stays).
  function take_now(key, kc, o, now, L, hasT, spec, owed, x, c, M)
    local tiers, headroom = spec.tiers, o.headroom
    local n, remaining, longest = #tiers, math.huge, 0
    -- (wait_for, bucket_take and full_in written out: a call costs more than
    -- the arithmetic. wait_for > 0 is its need > 0; longest is full_in's,
    -- before its ceiling.)
    if type(c) == 'number' then -- (one unit: the common case, without a lookup per tier)
      for i = 1, n do
        local t = tiers[i]
        if owed[i] + headroom * t.rate - (t.burst - c) * t.p > 0 then return nil end
      end
      for i = 1, n do
        local t, v = tiers[i], owed[i]
        if v < 0 then v = 0 end
        v = v + c * t.p
        owed[i] = v
        local left = t.burst - v / t.p
        if left < remaining then remaining = left end
        if v > 0 and v / t.rate > longest then longest = v / t.rate end
      end
    else
      for i = 1, n do
        local t, ci = tiers[i], c[i]
        if ci > 0 and owed[i] + headroom * t.rate - (t.burst - ci) * t.p > 0 then return nil end
      end
      for i = 1, n do
        local t, v, ci = tiers[i], owed[i], c[i]
        if ci > 0 then
          if v < 0 then v = 0 end
          v = v + ci * t.p
          owed[i] = v
        elseif v < 0 then
          v = 0 -- (tokens_at)
        end
        local left = t.burst - v / t.p
        if left < remaining then remaining = left end
        if v > 0 and v / t.rate > longest then longest = v / t.rate end
      end
    end
    local extra, need = 0, math.ceil(longest)
    if o.lease > 1 and not spec.units then
      extra = lease_more(tiers, owed, o.lease, c, remaining)
      remaining = remaining - extra
      if extra > 0 then need = full_in(tiers, owed) end
    end
    need = keep_M(M, need)
    local ttl
    x, ttl = keep_alive(key, need, x, now)
    local T = write_T(tiers, owed, now, x, 0)
    -- (D: the defaults the buckets are computed under, recorded for
    -- SetLimits, and as the mark of a key without configured limits)
    local D = not L and not hasT
    if not T then
      -- Every bucket full (a call that took nothing of their units): no
      -- state to keep.
      if hasT then redis.call('HDEL', key, 'T') end
      if M then redis.call('HSET', key, 'M', write_M(M, tiers)) end
    elseif M and D then
      redis.call('HSET', key, 'T', T, 'M', write_M(M, tiers), 'D', o.defaults)
    elseif M then
      redis.call('HSET', key, 'T', T, 'M', write_M(M, tiers))
    elseif D then
      redis.call('HSET', key, 'T', T, 'D', o.defaults)
    else
      redis.call('HSET', key, 'T', T)
    end
    if ttl then
      set_ttl(key, ttl)
      if L then save_config(key, kc) end
    end
    if remaining < 0 then remaining = 0 end
    return string.format('1|0|%d||%d|%d|%d', math.floor(remaining), now, extra, spec.gen)
  end

end

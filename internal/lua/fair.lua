-- fair.lua: fair shares among the tenants of a key (issue 23), part of the
-- decide function's library (after decide.lua, whose functions it uses).
--
-- The algorithm is start-time fair queuing (Goyal, Vin and Cheng, "Start-
-- time Fair Queueing", SIGCOMM 1996) on a virtual clock that advances as
-- generalized processor sharing would (Parekh and Gallager, 1993): while
-- tenants have work booked, virtual time V advances at R / W per
-- microsecond, R the key's rate (its binding tier, in cost units per us)
-- and W the sum of the weights of the tenants with work booked ("active").
-- A task of tenant i and cost c gets the start tag S = max(V, F_i), and
-- the tenant's finish tag becomes F_i = S + c / w_i. The task is due when
-- V reaches S, that is at now + (S - V) x W / R: that is the "when" a
-- refused task is deferred to, from its tenant's own place in line, not
-- behind every task booked before it. A tenant alone has W = w_i and gets
-- the whole rate; a second tenant makes W larger, and the first tenant's
-- tasks, booked at the whole rate, come back early, are found not due, and
-- are deferred again to their new time (moved back, once). A tenant's work
-- is done when V passes its F_i: it leaves W, and its share goes to the
-- others at once. Every tier of the key still decides each admission:
-- fairness orders the tasks, the tiers keep the bound.
--
-- A tenant may run ahead of V by the key's burst (tolerance), so a tenant
-- alone uses the burst as a key without tenants does.
--
-- Storage, in the key's hash (fields) and one more key:
--   G      the virtual clock, binary: V, tV (us of Redis TIME it was
--          computed at), W, Fmin (the least finish tag of an active tenant,
--          a lower bound: a tenant's tag in the set below may be stale-low),
--          sw (when lapsed reservations were last swept)
--   t:<id> an active tenant, binary: F, the weight it counts in W, the
--          cost units admitted while active
--   w:<id> a tenant's weight, set by SetWeights (absent: 1); WL lists them
--   <prefix>:{name}:a  sorted set of active tenants by finish tag
--   <prefix>:{name}:t  sorted set of the start tags of the reservations,
--          by task ID (not in the hash: a listpack hash of hundreds of
--          fields is searched end to end by every HMGET of the key)
-- While any tenant is active, T's q is -1: a caller that does not say its
-- tenant is told to ask again as one (reply -4), so tasks without a tenant
-- share the default tenant "".

local fair_state, tenant_of, fair_expire, fair_clock, fair_book, fair_place
local fair_when, fair_booked, fair_ahead, fair_yields, fair_run_due, fair_reserve
local decide_fair, fair_write
do
  local FAIR_EXPIRE_PER_RUN = 32   -- tenants whose work ended, taken out per run at most
  local FAIR_PROJECT = 32          -- tenants whose work ends first, looked at per booking at most
  local FAIR_SLACK = 1.0           -- the share of the rate booked past another tenant's work

  -- fair_tolerance returns how far (us) a tenant's task may be ahead of its
  -- fair time and still run now: what the key's tightest tier holds beyond
  -- the task's cost, a burst.
  local function fair_tolerance(tiers, c)
    local tau = math.huge
    for i, t in ipairs(tiers) do
      local v, ci = math.huge, cv(c, i)
      if ci == 0 then
        -- (the task takes nothing from it)
      elseif t.kind == 'b' then v = (t.burst - ci) * t.e else v = (t.n - ci) * t.p / t.n end
      if v < tau then tau = v end
    end
    if tau == math.huge then tau = 0 end
    if tau < 0 then tau = 0 end
    return tau
  end

  -- fair_state reads what the fair path needs beyond run_state: the clock
  -- and, for each caller, its tenant's record, weight and reservation tag
  -- (fields f, from the run's first HMGET: see decide_run).
  function fair_state(r, KEYS, f)
    r.akey, r.tkey = KEYS[5], KEYS[6]
    r.g = read_G(f.G, r.now)
    r.R = fair_rate(r.tiers)
    r.tenants, r.weights, r.stags = {}, {}, {}
    r.fair_dirty, r.stag_set, r.stag_del, r.leaving = {}, {}, {}, {}
  end

  -- tenant_of returns tenant id's record, read once per run (nil: inactive).
  function tenant_of(r, id, raw)
    local rec = r.tenants[id]
    if rec == nil then
      if raw == nil then raw = redis.call('HGET', r.key, 't:' .. id) end
      rec = read_tenant(raw) or false
      -- (No tenant is active while W is 0: a record left is stale.)
      if rec and r.g.W <= 0 then rec, r.leaving[id] = false, true end
      r.tenants[id] = rec
    end
    return rec or nil
  end

  -- fair_expire takes out the tenants whose work V has passed: their weight
  -- leaves W. Tags in the set may be stale-low (a tenant's F grows with each
  -- booking without a ZADD): such a tenant is scored again instead. A tenant
  -- that left is taken out of the set and the hash when the run writes
  -- (fair_write), unless it booked again in the run: a tenant alone leaves
  -- and comes back on most of its calls, and that costs then one ZADD.
  function fair_expire(r)
    local g = r.g
    local m = redis.call('ZRANGEBYSCORE', r.akey, '-inf', fmt(g.V), 'WITHSCORES', 'LIMIT', 0, FAIR_EXPIRE_PER_RUN)
    local left = 0
    for k = 1, #m, 2 do
      local id = m[k]
      local rec = tenant_of(r, id)
      if rec and rec.F > g.V then
        redis.call('ZADD', r.akey, fmt(rec.F), id)
      else
        if rec then g.W = g.W - rec.w end
        r.tenants[id] = false
        r.leaving[id] = true
        r.fair_dirty[id] = nil
        left = left + 1
      end
    end
    if g.W < 1e-9 then
      g.W, g.Fmin, g.Smax = 0, math.huge, 0
      return
    end
    -- The least finish tag of those that stay (past the ones leaving). None
    -- left (the set expired before the hash): no tenant is active.
    local first = redis.call('ZRANGE', r.akey, left, left, 'WITHSCORES')
    g.Fmin = tonumber(first[2]) or math.huge
    if #first == 0 then g.W = 0 end
  end

  -- fair_least_live returns the least start tag, at most upto, of a booking
  -- whose task is still expected: its reservation is held and its instant
  -- is no more than FAIR_GRACE granules past (asynq brings a task back up to
  -- a second late). Tags of bookings that are gone (given up, lapsed, or
  -- that many granules overdue: a task deleted from asynq) are taken out of
  -- the tags on the way; their task, should it come back after all, is
  -- decided as a fresh one. nil: no booking at or below upto is expected.
  local FAIR_GRACE = 2
  local FAIR_PRUNE = 16
  local function fair_least_live(r, upto)
    local m = redis.call('ZRANGEBYSCORE', r.tkey, '-inf', fmt(upto), 'WITHSCORES', 'LIMIT', 0, FAIR_PRUNE)
    if #m == 0 then return nil end
    local ids = {}
    for k = 1, #m, 2 do ids[#ids + 1] = m[k] end
    local at = redis.call('ZMSCORE', r.resv_key, unpack(ids))
    local since = r.now - FAIR_GRACE * math.max(r.o.granule, 1e6)
    local gone = {}
    for k, id in ipairs(ids) do
      local a = tonumber(at[k])
      if a and a >= since then
        -- (a caller of this run is being decided now, from its own tag and
        -- its tenant's shift: it holds nobody back, itself least of all)
        if not r.stags[id] then
          if #gone > 0 then redis.call('ZREM', r.tkey, unpack(gone)) end
          return tonumber(m[2 * k]), a
        end
      else
        gone[#gone + 1] = id
      end
    end
    if #gone > 0 then redis.call('ZREM', r.tkey, unpack(gone)) end
    -- (None expected but this run's callers; more may lie beyond the ones
    -- looked at: they are looked at next time, and the clock moves no
    -- further than the last one here.)
    if #ids == FAIR_PRUNE then return tonumber(m[#m]) end
    return nil
  end

  -- fair_clock brings V to now: it advances at R / W, and tenants leave W
  -- when V passes their finish tags. It stands still while the key is
  -- suspended (nothing is served) and while no tenant is active.
  function fair_clock(r)
    local g, now = r.g, r.now
    if not r.suspended and now > g.tV then
      for _ = 1, 4 do
        if g.W <= 0 then break end
        local reach = g.tV + (g.Fmin - g.V) * g.W / r.R
        if reach > now then break end
        if g.Fmin > g.V then g.V, g.tV = g.Fmin, math.max(g.tV, reach) end
        fair_expire(r)
      end
      if g.W > 0 then
        -- The clock runs ahead of the work still expected by at most a
        -- granule's service: tasks that were due but not served yet (back
        -- late) are served first. Work that will not come (tasks deleted
        -- from asynq, never back) holds it back for two granules past its
        -- instant at most (fair_least_live): without that, a tenant's own
        -- booked work that never ran kept the clock from ever reaching its
        -- next tasks, on an idle key.
        local free = g.V + (now - g.tV) * r.R / g.W
        local slack = math.max(r.o.granule, 1e6) * r.R / g.W
        if free > g.Vs + slack then
          -- (tags are kept less their tenant's shift at the booking: the
          -- largest shift bounds how far the task's own turn lies past it)
          local least, at = fair_least_live(r, free)
          if least then
            local cap = math.max(g.Vs, least + math.max(g.Smax, 0)) + slack
            -- A booking is expected from a granule before its instant: until
            -- then the clock runs with the key's service (since tV, its
            -- instant has not changed: every booking is a decision, and every
            -- decision brings tV to its now). A booking the tiers deferred
            -- (refused a token at its turn, booked at the tier's next instant)
            -- held the clock for the seconds the key served the others' work
            -- at its full rate; those tenants stayed in W with that work done,
            -- and a task of 40 tokens booked behind them waited 27 s on a key
            -- with room (TestModelTierDeferredBookingHoldsTheFairClock).
            local expected = at and at - math.max(r.o.granule, 1e6)
            if expected and expected > g.tV then
              cap = math.max(cap, g.V + (math.min(now, expected) - g.tV) * r.R / g.W)
            end
            free = math.min(free, cap)
          end
        end
        if free > g.V then g.V = free end
      end
    end
    g.tV = math.max(g.tV, now)
    if g.W <= 0 then
      -- No tenant is active: a record still in the hash is stale.
      for id, rec in pairs(r.tenants) do
        if rec then r.tenants[id], r.leaving[id] = false, true end
      end
    end
  end

  -- fair_book gives tenant id (weight w) a task of cost c: its start tag,
  -- and the tenant's finish tag moved on. A tenant that was not active
  -- becomes active: its weight joins W.
  function fair_book(r, id, w, c, S)
    local g = r.g
    local rec = tenant_of(r, id)
    if not rec then
      rec = {F = g.V, w = w, units = 0, shift = 0}
      r.tenants[id] = rec
      g.W = g.W + w
      S = S or g.V
      rec.F = S + c / w
      -- The set of active tenants must outlive the hash (write_back): a
      -- new member, or one already there that did not leave in this run (a
      -- tenant alone leaves and comes back on most of its calls: the set is
      -- the one it lives in), left by a hash that expired before the set,
      -- which then keeps the lifetime it had for that hash. (Not raised,
      -- the set expired under the new hash's active tenants: W fell to 0
      -- and their records stayed, listed nowhere.)
      if redis.call('ZADD', r.akey, fmt(rec.F), id) == 1 or not r.leaving[id] then r.akey_new = true end
      r.leaving[id] = nil
      if rec.F < g.Fmin then g.Fmin = rec.F end
    else
      S = S or math.max(g.V, rec.F)
      if S + c / rec.w > rec.F then rec.F = S + c / rec.w end
    end
    r.fair_dirty[id] = true
    return S, rec
  end

  -- fair_place works out where caller id (cost c, tenant tenant of weight
  -- w) stands: its reservation (resv, nil for a fresh task), its start tag
  -- S (a holder keeps its own, a fresh task takes its tenant's next) and W,
  -- the weights active with its tenant. A task holding a reservation under
  -- an ID being booked is another task's: the reply says so.
  function fair_place(r, id, c, tenant, w)
    local p = {id = id, c = c, u = cost_units(r.tiers, c), tenant = tenant, w = w}
    -- Every reservation made while tenants share the key has a start tag:
    -- a task without one holds none (one made before, without tenants, is
    -- taken as fresh: booked again, or run, and the old one lapses).
    if id ~= '' and (r.stags[id] or r.o.book) then
      p.resv = reservation_of(r, id)
      if p.resv and r.o.book then return nil, string.format('0|0|0|booked|0|0|%d', r.gen) end
    end
    local g = r.g
    p.rec = tenant_of(r, tenant)
    p.fresh = p.resv == nil
    if p.fresh then
      p.S = p.rec and math.max(g.V, p.rec.F) or g.V
    else
      -- (a holder's tag is kept less its tenant's shift at the booking; no
      -- tenant active, the clock stands still and a tag means nothing: the
      -- holder's turn is now, or it would wait for a clock that never moves)
      p.S = r.stags[id] and r.stags[id] + (p.rec and p.rec.shift or 0) or g.V
      if g.W <= 0 then p.S = g.V end
      -- A booked task's turn is never past its tenant's finish tag F (every
      -- path that moves F moves the tenant's tags with it, by its shift, or
      -- keeps F past them), and a tenant that is not active left when V
      -- passed its F: all its booked work was due. A tag read past that was
      -- kept less a shift that is gone: the shift lives in the tenant's
      -- record, which leaves when V passes F, while its tags stay until
      -- their tasks come back (or it came back since, with a shift of 0).
      -- SetWeights raising a tenant's weight from 1 to 9 moved its F and
      -- shift back by 8/9 of its work: V soon passed the new F, the record
      -- left, and its tasks' tags were read as booked at a weight of 1, a
      -- turn 50 s away on a key with room (the model's
      -- TestModelSetWeightsLosesTheShiftOfBookedTasks).
      local cap = p.rec and p.rec.F or g.V
      if p.S > cap then p.S = cap end
    end
    p.W = g.W
    if not p.rec then p.W = p.W + w end
    return p
  end

  -- fair_served returns when the key serves again: now, or the end of the
  -- suspension in force. The clock stands still while the key is suspended
  -- (fair_clock), so a turn counted from now on a suspended key lies the
  -- suspension too early.
  local function fair_served(r)
    if r.suspended and r.until_ > r.now then return r.until_ end
    return r.now
  end

  -- fair_when returns when V reaches start tag S, W the weights active with
  -- the caller's tenant (self), at the current W: when the task is due.
  function fair_when(r, S, W)
    local g, from = r.g, fair_served(r)
    if S <= g.V or W <= 0 then return from end
    return from + (S - g.V) * W / r.R
  end

  -- fair_booked returns the instant a task not due yet is booked at (its
  -- tag S, due at t): when V reaches S as generalized processor sharing
  -- serves the work booked now, V advancing at R / W and each other tenant
  -- leaving W when V passes its finish tag (its booked work done). So a
  -- tenant's tasks are not booked at its share of the rate beyond the
  -- others' work: once theirs is done, the key's whole rate is its own
  -- (work conserving). Work the others book later makes a task early: it
  -- comes back, is found not due (due is at the current W), and is booked
  -- again, once. Tenants past the first FAIR_PROJECT to leave are taken to
  -- stay (later, never earlier than their turn).
  function fair_booked(r, S, W, self, t, own)
    local g = r.g
    -- (None to leave: the caller's tenant alone, or none ends before S.)
    if S <= g.V or W - own <= 1e-9 or g.Fmin >= S then return t end
    local m = redis.call('ZRANGEBYSCORE', r.akey, '(' .. fmt(g.V), '(' .. fmt(S), 'LIMIT', 0, FAIR_PROJECT)
    local need = {}
    for _, id in ipairs(m) do
      if r.tenants[id] == nil and id ~= self then need[#need + 1] = id end
    end
    if #need > 0 then
      local f = {}
      for i, id in ipairs(need) do f[i] = 't:' .. id end
      local raw = redis.call('HMGET', r.key, unpack(f))
      for i, id in ipairs(need) do tenant_of(r, id, raw[i]) end
    end
    local leave = {}
    for _, id in ipairs(m) do
      local rec = r.tenants[id]
      if id ~= self and rec and rec.F > g.V and rec.F < S then leave[#leave + 1] = rec end
    end
    if #leave == 0 then return t end
    table.sort(leave, function(a, b) return a.F < b.F end)
    local V, at, R = g.V, fair_served(r), r.R
    for _, rec in ipairs(leave) do
      if W - rec.w <= 1e-9 then break end
      at = at + (rec.F - V) * W / R
      -- Past a departure, at FAIR_SLACK of the rate: a tenant's tasks that
      -- run late (refused a token by one booked at the same instant) find
      -- room, instead of pushing the next ones back in turn.
      V, W, R = rec.F, W - rec.w, r.R * FAIR_SLACK
    end
    return math.min(t, at + (S - V) * W / R)
  end

  -- fair_ahead returns how far ahead of its fair instant a task may run now,
  -- when every tier admits it: the key's burst for a fresh task (so a tenant
  -- alone uses the burst as a key without tenants does), and for a paced
  -- holder also the rest of the granule it came back in: the holders due in
  -- one granule are then what the granule holds, and they take their turns
  -- first come first served. (Due further ahead, granules overlap, each is
  -- booked beyond what it holds, and the holders left over are deferred
  -- again and again.)
  function fair_ahead(r, c, fresh)
    local tau = fair_tolerance(r.tiers, c)
    if fresh or not r.paced then return tau end
    local g = r.o.granule
    return math.max(tau, (math.floor(r.now / g) + 1) * g - r.now)
  end

  -- fair_yields reports whether caller p, ahead of the clock, leaves its
  -- turn to a task of a smaller start tag, late (V has passed its tag), that
  -- is coming back now: start-time fair
  -- queuing serves the smaller tag first. (asynq hands out the tasks of one
  -- second in the order of their IDs; without this, a tenant whose task ran
  -- late, refused a token at its turn, lost every tie to the tasks of a
  -- tenant ahead of it, and was deferred again and again.) A late task
  -- that does not come back (booked more than two granules ago) is passed
  -- over.
  function fair_yields(r, p)
    local g = r.g
    if p.S <= g.V or g.W <= 0 then return false end
    local m = redis.call('ZRANGE', r.tkey, 0, 0, 'WITHSCORES')
    local id, Smin = m[1], tonumber(m[2] or '')
    local gr = math.max(r.o.granule, 1e6)
    if not id or id == p.id or not Smin or Smin > g.V or p.S - Smin <= 1e-9 then return false end
    -- One task yields for a late one per granule: it leaves the late one
    -- the turn it needs; more would leave turns unused.
    local mark = id .. '@' .. string.format('%d', math.floor(r.now / gr))
    if r.yielded == mark then return false end
    local at = tonumber(redis.call('ZSCORE', r.resv_key, id) or '')
    if not (at ~= nil and at >= r.now - 2 * gr and at <= r.now + gr) then return false end
    r.yielded, r.yield_set = mark, true
    return true
  end

  -- fair_run_due admits caller p if every tier admits it within ahead: a
  -- fresh task now, a paced holder at the first instant every tier admits
  -- (the holders of one granule come back together, in any order, and take
  -- their turns first come first served, as holder_turn: a bucket admits in
  -- the order of instants, and one admitted at its own instant ahead would
  -- leave the time before it unusable). It returns the reply, or nil, the
  -- tier that refused and the wait from now.
  function fair_run_due(r, p, ahead)
    local now, c = r.now, p.c
    local at = now
    if not p.fresh and r.paced and p.S <= r.g.V then
      -- A late holder (V has passed its tag: refused a token at its turn)
      -- takes the first free instant up to the end of the next granule: its
      -- worker waits for it. Deferred to the next token instead, it came back
      -- with the tasks due then, after them in asynq's order, and lost its
      -- turn again and again.
      ahead = ahead + r.o.granule
    end
    if not p.fresh and r.paced then
      for _ = 1, 6 do
        local tr, wt = short(r, c, at, true)
        if tr == 0 then break end
        at = at + wt
      end
    end
    local tier, wait = short(r, c, at, not p.fresh)
    if tier == 0 and fair_yields(r, p) then
      return nil, 0, math.max(p.t_f - now, p.u / r.R)
    end
    -- (Never further ahead than a paced wait: its worker waits for the
    -- instant at most that long, and a call started before the instant a
    -- window counted it at lands in the window before. A window's
    -- tolerance admitted holders 54 s ahead.)
    if tier == 0 and at - now <= ahead and at - now <= r.o.granule + PACE_EARLY then
      local S = p.S
      local _, trec = fair_book(r, p.tenant, p.w, p.u, S)
      trec.units = trec.units + p.u
      -- A tenant alone runs ahead of the clock with the key's burst; the
      -- clock follows it (no one else's turn is at stake), so its next
      -- tasks are not held back for the burst it used.
      if p.fresh and S > r.g.V and trec.w >= r.g.W then r.g.V = S end
      if S > r.g.Vs then r.g.Vs = S end
      if not p.fresh then r.stag_del[#r.stag_del + 1] = p.id end
      return admit(r, p.resv, p.id, c, math.ceil(at))
    end
    if tier == 0 then tier, wait = 1, 0 end
    return nil, tier, math.max(at + wait, p.t_f) - now
  end

  -- fair_reserve books caller p at its tenant's turn, earliest (when the
  -- tiers allow too), within the horizon, and returns the refusal.
  function fair_reserve(r, p, earliest, by)
    local o, now, id = r.o, r.now, p.id
    -- (However far it lies: a tenant's place in line is kept, and its task
    -- comes back at its turn. Dropped beyond the horizon, the task came back
    -- as a fresh one and was tagged behind its own work.)
    local at = align(r, earliest)
    local S = p.S
    if p.fresh then
      if not p.rec and r.g.W <= 0 and at > p.t_f then
        -- The first tenant to wait (the others ran without tenants' turns,
        -- or it had the key alone): its turn is when the tiers let it run,
        -- and its next tasks follow that one. (The clock stands still while
        -- the key is suspended: a wait for the suspension's end is no turn
        -- to count; counted, a task booked for it was found 60 s of the
        -- rate behind the clock when it came back.)
        local from = now
        if r.suspended and r.until_ > from then from = r.until_ end
        S = r.g.V + math.max(at - from, 0) * r.R / p.w
      end
      S = fair_book(r, p.tenant, p.w, p.u, S)
    end
    -- The key lives at least until its last booking comes back.
    if at - now > (r.fair_need or 0) then r.fair_need = at - now end
    local trec = tenant_of(r, p.tenant)
    r.stag_set[#r.stag_set + 1] = fmt(S - (trec and trec.shift or 0))
    r.stag_set[#r.stag_set + 1] = id
    if now - r.g.sw >= SWEEP_EVERY then
      -- Reservations whose task never came back lapse, with their tags.
      local gone = redis.call('ZRANGEBYSCORE', r.resv_key, '-inf', '(' .. fmt(now - o.lapse), 'LIMIT', 0, 64)
      if #gone > 0 then
        redis.call('ZREM', r.resv_key, unpack(gone))
        for i = 1, #gone do r.stag_del[#r.stag_del + 1] = gone[i] end
      end
      r.g.sw = now
    end
    redis.call('ZADD', r.resv_key, at, id)
    extend_to(r.resv_key, at - now + o.lapse)
    return denied(r, math.max(at - now, 0), by, at)
  end

  -- decide_fair decides for a caller with tenant tenant (the rules of
  -- decide_one, in the order of fair shares). w is the tenant's weight.
  function decide_fair(r, id, c, tenant, w)
    local refused = cost_refused(r, c)
    if refused then return refused end
    local p, reply = fair_place(r, id, c, tenant, w)
    if not p then return reply end
    local now = r.now
    local no_slot = r.slot_n ~= nil and r.held >= r.slot_n and not r.o.book
    local ahead = fair_ahead(r, c, p.fresh)
    p.t_f = fair_when(r, p.S, p.W)
    local due = p.t_f - now <= ahead
    local tier, wait
    if not r.suspended and not r.o.book and not no_slot and due then
      reply, tier, wait = fair_run_due(r, p, ahead)
      if reply then return reply end
    else
      local from = math.max(now, p.t_f)
      if not due then
        from = math.max(now, fair_booked(r, p.S, p.W, tenant, p.t_f, p.rec and p.rec.w or p.w))
      end
      tier, wait = short(r, c, from, not p.fresh)
      wait = from + wait - now
    end
    -- Not due, or no room: at its tenant's turn, when the tiers allow.
    local by = 'queue'
    if tier > 0 then by = 'tier:' .. tier end
    local earliest = now + wait
    if r.suspended then
      by = 'suspended'
      if r.until_ > earliest then earliest = r.until_ end
    elseif no_slot and due then
      if p.resv and p.resv < now then
        -- A holder at its turn waits for a slot in flight (its worker polls,
        -- then asynq brings it back): its booking is expected from now on.
        -- Left at its instant, it was taken for a task that never comes
        -- back (fair_least_live) two granules on, its tag dropped while its
        -- work stayed in its tenant's finish tag, and it came back as a
        -- fresh task, booked behind its own work.
        redis.call('ZADD', r.resv_key, 'XX', now, id)
        p.resv = now
      end
      return denied(r, math.max(slot_wait(r) - now, 1000), 'inflight', p.resv or 0)
    end
    if r.o.horizon <= 0 or id == '' then return denied(r, earliest - now, by, 0) end
    return fair_reserve(r, p, earliest, by)
  end

  -- fair_write adds the fair state's fields to fields (for write_back's
  -- HSET) and deletes what ended. The key's T says whether tenants are
  -- active (q = -1).
  function fair_write(r, fields)
    local g = r.g
    fields[#fields + 1] = 'G'
    fields[#fields + 1] = pack_G(g)
    if r.yield_set then
      fields[#fields + 1] = 'Y'
      fields[#fields + 1] = r.yielded
    end
    for id in pairs(r.fair_dirty) do
      local rec = r.tenants[id]
      if rec then
        fields[#fields + 1] = 't:' .. id
        fields[#fields + 1] = pack_tenant(rec)
      end
    end
    if #r.stag_del > 0 then redis.call('ZREM', r.tkey, unpack(r.stag_del)) end
    if #r.stag_set > 0 then
      redis.call('ZADD', r.tkey, unpack(r.stag_set))
      -- (As the reservations: their lapse past the last one booked.)
      extend_to(r.tkey, (r.fair_need or 0) + r.o.lapse)
    end
    local gone, del = nil, nil
    for id in pairs(r.leaving) do
      gone, del = gone or {}, del or {}
      gone[#gone + 1] = id
      del[#del + 1] = 't:' .. id
    end
    if gone then
      redis.call('ZREM', r.akey, unpack(gone))
      redis.call('HDEL', r.key, unpack(del))
    end
    if g.W > 0 then r.q_override = -1 else r.q_override = 0 end
  end
end

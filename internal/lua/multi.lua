-- multi.lua: one decision across several keys (issue 30), part of the
-- decide function's library (after decide.lua, fair.lua and run.lua, whose
-- functions it uses). decide.go's DecideMulti states its keys, arguments
-- and reply. A task of one key never comes here: decide_run decides it,
-- unchanged.
--
-- A task may name up to MULTI_MAX keys ("slack:T0123:chat.postMessage",
-- "slack:T0123", "slack"): one caller, decided in one run, on one clock.
-- Each key's state is built in memory as the one-key path builds it
-- (run_state); then:
--   1. a cost one key can never hold is refused for good, naming the key;
--   2. a booking under an ID that holds a reservation in any key changes
--      nothing;
--   3. a holder (its reservation looked up in every key whose queue is
--      open) not due yet in some key waits for its latest instant (a hold
--      counts no later than the caller's booking, which a refund may have
--      brought forward; holds alone, their booking dropped by a Resume or
--      SetLimits, are given up: it is a fresh caller); paced
--      in every key, one due is admitted at the first instant every key
--      admits it within the granule;
--   4. otherwise it takes its cost from every tier of every key, all or
--      none: nothing is written to any key unless every key admits
--      (no counter pollution);
--   5. refused, the refusal that lasts longest decides: a suspension of
--      any key defers to the latest suspension end; a key refusing only
--      for its slots in flight sends the caller back when one is expected
--      free, without a reservation; otherwise, with a horizon and a task
--      ID, the caller reserves ONE instant that every key admits (the
--      latest of each key's earliest instant, asked again of each key
--      until they agree) and holds it in the reservations of every key.
-- A key's schedule (GCRA: it books in order, and cannot fill a hole before
-- its last booking) is booked only where the instant follows the key's
-- own first free instant closely (the key that made the caller wait, and
-- any as busy). Booked in a key that could run callers sooner, the
-- instant would hold every fresh caller of that key behind it: a 429 on
-- one workspace key would stop every workspace of the app key. There the
-- caller holds the instant as a "hold" ('~' .. task ID in the key's
-- reservations, the same instant): found when it comes back, it is not
-- sent behind that key's queue, and the key's tiers decide; the key's
-- schedule and windows are not changed.
-- The reply names the key that decided (its position, 1-based; for a
-- holder admitted at an instant ahead, the key whose turn it waits for)
-- and each key's outcome.
--
-- Tenants (fair.lua): on a key where the caller names a tenant (ARGV[4],
-- flag 8), or whose tenants are active (the default tenant then), the key
-- is decided in tenants' order, as decide_fair_run decides it for a caller
-- of that key alone: its clock brought to now, the caller's place among
-- its tenants (fair_place: its start tag, due at fair_when within
-- fair_ahead). Such a key has no schedule (its queue is its tenants'
-- tags): the caller is admitted only when every such key is due and every
-- tier of every key admits it, and counted then in each such key's fair
-- state (fair_admit: fair_run_due's accounting); refused, each such key's
-- earliest instant is its tenant's turn (fair_booked when not due) and
-- its tiers' then, and the one instant every key admits is booked there
-- by fair_reserve (the start tag, the tenant's finish tag moved on: the
-- records unbook.lua, resume.lua, setlimits.lua and adjust.lua undo or
-- drop), never held. A holder's booking dropped beyond the horizon gives
-- its tag and work back (fair_drop, unbook's rule). A refusal that books
-- nothing changes nothing of a key's fair state but its clock. Not kept
-- from the one-key path: a late holder's extra granule, and a holder
-- yielding its turn to a late one (fair_yields), both ties within a
-- granule. Leases are never given to a caller of several keys.

local decide_multi
do
  local MULTI_MAX = 4      -- keys per task at most
  local MULTI_STRIDE = 6   -- KEYS per key: bucket, reservations, slots, configuration, tenants, tags
  -- us an instant may lie past a key's own first free instant and still be
  -- booked in its schedule (at least a granule)
  local SOFT_GAP = 1000

  -- A Limiter sends a few distinct options: the multi-key copy of each (no
  -- lease) is made once, and kept as read_options keeps its own.
  local mopts, n_mopts = {}, 0
  local function multi_options(s)
    local m = mopts[s]
    if m then return m end
    local o = read_options(s)
    m = {}
    for k, v in pairs(o) do m[k] = v end
    m.lease = 0
    if n_mopts >= 64 then mopts, n_mopts = {}, 0 end
    mopts[s] = m
    n_mopts = n_mopts + 1
    return m
  end

  -- key_read reads key j (KEYS from base + 1) as decide_run reads one
  -- key, up to run_state: its limits, suspension, buckets and M (its hash
  -- fields h when lean_admit read them already). It
  -- returns nil and the reply every caller of the key gets when it cannot
  -- decide (no limits, bad limits, suspended without limits).
  local function key_read(KEYS, base, o, now, h)
    local ks = {KEYS[base + 1], KEYS[base + 2], KEYS[base + 3], KEYS[base + 4], KEYS[base + 5], KEYS[base + 6]}
    h = h or redis.call('HMGET', ks[1], unpack(HM_FIELDS))
    if not h[1] and not h[D_AT] then
      local _, any = restore_config(ks[1], ks[4])
      if any then h = redis.call('HMGET', ks[1], unpack(HM_FIELDS)) end
    end
    local spec, L, until_ = read_limits(o, h, now)
    if not spec then return nil, L end
    local ts, x, vnext, stored = read_T(h[2], now, nil)
    local tenants = vnext < 0
    if tenants then vnext = 0 end
    if vnext > now + o.horizon + MAX_SKEW then vnext = 0 end
    local owed = bucket_owed(stored, ts, spec.tiers, now, o.headroom, nil)
    local M = nil
    if spec.units then
      M = read_M(h[6] or nil, spec.tiers)
      local changed = false
      for i, t in ipairs(spec.tiers) do
        if t.kind == 'b' and t.unit and sample_M(M, i, owed[i], now, true) then changed = true end
      end
      if not changed then M = nil end
    end
    return {ks = ks, h = h, spec = spec, L = L, until_ = until_, x = x, vnext = vnext, owed = owed, M = M, tenants = tenants}
  end

  -- key_state makes the run state of a key key_read read (run_state).
  -- fair: the caller is decided in the order of the key's tenants, as
  -- tenant (decide_fair_run's state: the clock brought to now, the
  -- caller's start tag and its tenant's record and weight).
  local function key_state(kr, o, now, fair, id, tenant)
    local r = run_state(kr.ks, o, now, kr.L, kr.h, kr.spec, kr.until_, kr.owed, kr.x, kr.vnext)
    r.M = kr.M
    if not fair then
      -- (tenants active on a key of slots alone: the mark stays)
      if kr.tenants then r.q_override = -1 end
      return r
    end
    local f = redis.call('HMGET', r.key, 'G', 'Y', 't:' .. tenant, 'w:' .. tenant)
    fair_state(r, kr.ks, {G = f[1] or nil})
    r.fair, r.yielded = true, f[2] or nil
    r.taken, r.write_extra = true, fair_write
    r.vnext, r.queue_open = 0, false
    if id ~= '' then
      local s = finite(redis.call('ZSCORE', r.tkey, id))
      if s then r.stags[id] = s end
    end
    tenant_of(r, tenant, f[3] or nil)
    fair_clock(r)
    r.fair_w = weight_of(f[4])
    return r
  end

  -- fits_now says whether key kr admits cost c now on the one-key path's
  -- common case (take_now's rules): buckets alone, no suspension, no
  -- queue, no booking, every bucket with c and room for the headroom.
  local function fits_now(kr, c, o, now)
    local spec = kr.spec
    if (kr.until_ and kr.until_ > now) or spec.windows or spec.inflight or kr.vnext > now or o.book or kr.tenants then
      return false
    end
    local headroom, owed = o.headroom, kr.owed
    for i, t in ipairs(spec.tiers) do
      local ci = cv(c, i)
      if ci > 0 and owed[i] + headroom * t.rate - (t.burst - ci) * t.p > 0 then return false end
    end
    return true
  end

  -- soft_of returns the caller's hold of an instant in key r (see the top
  -- of this file), or nil; one lapsed is dropped.
  local function soft_of(r, id)
    local at = finite(redis.call('ZSCORE', r.resv_key, '~' .. id))
    if at and at < r.now - r.o.lapse then
      redis.call('ZREM', r.resv_key, '~' .. id)
      return nil
    end
    return at
  end

  -- hold_soft holds instant at for the caller in key r without booking
  -- the key's schedule.
  local function hold_soft(r, id, at)
    redis.call('ZADD', r.resv_key, at, '~' .. id)
    extend_to(r.resv_key, at - r.now + r.o.lapse + SWEEP_EVERY)
  end

  -- restore_windows counts the caller's booked reservations in the
  -- windows again (they left them while it was decided).
  -- (A key's tenants' reservations are not counted in its windows:
  -- fair_reserve's rule.)
  local function restore_windows(rs, resv, soft, c)
    for k, r in ipairs(rs) do
      if resv[k] and not soft[k] and not r.fair then reserve_windows(r, resv[k], c[k], 1) end
    end
  end

  -- fair_admit admits caller p (fair_place's) in key r at at, counted in
  -- the key's fair state as fair_run_due counts a caller of one key: its
  -- tenant's finish tag, the clock a tenant alone runs ahead of, its tag
  -- taken out.
  local function fair_admit(r, p, at)
    local S = p.S
    local _, trec = fair_book(r, p.tenant, p.w, p.u, S)
    trec.units = trec.units + p.u
    if p.fresh and S > r.g.V and trec.w >= r.g.W then r.g.V = S end
    if S > r.g.Vs then r.g.Vs = S end
    if not p.fresh then r.stag_del[#r.stag_del + 1] = p.id end
    return admit(r, p.resv, p.id, p.c, math.ceil(at))
  end

  -- fair_drop gives up holder p's booking in key r (its reservation
  -- dropped): its tag, and the work it added to its tenant's finish tag,
  -- as unbook.lua does. Kept, the task came back as a fresh one and was
  -- tagged behind its own work.
  local function fair_drop(r, p)
    r.stag_del[#r.stag_del + 1] = p.id
    local rec = tenant_of(r, p.tenant)
    if not rec then return end
    local F = math.max(rec.F - p.u / rec.w, p.S)
    if F < rec.F then
      rec.F = F
      r.fair_dirty[p.tenant] = true
      if F < r.g.Fmin then r.g.Fmin = F end
      -- (the set's scores may be low, never high: fair_expire)
      redis.call('ZADD', r.akey, fmt(F), p.tenant)
    end
  end

  -- drop_resv gives up the caller's reservations (booked again beyond the
  -- horizon, or no instant found).
  local function drop_resv(rs, resv, soft, id, fp)
    for k, r in ipairs(rs) do
      if resv[k] then
        redis.call('ZREM', r.resv_key, soft[k] and '~' .. id or id)
        r.resv_removed = true
        if fp[k] then fair_drop(r, fp[k]) end
      end
    end
  end

  -- fit_holds makes the caller's holds ('~' .. ID) wait for no more
  -- than its bookings: a hold stands beside the instant booked in another
  -- key, and never lies past it but when that booking moved or went.
  -- Brought forward (a refund), a hold past it counts at the booking's
  -- instant (the hold still keeps its key's queue from it). Gone (a Resume
  -- or SetLimits of the key that booked it dropped that key's queue, and
  -- brought the task back to be decided now), holds not due yet are given
  -- up: it is a fresh caller. (Due in every key, its holds stand: the
  -- tiers decide.)
  local function fit_holds(rs, resv, soft, id)
    local booked = nil
    for k in ipairs(rs) do
      if resv[k] and not soft[k] and (not booked or resv[k] > booked) then booked = resv[k] end
    end
    if booked then
      for k in ipairs(rs) do
        if soft[k] and resv[k] > booked then resv[k] = booked end
      end
      return
    end
    local due = true
    for k, r in ipairs(rs) do
      if resv[k] then
        local early = r.o.granule
        if r.paced then early = early + PACE_EARLY end
        if r.now < resv[k] - early then due = false end
      end
    end
    if due then return end
    for k, r in ipairs(rs) do
      if soft[k] then
        redis.call('ZREM', r.resv_key, '~' .. id)
        resv[k], soft[k] = nil, false
      end
    end
  end

  -- all_denied makes every key's refusal: retry after retry (us), each
  -- key's reason (by[k], '' for a key that admitted), the reserved instant
  -- (0 none).
  local function all_denied(rs, retry, by, at)
    local out = {}
    for k, r in ipairs(rs) do out[k] = denied(r, retry, by[k] or '', at) end
    return out
  end

  -- common_turn returns the first instant at or after at at which every
  -- key admits the caller as a holder (short), whether they agreed within
  -- the bounded rounds, and the key that last moved the instant (0 none).
  local function common_turn(rs, c, at, holder)
    local by = 0
    for _ = 1, 3 * #rs do
      local moved = false
      for k, r in ipairs(rs) do
        local tier, wait = short(r, c[k], at, holder[k])
        if tier ~= 0 then at, moved, by = at + wait, true, k end
      end
      if not moved then return at, true, by end
    end
    return at, false, by
  end

  -- common_fit returns the first instant at or after s that every key's
  -- schedule admits the caller at (earliest_fit, asked of each key again
  -- until none moves it), and whether they agreed.
  local function common_fit(rs, c, s)
    for _ = 1, 2 * #rs + 2 do
      local moved = false
      for k, r in ipairs(rs) do
        local a = earliest_fit(r, c[k], s)
        if a > s + SLACK then s, moved = a, true end
      end
      if not moved then return math.ceil(s), true end
    end
    return math.ceil(s), false
  end

  -- admit_all admits the caller in every key at at, taking up its
  -- reservations and holds.
  local function admit_all(rs, resv, soft, holder, id, c, at, fp)
    local out = {}
    for k, r in ipairs(rs) do
      -- (a hold in a key whose queue had closed was not looked up)
      if soft[k] or (holder and not resv[k]) then redis.call('ZREM', r.resv_key, '~' .. id) end
      if fp[k] and r.idle_fit then
        -- (no tenant active, and its buckets admit the caller now: taken
        -- as take_now takes a caller of that key alone, outside the
        -- tenants' order; a tag it holds means nothing while none is)
        if not fp[k].fresh then r.stag_del[#r.stag_del + 1] = id end
        out[k] = admit(r, fp[k].resv, id, c[k], at)
      elseif fp[k] then
        out[k] = fair_admit(r, fp[k], at)
      else
        out[k] = admit(r, not soft[k] and resv[k] or nil, id, c[k], at)
      end
    end
    return out
  end

  -- multi_one decides for caller id (cost argument raw) over the keys rs
  -- (their positions pos). It returns the position of the key that
  -- decided (0: admitted), and either every key's reply (a table) or one
  -- reply for all.
  local function multi_one(rs, pos, id, raw, tenant)
    local o, now, n = rs[1].o, rs[1].now, #rs
    local c, resv = {}, {}
    for k, r in ipairs(rs) do
      c[k] = cost_vec(raw, r.spec)
      local refused = cost_refused(r, c[k])
      if refused then return pos[k], refused end
    end
    if o.book and id ~= '' then
      for k, r in ipairs(rs) do
        local held = finite(redis.call('ZSCORE', r.resv_key, id))
        if held and held >= now - o.lapse then return pos[k], string.format('0|0|0|booked|0|0|%d', r.gen) end
      end
    end
    -- On a key its tenants share, the caller's place among them
    -- (fair_place): its start tag, and whether its tenant's turn is due
    -- (fair_when, within fair_ahead).
    local fp = {}
    for k, r in ipairs(rs) do
      if r.fair then
        local p, reply = fair_place(r, id, c[k], tenant, r.fair_w)
        if not p then return pos[k], reply end
        p.ahead = fair_ahead(r, c[k], p.fresh)
        p.t_f = fair_when(r, p.S, p.W)
        p.due = p.t_f - now <= p.ahead
        fp[k] = p
      end
    end
    -- The caller's reservations; its reserved calls leave the windows
    -- while it is decided, and go back where it ends up. (On a key its
    -- tenants share, a reservation with a start tag: fair_place's.)
    local holder, soft = false, {}
    if not o.book and id ~= '' then
      for k, r in ipairs(rs) do
        if fp[k] then
          resv[k] = fp[k].resv
          if resv[k] then holder = true end
        elseif r.queue_open then
          resv[k] = reservation_of(r, id)
          if resv[k] then
            reserve_windows(r, resv[k], c[k], -1)
          else
            resv[k] = soft_of(r, id)
            soft[k] = resv[k] ~= nil
          end
          if resv[k] then holder = true end
        end
      end
      if holder then fit_holds(rs, resv, soft, id) end
      holder = next(resv) ~= nil
    end
    local susp = nil
    for _, r in ipairs(rs) do
      if r.suspended and (not susp or r.until_ > susp) then susp = r.until_ end
    end
    local queued, no_slot = {}, {}
    for k, r in ipairs(rs) do
      queued[k] = resv[k] == nil and r.vnext > now
      no_slot[k] = r.slot_n ~= nil and r.held >= r.slot_n and not o.book
    end

    if holder and not susp then
      -- Not due yet in a key: wait for the latest instant held.
      local latest, lk, limit, due = 0, 1, math.huge, true
      for k, r in ipairs(rs) do
        local early = o.granule
        if r.paced then early = early + PACE_EARLY else limit = 0 end
        if resv[k] then
          if now < resv[k] - early then due = false end
          if resv[k] > latest then latest, lk = resv[k], k end
          if early < limit then limit = early end
        end
      end
      if not due then
        restore_windows(rs, resv, soft, c)
        local by = {}
        by[lk] = 'reserved'
        return pos[lk], all_denied(rs, latest - now, by, latest)
      end
      -- Paced in every key: admitted at the first instant every key
      -- admits it, within the granule (holder_turn's rule).
      if limit > 0 then
        local free = true
        for k in ipairs(rs) do
          if queued[k] or (rs[k].slot_n and rs[k].held >= rs[k].slot_n) then free = false end
          if fp[k] and not fp[k].due then free = false end
        end
        if free then
          local hold = {}
          for k in ipairs(rs) do hold[k] = resv[k] ~= nil end
          local at, agreed, by = common_turn(rs, c, now, hold)
          if agreed and at - now <= limit then
            -- (admitted ahead: the reply names the key whose turn it waits for)
            local dk = 0
            if by > 0 and math.ceil(at) > now then dk = pos[by] end
            return dk, admit_all(rs, resv, soft, holder, id, c, math.ceil(at), fp)
          end
        end
      end
    end

    -- Take from every tier of every key, or from none.
    local tiers, waits, ok = {}, {}, not susp and not o.book
    for k, r in ipairs(rs) do
      local p = fp[k]
      if p then
        -- (its tenant's turn: a holder at its tag, as fair_run_due)
        tiers[k], waits[k] = short(r, c[k], now, not p.fresh)
        if not p.due then ok = false end
      else
        tiers[k], waits[k] = short(r, c[k], now, resv[k] ~= nil and now >= resv[k])
      end
      if tiers[k] ~= 0 or queued[k] or no_slot[k] then ok = false end
    end
    if ok then return 0, admit_all(rs, resv, soft, holder, id, c, now, fp) end

    -- Refused: each key's reason and earliest instant; the latest decides.
    local by, earl, slot_only, could_run = {}, {}, false, true
    for k, r in ipairs(rs) do
      local e, b, p = now + waits[k], nil, fp[k]
      local turn = false -- (its tenant's turn is not due on this key)
      if p and (o.book or not p.due) then
        -- At its tenant's turn (as decide_fair: not due, when the work
        -- booked before it is served), when the tiers allow then.
        local from = math.max(now, p.t_f)
        if not p.due then
          from = math.max(now, fair_booked(r, p.S, p.W, tenant, p.t_f, p.rec and p.rec.w or p.w))
          turn = true
        end
        local tr, wt = short(r, c[k], from, not p.fresh)
        tiers[k], e = tr, from + wt
      elseif p and e < p.t_f then
        -- (due, refused by a tier now: fair_run_due's wait)
        e = p.t_f
      end
      if r.suspended then
        b = 'suspended'
        if r.until_ > e then e = r.until_ end
      elseif turn and tiers[k] == 0 then
        b = 'queue'
      elseif tiers[k] > 0 then
        b = 'tier:' .. tiers[k]
      elseif no_slot[k] and not queued[k] then
        b, slot_only = 'inflight', true
        e = math.max(slot_wait(r), now + 1000)
      elseif queued[k] or o.book then
        b = 'queue'
      end
      -- (a key whose slots are all held cannot run it now, whatever the
      -- schedule says: decide_one's could_run)
      if (b and b ~= 'queue') or no_slot[k] then could_run = false end
      by[k], earl[k] = b, e
    end
    local dk, earliest = 0, now
    for k in ipairs(rs) do
      if by[k] and (dk == 0 or earl[k] > earliest) then dk, earliest = k, earl[k] end
    end
    if slot_only then
      -- A slot frees when its holder ends, not on a schedule: no
      -- reservation is made (one held is kept).
      restore_windows(rs, resv, soft, c)
      local held = 0
      for k, r in ipairs(rs) do
        if fp[k] and resv[k] and resv[k] < now then
          -- (its booking on a key its tenants share is expected from now
          -- on, as decide_fair keeps a holder waiting for a slot: left at
          -- its instant, its tag was dropped as one of a task that never
          -- comes back; and its tag is kept, which this run's clock may
          -- have dropped so, its work still in its tenant's finish tag)
          redis.call('ZADD', r.resv_key, 'XX', now, id)
          resv[k] = now
          local p, trec = fp[k], tenant_of(r, tenant)
          r.stag_set[#r.stag_set + 1] = fmt(p.S - (trec and trec.shift or 0))
          r.stag_set[#r.stag_set + 1] = id
        end
        if resv[k] and resv[k] > held then held = resv[k] end
      end
      return pos[dk], all_denied(rs, earliest - now, by, held)
    end
    if o.horizon <= 0 or id == '' then
      for k, r in ipairs(rs) do
        if queued[k] and r.vnext > earliest then
          dk, earliest = k, r.vnext
          if not r.suspended then by[k] = 'queue' end
        end
      end
      return pos[dk], all_denied(rs, earliest - now, by, 0)
    end

    -- Reserve one instant every key admits, held in every key.
    if holder then
      local keep, R = true, 0
      for k in ipairs(rs) do
        if not resv[k] then keep = false elseif resv[k] > R then R = resv[k] end
      end
      if keep and R >= earliest then
        restore_windows(rs, resv, soft, c)
        return pos[dk], all_denied(rs, R - now, by, R)
      end
    end
    for _, r in ipairs(rs) do load_schedule(r) end
    -- Each key's own first free instant, before they agree.
    local own = {}
    for k, r in ipairs(rs) do own[k] = earliest_fit(r, c[k], earl[k]) end
    local at, agreed = common_fit(rs, c, earliest)
    if not agreed or at - now > o.horizon then
      -- Beyond the horizon (or no instant every key agrees on): come back
      -- when one can be reserved.
      drop_resv(rs, resv, soft, id, fp)
      local retry = at - now
      if agreed then retry = at - o.horizon - now end
      return pos[dk], all_denied(rs, retry, by, 0)
    end
    if at <= now and could_run and not susp and not o.book then
      -- (every key's own instant is now: each schedule counts the call)
      for k, r in ipairs(rs) do
        if not fp[k] then
          book_schedule(r, c[k], at)
          reserve_windows(r, at, c[k], -1)
        end
      end
      return 0, admit_all(rs, resv, soft, holder, id, c, now, fp)
    end
    -- Booked where the instant leaves no hole before it; held elsewhere.
    -- A key its tenants share books it at the caller's place among them
    -- (fair_reserve: a fresh caller's tag, its tenant's finish tag moved
    -- on), with no schedule to leave a hole in.
    for k, r in ipairs(rs) do
      local gap = math.max(o.granule, SOFT_GAP)
      if fp[k] then
        fair_reserve(r, fp[k], at, by[k] or '')
      elseif at - own[k] <= gap then
        if soft[k] then redis.call('ZREM', r.resv_key, '~' .. id) end
        book_schedule(r, c[k], at)
        hold_resv(r, id, at)
      else
        if resv[k] and not soft[k] then
          redis.call('ZREM', r.resv_key, id)
          r.resv_removed = true
        end
        hold_soft(r, id, at)
      end
    end
    return pos[dk], all_denied(rs, math.max(at - now, 0), by, at)
  end

  -- decide_multi is the function: KEYS in groups of MULTI_STRIDE, one per
  -- key; ARGV[1] the options, ARGV[2] the task ID, ARGV[3] the cost,
  -- ARGV[4] the tenant ('' or none: the default tenant).
  -- Per key position, what lean_admit reads (made once per function
  -- library and refilled, as run.lua's OWED and STORED): the hash fields
  -- (h), what T stored and what the buckets owe, and each key's limits
  -- (spec, L) and expiry memo (x).
  -- (one table: the library's main chunk is near Lua's 200 locals)
  local LEAN = {h = {}, stored = {}, owed = {}, spec = {}, L = {}, x = {}}
  for j = 1, MULTI_MAX do LEAN.stored[j], LEAN.owed[j] = {}, {} end

  -- lean_admit is the common case of a caller of cost 1 (requests, on keys
  -- without units): every key admits it now on buckets alone, by
  -- fits_now's rules, and takes it as the one-key path's take_now does,
  -- without the general state (the key_read tables, a cost vector per
  -- key). It returns the reply, or nil and how many keys it read (LH)
  -- for the general path, which then reads them no more.
  local function lean_admit(KEYS, nk, o, now)
    local headroom = o.headroom
    local LH, LSPEC, LL, LX, LOWED = LEAN.h, LEAN.spec, LEAN.L, LEAN.x, LEAN.owed
    for j = 1, nk do
      local base = MULTI_STRIDE * (j - 1)
      local h = redis.call('HMGET', KEYS[base + 1], unpack(HM_FIELDS))
      LH[j] = h
      if not h[1] and not h[D_AT] then return nil, j end -- (restore_config, or no limits)
      local spec, L, until_ = read_limits(o, h, now)
      if not spec or spec.units or spec.windows or spec.inflight or (until_ and until_ > now) then return nil, j end
      local ts, x, vnext, stored = read_T(h[2], now, LEAN.stored[j])
      if vnext < 0 or (vnext > now and vnext <= now + o.horizon + MAX_SKEW) then return nil, j end
      local owed = bucket_owed(stored, ts, spec.tiers, now, headroom, LOWED[j])
      local tiers = spec.tiers
      for i = 1, #tiers do
        local t = tiers[i]
        if owed[i] + headroom * t.rate - (t.burst - 1) * t.p > 0 then return nil, j end
      end
      LSPEC[j], LL[j], LX[j] = spec, L, x
    end
    local out = {}
    for j = 1, nk do
      local base = MULTI_STRIDE * (j - 1)
      local reply = take_now(KEYS[base + 1], KEYS[base + 4], o, now, LL[j], LH[j][2] ~= false, LSPEC[j], LOWED[j], LX[j], 1, nil)
      if not reply then error('decide_multi: key ' .. j .. ' refused what it admitted') end
      out[j] = reply
    end
    return '0;' .. table.concat(out, ';')
  end

  decide_multi = function(KEYS, ARGV)
    local nk = math.floor(#KEYS / MULTI_STRIDE)
    if nk < 1 or nk > MULTI_MAX or #KEYS ~= nk * MULTI_STRIDE then
      error('decide_multi: ' .. #KEYS .. ' keys: want ' .. MULTI_STRIDE .. ' per limiter key, 1 to ' .. MULTI_MAX .. ' of them')
    end
    local o = multi_options(ARGV[1])
    local id, raw, tenant = ARGV[2] or '', ARGV[3] or '1', ARGV[4] or ''
    local now = now_us()
    local read = 0
    if raw == '1' and not o.book then
      local reply
      reply, read = lean_admit(KEYS, nk, o, now)
      if reply then return reply end
    end
    local krs, pos, out = {}, {}, {}
    for j = 1, nk do
      local kr, reply = key_read(KEYS, MULTI_STRIDE * (j - 1), o, now, j <= read and LEAN.h[j] or nil)
      if kr then
        local i = #krs + 1
        krs[i], pos[i] = kr, j
      elseif reply == '-2' then
        out[j] = '-2' -- (a key without limits limits nothing)
      else
        return j .. ';' .. reply
      end
    end
    if #krs == 0 then return '0;' .. table.concat(out, ';') end
    -- The common case: every key admits the caller now on buckets alone
    -- (take_now's rules): each takes it as the one-key path does, without
    -- the general state.
    local c, all = {}, true
    for i, kr in ipairs(krs) do
      c[i] = cost_vec(raw, kr.spec)
      if all and not fits_now(kr, c[i], o, now) then all = false end
    end
    if all then
      for i, kr in ipairs(krs) do
        local reply = take_now(kr.ks[1], kr.ks[4], o, now, kr.L, kr.h[2] ~= false, kr.spec, kr.owed, kr.x, c[i], kr.M)
        if not reply then error('decide_multi: key ' .. pos[i] .. ' refused what it admitted') end
        out[pos[i]] = reply
      end
      return '0;' .. table.concat(out, ';')
    end
    local rs = {}
    for i, kr in ipairs(krs) do
      -- In tenants' order where the one-key path would be: the caller
      -- says its tenant, or the key's tenants are active (a caller that
      -- says none is the default tenant, as after the one-key path's -4);
      -- a key of slots alone has no rate to share.
      local fair = (o.fair or kr.tenants) and #kr.spec.tiers > 0
      rs[i] = key_state(kr, o, now, fair, id, tenant)
      -- (a key whose tenants are not active and whose buckets admit the
      -- caller now admits it as the one-key path's take_now does, without
      -- making its tenant active: fair order only once a key refuses)
      if fair and not kr.tenants then rs[i].idle_fit = fits_now(kr, c[i], o, now) end
    end
    local k, replies = multi_one(rs, pos, id, raw, tenant)
    if type(replies) == 'string' then
      return k .. ';' .. replies
    end
    for _, r in ipairs(rs) do write_back(r) end
    for i, r in ipairs(replies) do out[pos[i]] = r end
    return k .. ';' .. table.concat(out, ';')
  end
end

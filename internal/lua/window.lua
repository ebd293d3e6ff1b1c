-- window.lua: the state of window tiers, shared by the scripts that decide,
-- adjust, inspect or learn a window (loaded after lib.lua).
--
-- A window tier counts calls per sub-window (per/WINDOW_SLICES long, a
-- whole number of microseconds) and the latest instant it counted in each:
-- a call counts for a decision at at while at - call < per + headroom, so
-- any window of length per, whatever its phase, sees at most N. A
-- sub-window's calls leave together, at its latest instant + per + headroom
-- (a batch admitted at one instant leaves a period later, not at the end of
-- its sub-window: that end made a backlog's batches come a sub-window later
-- every period, and a provider's fixed windows lose one whole window in
-- twenty). Calls reserved for an instant and not yet taken up count the
-- same way. (Counts are keyed by minus the sub-window's index: a large
-- positive integer key makes some Lua implementations, miniredis's among
-- them, grow a table's array part up to it.)
--
-- State (the W<per_ms> field): "base c0,c1,...|idx:cost ...": calls per
-- sub-window from index base, then reserved calls by sub-window index; a
-- count or cost may carry "+off", the latest instant counted in its
-- sub-window (us after its start). Without it, the sub-window's end.

-- A fixed window (FixedWindow, t.fixed) counts calls per window [i*per,
-- (i+1)*per) of the Redis clock, aligned to the Unix epoch as providers
-- align theirs (GitHub's hour, the IETF draft's windows): one sub-window per
-- window, the same state. A call is made only from headroom after its
-- window's start to headroom before its end (fix_span), so one that leaves
-- up to headroom late, or a provider's clock up to headroom apart, still
-- lands in the provider's window it was counted in. A backlog gets n calls
-- at the opening of every window: no drift, no window without a call.

-- fix_span returns the first and last instants a call may be made for in
-- fixed window i (headroom at most a quarter of the window).
local function fix_span(t, i, headroom)
  local h = math.min(headroom, t.p / 4)
  return i * t.p + h, (i + 1) * t.p - h
end

-- fix_used is what fixed window i holds: calls admitted and reserved.
local function fix_used(w, i)
  return (w.c[-i] or 0) + (w.r[-i] or 0)
end

-- fix_count is what a fixed window holds for a decision at at: its calls,
-- or all of n when at is outside the span its calls may be made in.
local function fix_count(w, t, at, headroom)
  local i = math.floor(at / t.p)
  local lo, hi = fix_span(t, i, headroom)
  if at < lo or at > hi then return t.n end
  return fix_used(w, i)
end

-- fix_free is win_free for a fixed window: at, or the opening of the first
-- window from at's on with room for c more calls (nil: none up to limit).
local function fix_free(w, t, at, c, headroom, limit)
  local i = math.floor(at / t.p)
  local lo, hi = fix_span(t, i, headroom)
  if at < lo then at = lo end
  if at <= hi and at <= limit and fix_used(w, i) + c <= t.n then return at end
  local last = i
  for _, tbl in ipairs({w.c, w.r}) do
    for k in pairs(tbl) do
      if -k > last then last = -k end
    end
  end
  for j = i + 1, last + 1 do
    local x = fix_span(t, j, headroom)
    if x > limit then return nil end
    if fix_used(w, j) + c <= t.n then return x end
  end
  return nil
end

-- win_item reads "c" or "c+off".
local function win_item(tok)
  local c, off = string.match(tok, '^(%d+)%+?(%d*)$')
  return tonumber(c), tonumber(off)
end

-- win_load reads a window's state, dropping sub-windows older than
-- anything a decision at now still looks at. Calls admitted (c) and calls
-- reserved for an instant (r) are counted per sub-window, with their latest
-- instants (cl, rl: us since the sub-window's start).
local function win_load(raw, t, now, headroom)
  local w = {c = {}, r = {}, cl = {}, rl = {}}
  local oldest = math.floor((now - t.p - headroom) / t.sub) - 1
  if raw then
    local base, counts, resv = string.match(raw, '^(%d+) ([%d,+]*)|?(.*)$')
    base = tonumber(base)
    if base then
      local i = base
      for tok in string.gmatch(counts, '[^,]+') do
        local c, off = win_item(tok)
        if i >= oldest and c then
          w.c[-i], w.cl[-i] = c, off
        end
        i = i + 1
      end
      for x, tok in string.gmatch(resv or '', '(%d+):([%d+]+)') do
        x = tonumber(x)
        local c, off = win_item(tok)
        if x >= oldest and c then
          w.r[-x] = (w.r[-x] or 0) + c
          if off and (w.rl[-x] == nil or off > w.rl[-x]) then w.rl[-x] = off end
        end
      end
    end
  end
  return w
end

-- win_leaves is when the calls and reservations of sub-window i leave a
-- window: its latest instant + per + headroom.
local function win_leaves(w, t, i, headroom)
  if t.fixed then return (i + 1) * t.p + math.min(headroom, t.p / 4) end
  local off = -1
  if (w.c[-i] or 0) > 0 then off = w.cl[-i] or t.sub end
  if (w.r[-i] or 0) > 0 then off = math.max(off, w.rl[-i] or t.sub) end
  if off < 0 then off = t.sub end -- (nothing there)
  return i * t.sub + off + t.p + headroom
end

-- win_span returns the first and last sub-windows a decision at at looks
-- at, and whether the first still counts (its latest instant within the
-- window).
local function win_span(w, t, at, headroom)
  local first = math.floor((at - t.p - headroom) / t.sub)
  local last = math.floor(at / t.sub)
  return first, last, win_leaves(w, t, first, headroom) > at
end

-- win_peak returns the most calls any window holding sub-window last (and
-- starting after first) holds, given n, what [first, last] holds (first
-- counted or not): calls admitted for instants after last (a paced
-- admission is counted at the instant its worker was told to call, which
-- may be after a later decision's) count in the windows that reach them.
-- Reservations after last are not counted: the queue keeps fresh callers
-- off them.
local function win_peak(w, first, last, n, first_in)
  local cs, rs = w.c, w.r
  local ahead = false
  for k, v in pairs(cs) do
    if -k > last and v > 0 then ahead = true break end
  end
  if not ahead then return n end
  local peak = n
  for k = 1, last - first do
    local drop = first + k - 1
    if k > 1 or first_in then
      n = n - (cs[-drop] or 0) - (rs[-drop] or 0)
    end
    n = n + (cs[-(last + k)] or 0)
    if n > peak then peak = n end
  end
  return peak
end

-- win_count returns the calls a window holds for a decision at at: those
-- admitted and reserved within per + headroom before it, or, when calls
-- were admitted for instants after it, the most any window holding at
-- holds.
local function win_count(w, t, at, headroom)
  if t.fixed then return fix_count(w, t, at, headroom) end
  local first, last, first_in = win_span(w, t, at, headroom)
  local n = 0
  local c, r = w.c, w.r
  local from = first
  if not first_in then from = first + 1 end
  for i = from, last do n = n + (c[-i] or 0) + (r[-i] or 0) end
  return win_peak(w, first, last, n, first_in)
end

-- win_free returns the earliest time at or after at when the window has
-- room for c more calls (counting everything it holds now), or nil when no
-- time up to limit does: at, or the next instants a sub-window's calls
-- leave the window.
local function win_free(w, t, at, c, headroom, limit)
  if t.fixed then return fix_free(w, t, at, c, headroom, limit) end
  if win_count(w, t, at, headroom) + c <= t.n then return at end
  local cands = {}
  local lo = math.floor((at - t.p - headroom) / t.sub)
  local seen = {}
  for _, tbl in ipairs({w.c, w.r}) do
    for k, v in pairs(tbl) do
      local i = -k
      if v > 0 and i >= lo and not seen[i] then
        seen[i] = true
        local x = math.ceil(win_leaves(w, t, i, headroom))
        if x > at and x <= limit then cands[#cands + 1] = x end
      end
    end
  end
  table.sort(cands)
  for _, x in ipairs(cands) do
    if win_count(w, t, x, headroom) + c <= t.n then return x end
  end
  return nil
end

-- win_add counts c calls admitted at at.
local function win_add(w, t, at, c)
  local i = math.floor(at / t.sub)
  w.c[-i] = (w.c[-i] or 0) + c
  local off = math.ceil(at - i * t.sub)
  if w.cl[-i] == nil or off > w.cl[-i] then w.cl[-i] = off end
end

-- win_reserve counts c calls reserved for the instant at; win_unreserve
-- takes them away again (the holder came, or lost its reservation).
local function win_reserve(w, t, at, c)
  local i = math.floor(at / t.sub)
  w.r[-i] = (w.r[-i] or 0) + c
  local off = math.ceil(at - i * t.sub)
  if w.rl[-i] == nil or off > w.rl[-i] then w.rl[-i] = off end
end
local function win_unreserve(w, t, at, c)
  local i = math.floor(at / t.sub)
  local v = (w.r[-i] or 0) - c
  if v > 0 then w.r[-i] = v else w.r[-i], w.rl[-i] = nil, nil end
end

-- win_write formats a window's state (false when it holds nothing), and
-- how long (us) until it is empty.
local function win_write(w, t, now, headroom)
  local lo, hi = nil, nil
  for k, c in pairs(w.c) do
    local i = -k
    if c > 0 then
      if lo == nil or i < lo then lo = i end
      if hi == nil or i > hi then hi = i end
    end
  end
  local parts, resv = {}, {}
  local empty_at = nil
  if lo then
    for i = lo, hi do
      local c, off = w.c[-i] or 0, w.cl[-i]
      if c > 0 and off then
        parts[#parts + 1] = string.format('%d+%d', c, off)
      else
        parts[#parts + 1] = string.format('%d', c)
      end
    end
    empty_at = win_leaves(w, t, hi, headroom)
  end
  local idx = {}
  for k, c in pairs(w.r) do
    if c > 0 then idx[#idx + 1] = -k end
  end
  table.sort(idx)
  for _, i in ipairs(idx) do
    local off = w.rl[-i]
    if off then
      resv[#resv + 1] = string.format('%d:%d+%d', i, w.r[-i], off)
    else
      resv[#resv + 1] = string.format('%d:%d', i, w.r[-i])
    end
    local x = win_leaves(w, t, i, headroom)
    if empty_at == nil or x > empty_at then empty_at = x end
  end
  if not empty_at then return false, 0 end
  local s = string.format('%d ', lo or 0) .. table.concat(parts, ',')
  if #resv > 0 then s = s .. '|' .. table.concat(resv, ' ') end
  return s, math.max(0, math.ceil(empty_at - now))
end


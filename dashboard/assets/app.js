// asynq-throttle dashboard: polls api/keys and draws one card per key.
// Everything is built with DOM calls and textContent (key names are data).
(() => {
  'use strict';
  const body = document.body;
  const readOnly = body.dataset.readOnly === 'true';
  const pollMS = Number(body.dataset.pollMs) || 1000;
  const hasCounts = true; // this process's decisions (none where no middleware runs)
  const outcomes = ['ran', 'deferred', 'suspended', 'failed', 'unthrottled'];
  const historyLen = 60;
  const maxTenantRows = 10; // a card's tenants table; the API has them all
  const main = document.getElementById('keys');
  const cards = new Map(); // key -> card state

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const svgNS = 'http://www.w3.org/2000/svg';

  // fmtSeconds: "37 s", "4 min 05 s", "2 h 10 min".
  function fmtSeconds(s) {
    s = Math.max(0, Math.ceil(s));
    if (s < 60) return s + ' s';
    if (s < 3600) return Math.floor(s / 60) + ' min ' + String(s % 60).padStart(2, '0') + ' s';
    return Math.floor(s / 3600) + ' h ' + String(Math.floor(s % 3600 / 60)).padStart(2, '0') + ' min';
  }
  function fmtRate(r) { return r >= 10 ? r.toFixed(0) : r.toFixed(1); }

  function status(text, isError) {
    const s = document.getElementById('status');
    s.textContent = text;
    s.classList.toggle('error', !!isError);
  }
  let toastTimer;
  function toast(text, isError) {
    const t = document.getElementById('toast');
    t.textContent = text;
    t.classList.toggle('error', !!isError);
    t.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { t.hidden = true; }, 4000);
  }

  function makeCard(key) {
    const c = { key, hist: [], prev: null, data: null, at: 0 };
    c.el = el('section', 'card');
    c.el.dataset.key = key;
    const h = el('h2');
    h.append(el('span', 'name', key));
    c.badge = el('span', 'badge');
    c.gen = el('span', 'gen');
    c.gen.title = 'generation of the limits: every change of limits bumps it';
    h.append(c.badge, c.gen);
    c.el.append(h);
    c.limits = el('div', 'limits');
    c.tiers = el('div', 'tiers');
    c.error = el('div', 'error');
    c.el.append(c.limits, c.tiers, c.error);

    const row = (label) => {
      const r = el('div', 'row');
      r.append(el('span', 'label', label));
      const v = el('span', 'value');
      r.append(v);
      c.el.append(r);
      return v;
    };
    c.suspension = row('suspension');
    c.suspension.classList.add('suspension-value');
    c.forecast = row('backlog');
    c.forecast.classList.add('forecast');
    c.tenants = makeTenants();
    c.tenantsNote = el('div', 'tenants-note');
    c.tenants.hidden = c.tenantsNote.hidden = true;
    c.el.append(c.tenants, c.tenantsNote);
    if (hasCounts) {
      c.rates = row('decisions/s');
      c.rates.classList.add('rates');
      c.r429 = row('429s seen');
      c.r429.classList.add('r429');
      // What this key made tasks wait for: for a task of several keys, the
      // key that decided counts it (not the task's first key).
      c.waits = row('made tasks wait');
      c.waits.classList.add('waits');
      c.waits.title = 'deferrals this key decided, by what made the task wait: which of its limits (tier), or its suspension, queue, slots';
      c.spark = document.createElementNS(svgNS, 'svg');
      c.spark.setAttribute('class', 'spark');
      c.spark.setAttribute('viewBox', '0 0 100 30');
      c.spark.setAttribute('preserveAspectRatio', 'none');
      c.lines = {};
      for (const [o, color] of [['deferred', '#d99a1e'], ['ran', '#2f9e62']]) {
        const p = document.createElementNS(svgNS, 'polyline');
        p.setAttribute('stroke', color);
        c.spark.append(p);
        c.lines[o] = p;
      }
      c.sparkNote = el('div', 'spark-note');
      c.el.append(c.spark, c.sparkNote);
    }

    const a = el('div', 'actions');
    c.duration = el('input', 'duration');
    c.duration.value = '30s';
    c.duration.setAttribute('aria-label', 'suspend for');
    c.suspendBtn = el('button', 'suspend', 'Suspend');
    c.resumeBtn = el('button', 'resume', 'Resume');
    c.limitsIn = el('input', 'limits-input');
    c.limitsIn.setAttribute('aria-label', 'limits');
    c.limitsIn.placeholder = '10/s:burst=20 5000/h:window 30000/m:tokens 4:inflight';
    c.setBtn = el('button', 'set-limits', 'Set limits');
    a.append(c.duration, c.suspendBtn, c.resumeBtn, c.limitsIn, c.setBtn, el('span'));
    for (const x of [c.duration, c.suspendBtn, c.resumeBtn, c.limitsIn, c.setBtn]) {
      x.disabled = readOnly;
      if (readOnly) x.title = 'read-only: start the dashboard with actions on';
    }
    c.suspendBtn.addEventListener('click', () => act(c, 'suspend', { duration: c.duration.value.trim() }, 'suspended for ' + c.duration.value.trim()));
    c.resumeBtn.addEventListener('click', () => act(c, 'resume', {}, 'resumed'));
    c.setBtn.addEventListener('click', () => act(c, 'limits', { limits: c.limitsIn.value.trim() }, 'limits set to ' + c.limitsIn.value.trim()));
    c.el.append(a);
    return c;
  }

  // makeTenants builds the (empty) table of a key's tenants.
  function makeTenants() {
    const t = el('table', 'tenants');
    const tr = t.createTHead().insertRow();
    for (const [name, title, cls] of [
      ['tenant', 'throttle.Tenant; (default): tasks without one', ''],
      ['weight', 'its weight (SetWeights, asynq-throttle weights; 1 when not set)', 'num'],
      ['share', 'its part of the key\'s rate now: its weight over those of the tenants with work booked', 'num'],
      ['backlog', 'work booked and not yet due, in cost units', 'num'],
      ['admitted', 'work admitted since it last had work booked, in cost units', 'num'],
    ]) {
      const th = el('th', cls, name);
      th.title = title;
      tr.append(th);
    }
    t.createTBody();
    return t;
  }

  function fmtShare(s) {
    if (!(s > 0)) return '–';
    const p = s * 100;
    return p < 0.1 ? '<0.1%' : p.toFixed(1) + '%';
  }

  // tenants fills the table of a key's tenants, in the API's order (those
  // with work booked, next in line first, then those with a weight set), at
  // most maxTenantRows rows; hidden when the key has none.
  function tenants(c, ts) {
    ts = ts || [];
    c.tenants.hidden = ts.length === 0;
    const shown = ts.slice(0, maxTenantRows);
    const tb = c.tenants.tBodies[0];
    while (tb.rows.length > shown.length) tb.deleteRow(-1);
    shown.forEach((t, i) => {
      let r = tb.rows[i];
      if (!r) {
        r = tb.insertRow();
        for (const cls of ['name', 'num weight', 'num share', 'num backlog', 'num admitted']) r.insertCell().className = cls;
      }
      r.className = (t.share > 0 ? 'active' : 'idle') + (t.name === '' ? ' default' : '');
      const cells = [t.name === '' ? '(default)' : t.name, String(t.weight), fmtShare(t.share), t.backlog.toFixed(1), String(t.admitted)];
      cells.forEach((text, j) => { r.cells[j].textContent = text; });
    });
    const more = ts.length - shown.length;
    c.tenantsNote.hidden = more <= 0;
    c.tenantsNote.textContent = more > 0 ? more + ' more tenants not shown (api/keys lists them)' : '';
  }

  async function act(c, what, extra, done) {
    try {
      const r = await fetch('api/' + what, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', 'X-Asynq-Throttle': '1' },
        body: JSON.stringify(Object.assign({ key: c.key }, extra)),
      });
      const v = await r.json();
      if (!r.ok) throw new Error(v.error || r.statusText);
      c.limitsIn.dataset.edited = '';
      update(c, v, performance.now());
      toast(c.key + ': ' + done);
    } catch (e) {
      toast(c.key + ': ' + e.message, true);
    }
  }

  function update(c, k, at) {
    c.data = k;
    c.at = at;
    c.limits.textContent = k.limits.length ? k.limits.map((t) => t.in_force
      ? t.limit + ' (in force: ' + t.in_force + (t.learned_seconds ? ', learned' : ', adaptive') + ')'
      : t.limit).join('  ·  ') : 'no limits: unthrottled';
    c.error.textContent = k.error || '';
    c.gen.textContent = k.generation ? 'gen ' + k.generation : '';
    // One row per limit: its kind, a gauge, and what it has left, in its
    // unit: named on every rate limit of a key with units besides requests.
    const units = k.limits.some((t) => t.unit && t.unit !== 'requests');
    while (c.tiers.children.length > k.limits.length) c.tiers.lastChild.remove();
    k.limits.forEach((t, i) => {
      let row = c.tiers.children[i];
      if (!row) {
        row = el('div', 'tier');
        row.append(el('span', 'name'), el('div', 'gauge'), el('span', 'count'));
        row.children[1].append(el('div'));
        c.tiers.append(row);
      }
      const g = gauge(t, k, units);
      row.className = 'tier kind-' + t.kind;
      row.dataset.unit = t.unit || '';
      row.children[0].textContent = kindNames[t.kind] || t.kind;
      const bar = row.children[1].firstChild;
      bar.style.width = (g.frac * 100).toFixed(1) + '%';
      bar.className = g.cls;
      row.children[2].textContent = g.text;
      row.title = t.limit + ': ' + g.title;
    });
    tenants(c, k.tenants);
    if (document.activeElement !== c.limitsIn && !c.limitsIn.dataset.edited) c.limitsIn.value = k.limit_spec;
    tick(c, at);
  }

  const kindNames = { bucket: 'bucket', window: 'window', fixed: 'fixed window', inflight: 'in flight', adaptive: 'adaptive' };

  // gauge says how full a limit's bar is and what it reads: a bucket's
  // tokens, a window's calls left, an in-flight limit's slots held; a
  // tier of another unit than requests reads in it ("18000.0 / 30000
  // tokens"), and so does a request tier when units says the key has such
  // tiers ("499.0 / 500 requests").
  function gauge(t, k, units) {
    const clamp = (x) => Math.max(0, Math.min(1, x));
    if (t.kind === 'inflight') {
      const held = k.in_flight ? k.in_flight.held : Math.max(0, t.burst - t.tokens);
      const frac = t.burst > 0 ? clamp(held / t.burst) : 0;
      return {
        frac, cls: 'slots' + (held >= t.burst ? ' full' : ''),
        text: held + ' of ' + t.burst + ' in flight',
        title: held + ' tasks running of ' + t.burst + ' at most, across the fleet',
      };
    }
    const frac = t.burst > 0 ? clamp(t.tokens / t.burst) : 0;
    const cls = t.tokens < 1 ? 'empty' : frac < 0.25 ? 'low' : '';
    const other = t.unit && t.unit !== 'requests'; // counted in another unit
    const unit = (units || other) && t.unit ? ' ' + t.unit : '';
    if (t.kind === 'window' || t.kind === 'fixed') {
      const left = Math.max(0, Math.floor(t.tokens));
      const what = other ? ' ' + t.unit : ' calls';
      const of = t.kind === 'fixed' ? what + ' left in this fixed window of ' : what + ' left in any sliding window of ';
      return { frac, cls, text: left + ' of ' + t.burst + unit + ' left', title: left + of + fmtSeconds(t.period_seconds) };
    }
    const what = other ? ' ' + t.unit + ' of ' : ' tokens of ';
    return { frac, cls, text: t.tokens.toFixed(1) + ' / ' + t.burst + unit, title: t.tokens.toFixed(2) + what + t.burst };
  }

  // tick redraws what moves between polls: the countdowns.
  function tick(c, now) {
    const k = c.data;
    if (!k) return;
    const gone = (now - c.at) / 1000;
    const susp = k.suspended_seconds - gone;
    const queued = k.queued_seconds - gone;
    c.el.classList.toggle('suspended', susp > 0);
    if (susp > 0) {
      c.suspension.textContent = 'suspended · ' + fmtSeconds(susp) + ' left';
      c.suspension.className = 'value suspension';
    } else {
      c.suspension.textContent = 'not suspended';
      c.suspension.className = 'value';
    }
    if (k.reservations > 0) {
      c.forecast.textContent = k.reservations + ' reserved · backlog drains in ~' + fmtSeconds(Math.max(queued, 0));
    } else {
      c.forecast.textContent = 'no reservations';
    }
    let badge = ['ok', ''];
    if (!k.limits.length) badge = ['unthrottled', 'none'];
    if (k.in_flight && k.in_flight.held >= k.in_flight.max) badge = ['slots full', 'backlog'];
    if (k.reservations > 0) badge = ['backlog', 'backlog'];
    if (susp > 0) badge = ['suspended', 'suspended'];
    c.badge.textContent = badge[0];
    c.badge.className = 'badge ' + badge[1];
  }

  // rates turns cumulative counts into per-second rates between polls.
  function rates(c, k, at) {
    if (!hasCounts) return;
    const cur = k.decisions || {};
    const r = {};
    if (c.prev) {
      const dt = (at - c.prev.at) / 1000;
      for (const o of outcomes) r[o] = dt > 0 ? Math.max(0, ((cur[o] || 0) - (c.prev.counts[o] || 0)) / dt) : 0;
      c.hist.push(r);
      if (c.hist.length > historyLen) c.hist.shift();
    }
    c.prev = { at, counts: cur };
    c.rates.textContent = '';
    for (const o of outcomes) {
      // ran and deferred always; the others once they happened.
      if (o !== 'ran' && o !== 'deferred' && !cur[o]) continue;
      const s = el('span', 'o-' + o);
      s.append(o + ' ', el('b', '', r[o] === undefined ? '–' : fmtRate(r[o])));
      c.rates.append(s);
    }
    c.r429.textContent = String(k.rate_limited || 0);
    waits(c, k);
    // The history fills the width; one point per poll, newest on the right.
    const peak = Math.max(1, ...c.hist.map((h) => Math.max(h.ran, h.deferred)));
    const step = 100 / Math.max(1, c.hist.length - 1);
    for (const o of ['ran', 'deferred']) {
      c.lines[o].setAttribute('points', c.hist.map((h, i) => (i * step).toFixed(1) + ',' + (29 - 28 * h[o] / peak).toFixed(1)).join(' '));
    }
    const span = Math.round(c.hist.length * pollMS / 1000);
    c.sparkNote.textContent = c.hist.length > 1 ? 'last ' + span + ' s · peak ' + fmtRate(peak) + '/s · green ran, amber deferred' : '';
  }

  // waits names what this key made tasks wait for, most first: "tier 2
  // (1/h) 3 · suspended 1" (a tier with its limit as the limits show it).
  function waits(c, k) {
    const w = Object.entries(k.waits || {}).sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
    c.waits.textContent = '';
    if (!w.length) {
      c.waits.textContent = 'none';
      return;
    }
    for (const [why, n] of w) {
      let label = why;
      const m = /^tier (\d+)$/.exec(why);
      const lim = m && (k.limits || [])[Number(m[1]) - 1];
      if (lim) label += ' (' + lim.limit + ')';
      const s = el('span', 'wait');
      s.dataset.why = why;
      s.append(label + ' ', el('b', '', String(n)));
      c.waits.append(s);
    }
  }

  function render(s, at) {
    const seen = new Set();
    s.keys.forEach((k, i) => {
      seen.add(k.key);
      let c = cards.get(k.key);
      if (!c) {
        c = makeCard(k.key);
        cards.set(k.key, c);
      }
      if (main.children[i] !== c.el) main.insertBefore(c.el, main.children[i] || null);
      update(c, k, at);
      rates(c, k, at);
    });
    for (const [key, c] of cards) {
      if (!seen.has(key)) {
        c.el.remove();
        cards.delete(key);
      }
    }
    document.getElementById('empty').hidden = s.keys.length > 0;
    const om = document.getElementById('omitted');
    om.hidden = !s.omitted;
    om.textContent = s.omitted ? s.omitted + ' more keys not shown (dashboard.WithMaxKeys)' : '';
  }

  async function poll() {
    try {
      const r = await fetch('api/keys', { cache: 'no-store' });
      const s = await r.json();
      if (!r.ok) throw new Error(s.error || r.statusText);
      render(s, performance.now());
      status('live · ' + new Date().toLocaleTimeString(), false);
    } catch (e) {
      status('cannot refresh: ' + e.message, true);
    } finally {
      setTimeout(poll, pollMS);
    }
  }
  document.addEventListener('input', (e) => {
    if (e.target.classList && e.target.classList.contains('limits-input')) e.target.dataset.edited = '1';
  });
  setInterval(() => { const now = performance.now(); for (const c of cards.values()) tick(c, now); }, 250);
  poll();
})();

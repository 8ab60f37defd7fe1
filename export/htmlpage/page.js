// cudatrace's page: where the GPU memory went. Its data is the JSON in
// the page (export/html_data.go says its shape); a live page (the agent's
// /ui) fetches it again every few seconds. Canvas for the chart and the
// flame graph, tables for the rest; no library.
'use strict';
(function () {
  const $ = (sel) => document.querySelector(sel);

  // ---------- formatting ----------
  // fmtBytes writes n as report does (internal/units): one decimal,
  // rounded half to even as Go's %.1f rounds (1.25 GiB is "1.2 GiB").
  function round1(v) {
    const x = v * 10, f = Math.floor(x), d = x - f;
    const r = d > 0.5 ? f + 1 : d < 0.5 ? f : (f % 2 === 0 ? f : f + 1);
    return (r / 10).toFixed(1);
  }
  function fmtBytes(n) {
    if (n < 1024) return n + ' B';
    const units = 'KMGTPE';
    let v = n / 1024, i = 0;
    while (i < units.length - 1 && Number(round1(v)) >= 1024) { v /= 1024; i++; }
    return round1(v) + ' ' + units[i] + 'iB';
  }
  function fmtSigned(n) { return n > 0 ? '+' + fmtBytes(n) : n < 0 ? '-' + fmtBytes(-n) : '0 B'; }
  function fmtTime(ns) {
    if (ns === 0) return '0 s';
    const s = ns / 1e9;
    if (s >= 120) {
      const m = Math.floor(s / 60);
      return m + 'm' + (s - m * 60).toFixed(0).padStart(2, '0') + 's';
    }
    // Each unit up to what rounds to 1000 of it: never "1000.0 ms".
    const fit = (v, unit, next) => {
      const t = v.toFixed(v >= 10 ? 1 : 3);
      return Number(t) >= 1000 ? next() : t + ' ' + unit;
    };
    if (s >= 1) return fit(s, 's', () => fmtTime(120e9));
    if (ns >= 1e6) return fit(ns / 1e6, 'ms', () => '1.000 s');
    if (ns >= 1e3) return Number((ns / 1e3).toFixed(1)) >= 1000 ? '1.000 ms' : (ns / 1e3).toFixed(1) + ' µs';
    return Math.round(ns) + ' ns';
  }
  // fmtAxis writes the ticks of one time axis alike: one unit, as many
  // decimals as the step needs.
  function fmtAxis(t, step) {
    const units = [[60e9, null], [1e9, 's'], [1e6, 'ms'], [1e3, 'µs'], [1, 'ns']];
    for (const [u, name] of units) {
      if (name === null) {
        if (step >= 60e9) { const m = Math.floor(t / 60e9); return m + 'm' + String(Math.round((t - m * 60e9) / 1e9)).padStart(2, '0') + 's'; }
        continue;
      }
      if (step >= u || u === 1) {
        const dec = Math.max(0, Math.ceil(-Math.log10(step / u) - 1e-9));
        return (t / u).toFixed(Math.min(dec, 3)) + ' ' + name;
      }
    }
    return fmtTime(t);
  }
  // niceStep is the 1, 2 or 5 times a power of ten at least v.
  function niceStep(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }
  // byteStep is a power of two at least v: 256 MiB, 512 MiB, 1 GiB...
  function byteStep(v) {
    let s = 1;
    while (s < v) s *= 2;
    return s;
  }
  function plural(n, what) { return n === 1 ? '1 ' + what : n + ' ' + what + 's'; }
  function pct(a, b) { return b > 0 ? (100 * a / b).toFixed(1) + '%' : ''; }
  function h(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    if (attrs) for (const k in attrs) {
      if (k === 'class') e.className = attrs[k];
      else if (k === 'text') e.textContent = attrs[k];
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), attrs[k]);
      else e.setAttribute(k, attrs[k]);
    }
    for (const k of kids) if (k != null) e.append(k);
    return e;
  }
  function num(v, text) { return h('td', {class: 'n', 'data-bytes': String(v), text: text === undefined ? fmtBytes(v) : text}); }

  // ---------- colours ----------
  const ownerColors = {
    pytorch: '#ee4c2c', nccl: '#76b900', cublas: '#9467bd', cudnn: '#1f77b4', xla: '#17becf', cupy: '#bcbd22',
    numba: '#00a3e0', tensorflow: '#ff7f0e', tensorrt: '#8c564b', application: '#8a94a0',
  };
  const palette = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#2f4b7c'];
  function hash(s) { let x = 0; for (let i = 0; i < s.length; i++) x = (x * 31 + s.charCodeAt(i)) | 0; return Math.abs(x); }
  function ownerColor(name) { return ownerColors[name] || palette[hash(name) % palette.length]; }
  // A call path's colour is its own from the first time it is drawn, kept
  // across the live page's refreshes (never by its place in a list).
  const pathColors = new Map();
  function pathColor(key) {
    let c = pathColors.get(key);
    if (!c) { c = palette[pathColors.size % palette.length]; pathColors.set(key, c); }
    return c;
  }

  // ---------- data ----------
  function undelta(a) {
    const out = new Float64Array(a ? a.length : 0);
    let s = 0;
    for (let i = 0; i < out.length; i++) { s += a[i]; out[i] = s; }
    return out;
  }
  function decode(raw) {
    const M = {raw, S: raw.strings};
    const ag = raw.aggregation;
    M.nb = ag.buckets; M.width = ag.bucket_ns; M.spanF = ag.span_buckets; M.moveF = ag.move_buckets;
    M.endJ = Math.ceil(M.nb / M.spanF);
    M.grid = Math.max(M.spanF, M.moveF); // the range views' unit, in buckets
    M.span = M.nb * M.width; // the chart's time axis
    const f = raw.frames;
    M.frames = f;
    const st = raw.stacks;
    M.nStacks = st.pid.length;
    const ids = undelta(st.frame_ids);
    M.stackFrames = [];
    M.lineKeys = []; M.funcKeys = [];
    for (let i = 0; i < M.nStacks; i++) {
      M.stackFrames.push(Array.from(ids.subarray(st.frame_at[i], st.frame_at[i + 1])));
      M.lineKeys.push(st.line_keys.slice(st.line_at[i], st.line_at[i + 1]));
      M.funcKeys.push(st.func_keys.slice(st.func_at[i], st.func_at[i + 1]));
    }
    M.stacks = st;
    M.comm = new Map();
    M.procs = new Map();
    for (const p of raw.processes || []) M.procs.set(p.pid, p);
    M.labels = distinctLabels(M, st);
    M.series = raw.series.map((s) => ({
      keys: s.keys, level: s.level, max: undelta(s.max), end: undelta(s.end), peak: s.peak, peakT: s.peak_t,
      snapshot: s.snapshot,
      owners: s.owners.map((c) => ({id: c.id, v: undelta(c.v)})),
      paths: s.paths.map((c) => ({id: c.id, v: undelta(c.v)})),
    }));
    M.byKey = new Map();
    const devs = new Set(), pids = new Set(), levels = new Set();
    for (const s of M.series) {
      levels.add(s.level);
      for (const k of s.keys) {
        M.byKey.set(k.pid + '|' + (k.dev === null ? '*' : k.dev) + '|' + s.level, s);
        if (k.dev !== null) devs.add(k.dev);
        if (k.pid !== 0) pids.add(k.pid);
      }
    }
    M.devices = [...devs].sort((a, b) => a - b);
    M.levels = [...levels].sort();
    for (const p of raw.processes || []) { M.comm.set(p.pid, p.comm); pids.add(p.pid); }
    M.pids = [...pids].sort((a, b) => a - b);
    const cols = (o) => { const r = {}; for (const k in o) r[k] = undelta(o[k]); r.n = r.stack ? r.stack.length : 0; return r; };
    M.spans = cols(raw.spans);
    M.moves = cols(raw.moves);
    M.snaps = raw.snapshots.map((s) => Object.assign({}, s, {rows: cols({stack: s.stack, dev: s.devs, bytes: s.bytes, count: s.count})}));
    M.failures = raw.failures;
    const fh = raw.fail_hist || {pid: []};
    M.failHist = {pid: undelta(fh.pid), dev: undelta(fh.dev), b: undelta(fh.b), n: undelta(fh.n), oom: undelta(fh.oom), len: fh.pid.length};
    M.steps = raw.steps ? {t: undelta(raw.steps.t), stack: undelta(raw.steps.stack), dev: undelta(raw.steps.dev), bytes: undelta(raw.steps.bytes), n: raw.steps.t.length} : null;
    M.nvml = raw.nvml ? {
      devices: raw.nvml.devices.map((d) => Object.assign({}, d, {used: undelta(d.used)})),
      processes: raw.nvml.processes.map((p) => Object.assign({}, p, {used: undelta(p.used), traced: undelta(p.traced)})),
    } : null;
    return M;
  }

  // distinctLabels are the stacks' labels (already distinct per process),
  // with the process added where the same path ran in several: rank,
  // node and pid.
  function distinctLabels(M, st) {
    const out = [], by = new Map();
    for (let i = 0; i < st.pid.length; i++) {
      const l = M.S[st.label[i]];
      out.push(l);
      const k = st.level[i] + '|' + l;
      if (!by.has(k)) by.set(k, []);
      by.get(k).push(i);
    }
    for (const g of by.values()) {
      if (g.length < 2) continue;
      for (const i of g) out[i] += ' · ' + procShort(M, st.pid[i]);
    }
    return out;
  }
  // procShort names a process briefly: its rank and node where it has
  // them, and its pid.
  function procShort(M, pid) {
    const p = M.procs.get(pid);
    const parts = [];
    if (p && p.job && p.job.rank != null) parts.push('rank ' + p.job.rank);
    if (p && p.node) parts.push(p.node);
    parts.push('pid ' + (p && p.node_pid ? p.node_pid : pid));
    return parts.join(' ');
  }

  // ---------- state ----------
  let M = null;
  const st = {pid: 0, dev: null, level: 0, split: 'owner', moment: {kind: 'peak'}, range: null, tab: 'moment',
    frames: 'fold', search: '', zoom: [], interval: 0, view: null, views: []};

  function series() { return M.byKey.get(st.pid + '|' + (st.dev === null ? '*' : st.dev) + '|' + st.level) || null; }
  function stackSelected(i) {
    return M.stacks.level[i] === st.level && (st.pid === 0 || M.stacks.pid[i] === st.pid);
  }
  function devSelected(d) { return st.dev === null || d === st.dev; }
  // A kept moment j is moment min(j*spanF, nb): the edge before that bucket.
  function tOfJ(j) { return Math.min(j * M.spanF, M.nb) * M.width; }
  function jOfT(t) { return Math.max(0, Math.min(M.endJ, Math.round(t / M.width / M.spanF))); }
  // The range views' grid: every M.grid buckets, and the end.
  function snapRangeJ(t) {
    const g = M.grid / M.spanF; // in kept moments
    const j = Math.round(t / M.width / M.grid) * g;
    return Math.min(j, M.endJ);
  }
  function stackFrames(i) { return M.stackFrames[i]; }
  function str(i) { return M.S[i]; }
  // A path's label: the process added where the same path ran in several
  // and every process is shown.
  function stackLabel(i) { return st.pid === 0 ? M.labels[i] : str(M.stacks.label[i]); }
  // stackFull is the whole path, for hovering: every frame, innermost first.
  function stackFull(i) { return stackFrames(i).map((f) => str(M.frames.label[f])).join('\n  ← ') + '\n' + str(M.stacks.api[i]) + ', ' + procShort(M, M.stacks.pid[i]); }
  function procName(pid) { return pid === 0 ? 'every process' : procShort(M, pid) + (M.comm.get(pid) ? ' (' + M.comm.get(pid) + ')' : ''); }
  function devName(d) { return d === null ? 'every device' : d === -1 ? 'the unknown device' : 'GPU ' + d; }
  function levelName(l) { return l === 1 ? 'tensors' : 'GPU memory'; }

  // ---------- live sets ----------
  // live returns the rows {stack, bytes, count} live at the selected
  // moment, most bytes first, with what the moment is.
  function momentInfo() {
    const m = st.moment;
    if (m.kind === 'snap') {
      const sn = M.snaps[m.i];
      return {snap: sn, t: sn.t, what: sn.kind === 'failure' ? 'when an allocation failed' : 'at the peak', exact: true};
    }
    if (m.kind === 'peak') {
      const s = series();
      if (s && s.snapshot >= 0) return {snap: M.snaps[s.snapshot], t: s.peakT, what: 'at the peak', exact: true};
      return {j: M.endJ, t: tOfJ(M.endJ), what: 'at the end', exact: false};
    }
    if (m.kind === 't') {
      // An exact moment: the kept moment at or before it, and every
      // allocation and free since (the page keeps them one by one).
      const j = Math.min(M.endJ, Math.floor(m.t / M.width / M.spanF));
      return {j, t: m.t, what: 'at ' + fmtTime(m.t), exact: true, upTo: m.t};
    }
    const j = m.j;
    return {j, t: tOfJ(j), what: j === 0 ? 'at the start' : j === M.endJ ? 'at the end' : 'at ' + fmtTime(tOfJ(j)), exact: false};
  }
  function liveRows(info) {
    const by = new Map();
    const add = (stack, bytes, count, flags) => {
      let r = by.get(stack);
      if (!r) { r = {stack, bytes: 0, count: 0, before: 0}; by.set(stack, r); }
      r.bytes += bytes; r.count += count;
      if (flags & 1) r.before += bytes;
    };
    if (info.snap) {
      const c = info.snap.rows;
      for (let i = 0; i < c.n; i++) {
        if (stackSelected(c.stack[i]) && devSelected(c.dev[i])) add(c.stack[i], c.bytes[i], c.count[i], 0);
      }
    } else {
      const c = M.spans, j = info.j;
      for (let i = 0; i < c.n; i++) {
        if (c.sb[i] <= j && j < c.eb[i] && stackSelected(c.stack[i]) && devSelected(c.dev[i])) add(c.stack[i], c.bytes[i], c.count[i], c.flags[i]);
      }
      if (info.upTo !== undefined && M.steps) {
        const e = M.steps, from = tOfJ(j);
        for (let i = lowerBound(e.t, from); i < e.n && e.t[i] <= info.upTo; i++) {
          if (stackSelected(e.stack[i]) && devSelected(e.dev[i])) add(e.stack[i], e.bytes[i], e.bytes[i] > 0 ? 1 : -1, 0);
        }
      }
    }
    return [...by.values()].filter((r) => r.count > 0 || r.bytes > 0).sort((a, b) => b.bytes - a.bytes || a.stack - b.stack);
  }

  function lowerBound(a, v) {
    let lo = 0, hi = a.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (a[mid] < v) lo = mid + 1; else hi = mid; }
    return lo;
  }

  // ---------- timeline ----------
  const TL = {left: 72, right: 12, top: 26, bottom: 22};
  let tl = null; // what the last draw laid out
  let drag = null; // a window being dragged: {x0, x1}
  function setupCanvas(cv) {
    const r = window.devicePixelRatio || 1;
    const w = cv.clientWidth, hgt = Number(cv.getAttribute('height'));
    cv.width = Math.round(w * r); cv.height = Math.round(hgt * r);
    cv.style.height = hgt + 'px';
    const ctx = cv.getContext('2d');
    ctx.setTransform(r, 0, 0, r, 0, 0);
    return {ctx, w, h: hgt};
  }
  function nvmlLine() {
    if (!M.nvml) return null;
    if (st.level !== 0) return null;
    if (st.pid !== 0) {
      const p = M.nvml.processes.find((x) => x.pid === st.pid);
      return p && st.dev === null ? {v: p.used, label: "NVML: the driver's figure for " + procShort(M, st.pid)} : null;
    }
    if (st.dev === null) {
      if (M.nvml.devices.length === 0) return null;
      const v = new Float64Array(M.nb).fill(-1);
      for (let k = 0; k < M.nb; k++) {
        let s = 0, any = false;
        for (const d of M.nvml.devices) if (d.used[k] >= 0) { s += d.used[k]; any = true; }
        if (any) v[k] = s;
      }
      return {v, label: "NVML: used on every GPU, by all processes"};
    }
    const d = M.nvml.devices.find((x) => x.index === st.dev);
    return d ? {v: d.used, label: "NVML: used on GPU " + d.index + " (NVML's index), by all processes"} : null;
  }
  function cats(s) {
    if (!s) return [];
    if (st.split === 'owner') return s.owners.map((c) => ({v: c.v, name: M.raw.owner_names[c.id], color: ownerColor(M.raw.owner_names[c.id])}));
    return s.paths.map((c) => ({v: c.v, name: c.id < 0 ? 'other call paths' : stackLabel(c.id), full: c.id < 0 ? '' : stackFull(c.id),
      color: c.id < 0 ? '#c9ced4' : pathColor(M.labels[c.id]), stack: c.id}));
  }
  // The window shown, in ns since the start: the whole trace unless zoomed.
  function view() { return st.view || {t0: 0, t1: M.span}; }
  // exactSteps are the selected series' allocations and frees in the
  // window, one by one, from its figure at the window's first bucket:
  // null where the page has not kept them, or there are too many to draw.
  function exactSteps(s, v) {
    if (!M.steps || !s) return null;
    const e = M.steps;
    const k0 = Math.max(0, Math.floor(v.t0 / M.width));
    const from = k0 * M.width;
    const a = lowerBound(e.t, from), b = lowerBound(e.t, v.t1 + 1);
    if (b - a > 4000) return null;
    let y = k0 === 0 ? 0 : s.end[k0 - 1];
    const pts = [{t: from, y}];
    for (let i = a; i < b; i++) {
      if (!stackSelected(e.stack[i]) || !devSelected(e.dev[i])) continue;
      y += e.bytes[i];
      pts.push({t: e.t[i], y, alloc: e.bytes[i] > 0, stack: e.stack[i], bytes: e.bytes[i]});
    }
    return pts;
  }
  function drawTimeline() {
    const cv = $('#timeline');
    const {ctx, w, h: ht} = setupCanvas(cv);
    ctx.clearRect(0, 0, w, ht);
    const s = series();
    const pw = w - TL.left - TL.right, ph = ht - TL.top - TL.bottom;
    const nv = nvmlLine();
    const v = view();
    const vs = Math.max(v.t1 - v.t0, 1);
    const kA = Math.max(0, Math.floor(v.t0 / M.width)), kB = Math.min(M.nb, Math.ceil(v.t1 / M.width));
    let ymax = 1;
    if (s) for (let k = kA; k < kB; k++) ymax = Math.max(ymax, s.max[k]);
    if (nv) for (let k = kA; k < kB; k++) ymax = Math.max(ymax, nv.v[k]);
    ymax *= 1.08;
    const x = (t) => TL.left + (t - v.t0) / vs * pw;
    const y = (val) => TL.top + ph - (val / ymax) * ph;
    tl = {x, y, pw, ph, w, ht, s, ymax, v};
    // Axes.
    ctx.font = '11px system-ui, sans-serif';
    ctx.fillStyle = '#5f6b76';
    ctx.strokeStyle = '#e3e7eb';
    ctx.lineWidth = 1;
    ctx.textAlign = 'right'; ctx.textBaseline = 'middle';
    const ystep = byteStep(ymax / 4.5);
    for (let val = 0; val <= ymax; val += ystep) {
      const yy = Math.round(y(val)) + 0.5;
      ctx.beginPath(); ctx.moveTo(TL.left, yy); ctx.lineTo(TL.left + pw, yy); ctx.stroke();
      ctx.fillText(fmtBytes(val), TL.left - 6, yy);
    }
    ctx.textAlign = 'center'; ctx.textBaseline = 'top';
    const step = niceStep(vs / 7);
    for (let t = Math.ceil(v.t0 / step) * step; t <= v.t1; t += step) {
      ctx.fillText(fmtAxis(Math.round(t), step), Math.min(Math.max(x(t), TL.left + 20), TL.left + pw - 20), TL.top + ph + 5);
    }
    ctx.save();
    ctx.beginPath(); ctx.rect(TL.left, 0, pw, ht); ctx.clip();
    // The moment shown, behind the memory: a one-bucket spike at it (the
    // peak's) stays in sight.
    const info = momentInfo();
    if (info.t >= v.t0 && info.t <= v.t1) {
      const mx = x(info.t);
      ctx.strokeStyle = '#1f6feb'; ctx.lineWidth = 2;
      ctx.beginPath(); ctx.moveTo(mx, TL.top); ctx.lineTo(mx, TL.top + ph); ctx.stroke();
    }
    // Range.
    if (st.range && st.view === null) {
      const a = x(tOfJ(st.range.j0)), b = x(tOfJ(st.range.j1));
      ctx.fillStyle = 'rgba(31,111,235,0.10)';
      ctx.fillRect(a, TL.top, Math.max(b - a, 1), ph);
    }
    // Stacked categories: per bucket, the highest moment's split, drawn
    // as step areas so that neighbouring buckets join without seams.
    const cs = cats(s);
    const xb = (k) => x(k * M.width);
    if (s && kB > kA) {
      const base = new Float64Array(M.nb);
      for (const c of cs) {
        if (!c.v.some((val) => val > 0)) continue;
        ctx.fillStyle = c.color;
        ctx.beginPath();
        ctx.moveTo(xb(kA), y(base[kA]));
        for (let k = kA; k < kB; k++) {
          const yy = y(base[k] + c.v[k]);
          ctx.lineTo(xb(k), yy); ctx.lineTo(xb(k + 1), yy);
        }
        for (let k = kB - 1; k >= kA; k--) {
          const yy = y(base[k]);
          ctx.lineTo(xb(k + 1), yy); ctx.lineTo(xb(k), yy);
        }
        ctx.closePath(); ctx.fill();
        for (let k = kA; k < kB; k++) base[k] += c.v[k];
      }
      // The outline: the highest per bucket.
      ctx.strokeStyle = '#2b333b'; ctx.lineWidth = 1;
      ctx.beginPath();
      for (let k = kA; k < kB; k++) {
        const yy = y(s.max[k]);
        if (k === kA) ctx.moveTo(xb(k), yy); else ctx.lineTo(xb(k), yy);
        ctx.lineTo(xb(k + 1), yy);
      }
      ctx.stroke();
    }
    // Zoomed in far enough, each allocation and free: the exact figure,
    // a step each, a dot at each allocation.
    tl.steps = null;
    const pts = (kB - kA) <= 120 ? exactSteps(s, v) : null;
    if (pts) {
      tl.steps = pts.filter((p) => p.alloc !== undefined && p.t >= v.t0 && p.t <= v.t1);
      ctx.strokeStyle = '#0b3d91'; ctx.lineWidth = 1.5;
      ctx.beginPath();
      ctx.moveTo(x(pts[0].t), y(pts[0].y));
      for (let i = 1; i < pts.length; i++) { ctx.lineTo(x(pts[i].t), y(pts[i - 1].y)); ctx.lineTo(x(pts[i].t), y(pts[i].y)); }
      ctx.lineTo(x(v.t1), y(pts[pts.length - 1].y));
      ctx.stroke();
      ctx.fillStyle = '#0b3d91';
      for (const p of tl.steps) if (p.alloc) { ctx.beginPath(); ctx.arc(x(p.t), y(p.y), 2.5, 0, 2 * Math.PI); ctx.fill(); }
    }
    if (nv) {
      ctx.strokeStyle = '#111'; ctx.setLineDash([5, 3]); ctx.lineWidth = 1.5;
      ctx.beginPath();
      let on = false;
      for (let k = kA; k < kB; k++) {
        if (nv.v[k] < 0) continue;
        const xx = x((k + 0.5) * M.width), yy = y(nv.v[k]);
        if (!on) { ctx.moveTo(xx, yy); on = true; } else ctx.lineTo(xx, yy);
      }
      ctx.stroke(); ctx.setLineDash([]);
    }
    ctx.restore();
    // Failures, every one, in the strip above the plot: one mark per few
    // pixels with how many failed there (the page lists the first ones).
    tl.marks = [];
    const fh = M.failHist, cols = new Map();
    for (let i = 0; i < fh.len; i++) {
      if (st.pid !== 0 && fh.pid[i] !== st.pid || !devSelected(fh.dev[i])) continue;
      const t = (fh.b[i] + 0.5) * M.width;
      if (t < v.t0 - M.width || t > v.t1 + M.width) continue;
      const xx = Math.min(Math.max(x(t), TL.left), TL.left + pw);
      const col = Math.round(xx / 8);
      let c = cols.get(col);
      if (!c) { c = {x: xx, n: 0, oom: 0, b0: fh.b[i], b1: fh.b[i]}; cols.set(col, c); }
      c.n += fh.n[i]; c.oom += fh.oom[i]; c.b0 = Math.min(c.b0, fh.b[i]); c.b1 = Math.max(c.b1, fh.b[i]);
    }
    ctx.font = '10px system-ui, sans-serif'; ctx.textAlign = 'left'; ctx.textBaseline = 'middle';
    for (const c of cols.values()) {
      const xx = c.x, y0 = 5;
      ctx.strokeStyle = c.oom > 0 ? '#d00' : '#e67e22'; ctx.lineWidth = 2;
      ctx.beginPath(); ctx.moveTo(xx - 4, y0); ctx.lineTo(xx + 4, y0 + 8); ctx.moveTo(xx + 4, y0); ctx.lineTo(xx - 4, y0 + 8); ctx.stroke();
      const listed = M.failures.findIndex((f) => (st.pid === 0 || f.pid === st.pid) && devSelected(f.dev) &&
        Math.floor(f.t / M.width) >= c.b0 && Math.floor(f.t / M.width) <= c.b1);
      tl.marks.push({x: xx, kind: 'failure', i: listed, n: c.n, oom: c.oom, b0: c.b0, b1: c.b1});
    }
    tl.failureMarks = [...cols.values()].reduce((a, c) => a + c.n, 0);
    for (const e of M.raw.exits) {
      if (st.pid !== 0 && e.pid !== st.pid) continue;
      if (e.t < v.t0 || e.t > v.t1) continue;
      const xx = x(e.t);
      ctx.fillStyle = '#5f6b76';
      ctx.fillRect(xx - 3, TL.top + ph - 7, 6, 6);
      tl.marks.push({x: xx, kind: 'exit', e});
    }
    if (s && s.peak > 0 && s.peakT >= v.t0 && s.peakT <= v.t1) {
      const xx = x(s.peakT), yy = y(s.peak);
      ctx.fillStyle = '#d00';
      ctx.beginPath(); ctx.moveTo(xx, yy - 9); ctx.lineTo(xx - 6, yy - 1); ctx.lineTo(xx + 6, yy - 1); ctx.closePath(); ctx.fill();
      ctx.font = 'bold 11px system-ui, sans-serif'; ctx.textBaseline = 'bottom';
      ctx.textAlign = xx > TL.left + pw - 120 ? 'right' : 'left';
      ctx.fillText('peak ' + fmtBytes(s.peak), xx + (ctx.textAlign === 'left' ? 8 : -8), Math.max(yy - 2, TL.top + 12));
      tl.marks.push({x: xx, kind: 'peak'});
    }
    if (drag) {
      const a = Math.min(drag.x0, drag.x1), b = Math.max(drag.x0, drag.x1);
      ctx.fillStyle = 'rgba(31,111,235,0.18)'; ctx.fillRect(a, TL.top, b - a, ph);
    }
    // Legend.
    const lg = $('#legend');
    lg.replaceChildren();
    for (const c of cs) {
      if (!c.v.some((val) => val > 0)) continue;
      lg.append(h('span', {class: 'chip', title: c.full || c.name}, h('i', {style: 'background:' + c.color}), c.name));
    }
    if (nv) lg.append(h('span', {class: 'chip'}, h('i', {style: 'background:repeating-linear-gradient(90deg,#111 0 5px,#fff 5px 8px);height:2px'}), nv.label));
    $('#summary').textContent = s ? levelName(st.level) + ' of ' + procName(st.pid) + ' on ' + devName(st.dev) + ': peak ' + fmtBytes(s.peak) + ' at ' + fmtTime(s.peakT)
      : 'nothing traced for ' + procName(st.pid) + ' on ' + devName(st.dev);
    $('#zoom-out').disabled = st.view === null;
    $('#zoom-all').disabled = st.view === null;
    $('#window').textContent = st.view === null ? '' : 'showing ' + fmtTime(v.t0) + ' to ' + fmtTime(v.t1) + ' (' + fmtTime(v.t1 - v.t0) + ')';
  }
  function tOfX(px) { const v = view(); return Math.max(0, Math.min(M.span, v.t0 + (px - TL.left) / tl.pw * (v.t1 - v.t0))); }
  function bucketAt(px) {
    if (px < TL.left || px > TL.left + tl.pw) return -1;
    const k = Math.floor(tOfX(px) / M.width);
    return k >= 0 && k < M.nb ? k : -1;
  }
  function showTip(ev) {
    const tip = $('#tip');
    const r = $('#timeline').getBoundingClientRect();
    const px = ev.clientX - r.left;
    const k = bucketAt(px);
    if (!tl || k < 0 || !tl.s) { tip.hidden = true; return; }
    const s = tl.s;
    const lines = [fmtTime(k * M.width) + ' – ' + fmtTime((k + 1) * M.width),
      'highest ' + fmtBytes(s.max[k]) + ', at the end ' + fmtBytes(s.end[k])];
    const cs = cats(s).map((c) => [c.name, c.v[k]]).filter((c) => c[1] > 0).sort((a, b) => b[1] - a[1]);
    for (const [n, v] of cs.slice(0, 8)) lines.push('  ' + fmtBytes(v).padStart(10) + '  ' + n);
    const nv = nvmlLine();
    if (nv && nv.v[k] >= 0) lines.push(nv.label + ': ' + fmtBytes(nv.v[k]));
    if (tl.steps) {
      const near = tl.steps.filter((p) => Math.abs(tl.x(p.t) - px) < 5).slice(0, 6);
      for (const p of near) lines.push((p.alloc ? '+ ' : '− ') + fmtBytes(Math.abs(p.bytes)) + ' at ' + fmtTime(p.t) + ': ' + stackLabel(p.stack));
    }
    for (const mk of tl.marks) {
      if (Math.abs(mk.x - px) < 6 && mk.kind === 'failure') {
        lines.push('✕ ' + plural(mk.n, 'failed allocation') + (mk.oom ? ' (' + mk.oom + ' out of memory)' : '') + ' in ' +
          fmtTime(mk.b0 * M.width) + ' – ' + fmtTime((mk.b1 + 1) * M.width));
        if (mk.i >= 0) {
          const f = M.failures[mk.i];
          lines.push('  the first: ' + f.api + ' of ' + fmtBytes(f.size) + ' failed: ' + f.error + ' (' + procShort(M, f.pid) + ')');
        }
      }
      if (Math.abs(mk.x - px) < 6 && mk.kind === 'exit') {
        lines.push('■ ' + procShort(M, mk.e.pid) + ' ended, holding ' + fmtBytes(mk.e.bytes) + ' (released as it ended)');
      }
    }
    tip.textContent = lines.join('\n');
    tip.hidden = false;
    // Inside the chart, whatever its width: never past its right edge.
    const tw = tip.offsetWidth;
    tip.style.left = Math.max(0, Math.min(px + 14, r.width - tw - 4)) + 'px';
    tip.style.top = (ev.clientY - r.top + 14) + 'px';
  }
  // zoomTo shows [t0, t1]; its range views follow (the Range tab is the
  // window shown); back is the window before.
  function zoomTo(t0, t1, push) {
    t0 = Math.max(0, t0); t1 = Math.min(M.span, t1);
    const min = Math.max(M.width / 20, 1000);
    if (t1 - t0 < min) { const c = (t0 + t1) / 2; t0 = Math.max(0, c - min / 2); t1 = Math.min(M.span, t0 + min); }
    if (push !== false) st.views.push(st.view);
    st.view = t0 <= 0 && t1 >= M.span ? null : {t0, t1};
    rangeFromView();
    render();
  }
  function rangeFromView() {
    if (st.view === null) { st.range = null; return; }
    const g = M.grid / M.spanF, unit = M.grid * M.width;
    const a = Math.floor(st.view.t0 / unit) * g, b = Math.min(Math.ceil(st.view.t1 / unit) * g, M.endJ);
    st.range = b > a ? {j0: a, j1: b} : null;
  }
  function zoomOut() {
    if (st.views.length > 0) { st.view = st.views.pop(); rangeFromView(); render(); return; }
    if (st.view !== null) { const v = st.view, c = (v.t0 + v.t1) / 2, w = (v.t1 - v.t0) * 2; zoomTo(c - w / 2, c + w / 2, false); }
  }
  function timelineEvents() {
    const cv = $('#timeline');
    cv.addEventListener('mousedown', (ev) => {
      const px = ev.clientX - cv.getBoundingClientRect().left;
      drag = {x0: px, x1: px};
    });
    window.addEventListener('mousemove', (ev) => {
      if (drag) {
        drag.x1 = ev.clientX - cv.getBoundingClientRect().left;
        drawTimeline();
      }
    });
    cv.addEventListener('mousemove', showTip);
    cv.addEventListener('mouseleave', () => { $('#tip').hidden = true; });
    window.addEventListener('mouseup', () => {
      if (!drag) return;
      const {x0, x1} = drag;
      drag = null;
      if (Math.abs(x1 - x0) < 4) {
        const near = tl.marks.find((mk) => Math.abs(mk.x - x0) < 6 && (mk.kind === 'peak' || mk.kind === 'failure' && mk.i >= 0));
        if (near && near.kind === 'peak') st.moment = {kind: 'peak'};
        else if (near && near.kind === 'failure' && M.failures[near.i].snapshot >= 0) st.moment = {kind: 'snap', i: M.failures[near.i].snapshot};
        else if (M.steps) st.moment = {kind: 't', t: Math.round(tOfX(x0))};
        else st.moment = {kind: 'j', j: jOfT(tOfX(x0))};
        st.zoom = [];
        setTab('moment');
        render();
      } else {
        // Drag to zoom (as Perfetto and memory_viz): the window, and the
        // Range tab's views of it.
        zoomTo(tOfX(Math.min(x0, x1)), tOfX(Math.max(x0, x1)));
      }
    });
    cv.addEventListener('dblclick', zoomOut);
    // Ctrl+wheel zooms about the pointer, Shift+wheel pans.
    cv.addEventListener('wheel', (ev) => {
      if (!ev.ctrlKey && !ev.shiftKey) return;
      ev.preventDefault();
      const v = view(), w = v.t1 - v.t0;
      if (ev.shiftKey) { const d = w * 0.2 * Math.sign(ev.deltaY || ev.deltaX); zoomTo(v.t0 + d, v.t1 + d, false); return; }
      const c = tOfX(ev.clientX - cv.getBoundingClientRect().left), f = ev.deltaY < 0 ? 0.8 : 1.25;
      zoomTo(c - (c - v.t0) * f, c + (v.t1 - c) * f, false);
    }, {passive: false});
    $('#zoom-out').addEventListener('click', zoomOut);
    $('#zoom-all').addEventListener('click', () => { st.views = []; st.view = null; rangeFromView(); render(); });
    const pan = (dir) => () => { const v = view(), d = (v.t1 - v.t0) / 2 * dir; if (v.t0 + d < 0) return zoomTo(0, v.t1 - v.t0, false); zoomTo(v.t0 + d, v.t1 + d, false); };
    $('#pan-left').addEventListener('click', pan(-1));
    $('#pan-right').addEventListener('click', pan(1));
    document.addEventListener('keydown', (ev) => { if (ev.key === 'Escape' && st.view !== null) zoomOut(); });
  }

  // ---------- flame graph ----------
  // The interpreter's own frames (its binary, libpython), ctypes' and
  // libffi's, and the C library's start-up: what memray folds by default
  // in a stack that has Python frames.
  const interpRx = /(^|\/)(python[0-9.]*[dmu]*|libpython[0-9.]*[dmu]*\.so[^/]*|libffi\.so[^/]*|_ctypes[^/]*\.so|libc\.so[^/]*|libc-[^/]*|ld-linux[^/]*)$/;
  function interpreterFrame(fid) { return M.frames.kind[fid] === 0 && interpRx.test(str(M.frames.module[fid])); }
  function frameShown(fid, stackHasPy) {
    const kind = M.frames.kind[fid];
    if (st.frames === 'fold') return !stackHasPy || !interpreterFrame(fid);
    if (st.frames === 'python') return !stackHasPy || kind === 1;
    if (st.frames === 'nocuda') return kind !== 2;
    return true;
  }
  function buildTrie(rows) {
    const root = {f: -1, bytes: 0, count: 0, kids: new Map()};
    for (const r of rows) {
      const fs = stackFrames(r.stack);
      const hasPy = fs.some((f) => M.frames.kind[f] === 1);
      let n = root;
      root.bytes += r.bytes; root.count += r.count;
      for (let i = fs.length - 1; i >= 0; i--) {
        const fid = fs[i];
        if (!frameShown(fid, hasPy)) continue;
        let c = n.kids.get(fid);
        if (!c) { c = {f: fid, bytes: 0, count: 0, kids: new Map(), parent: n}; n.kids.set(fid, c); }
        c.bytes += r.bytes; c.count += r.count;
        n = c;
      }
    }
    return root;
  }
  function frameColor(fid, matched) {
    if (matched) return '#e040fb';
    const own = M.frames.owner[fid];
    const kind = M.frames.kind[fid];
    const v = hash(str(M.frames.label[fid])) % 12;
    if (own >= 0) {
      const base = ownerColor(M.raw.owner_names[own]);
      return shade(base, v);
    }
    if (kind === 1) return 'hsl(210,55%,' + (62 + v) + '%)';
    if (kind === 2) return 'hsl(210,8%,' + (72 + v) + '%)';
    return 'hsl(36,80%,' + (58 + v) + '%)';
  }
  function shade(hex, v) {
    const n = parseInt(hex.slice(1), 16);
    const f = 0.75 + v / 60;
    const c = (x) => Math.min(255, Math.round(x * f + 255 * (1 - f) * 0.35));
    return 'rgb(' + c(n >> 16) + ',' + c((n >> 8) & 255) + ',' + c(n & 255) + ')';
  }
  let flame = null;
  function drawFlame(rows) {
    const cv = $('#flame');
    const root = buildTrie(rows);
    // The zoomed node: st.zoom is the path of frame ids from the root.
    let top = root;
    for (const fid of st.zoom) {
      const c = top.kids.get(fid);
      if (!c) break;
      top = c;
    }
    const ROW = 18;
    let depth = 0;
    (function d(n, k) { depth = Math.max(depth, k); for (const c of n.kids.values()) d(c, k + 1); })(top, 0);
    const ancestors = [];
    for (let n = top; n && n !== root; n = n.parent) ancestors.unshift(n);
    const rowsN = ancestors.length + depth + 1;
    cv.setAttribute('height', String(Math.max(60, Math.min(rowsN * ROW + 4, 2400))));
    const {ctx, w, h: ht} = setupCanvas(cv);
    ctx.clearRect(0, 0, w, ht);
    ctx.font = '11px system-ui, sans-serif';
    ctx.textBaseline = 'middle';
    const q = st.search.trim().toLowerCase();
    const rects = [];
    let matched = 0;
    const matchedNodes = new Set();
    const matches = (fid) => q !== '' && (str(M.frames.label[fid]).toLowerCase().includes(q) || str(M.frames.file[fid]).toLowerCase().includes(q)
      || str(M.frames.module[fid]).toLowerCase().includes(q));
    const box = (x, y, wd, label, color, node) => {
      ctx.fillStyle = color;
      ctx.fillRect(x, y, Math.max(wd - 1, 0.5), ROW - 1);
      if (wd > 30) {
        ctx.fillStyle = '#111';
        ctx.save(); ctx.beginPath(); ctx.rect(x, y, wd - 2, ROW); ctx.clip();
        ctx.fillText(label, x + 3, y + ROW / 2);
        ctx.restore();
      }
      rects.push({x, y, w: wd, node});
    };
    // The root, then the zoomed node's ancestors, full width.
    const total = root.bytes;
    box(0, 0, w, 'all: ' + fmtBytes(total) + ' in ' + plural(root.count, 'allocation'), '#d0d7de', root);
    let y = ROW;
    for (const a of ancestors.slice(0, -1)) {
      box(0, y, w, str(M.frames.label[a.f]) + ' (' + fmtBytes(a.bytes) + ')', frameColor(a.f, matches(a.f)), a);
      y += ROW;
    }
    function lay(n, x, wd, yy) {
      if (n !== root) {
        const m = matches(n.f);
        if (m && ![...matchedNodes].some((o) => isAncestor(o, n))) { matched += n.bytes; matchedNodes.add(n); }
        box(x, yy, wd, str(M.frames.label[n.f]) + ' ' + fmtBytes(n.bytes), frameColor(n.f, m), n);
        yy += ROW;
      }
      const kids = [...n.kids.values()].sort((a, b) => b.bytes - a.bytes || a.f - b.f);
      let cx = x;
      for (const c of kids) {
        const cw = n.bytes > 0 ? wd * c.bytes / n.bytes : 0;
        if (cw >= 0.5) lay(c, cx, cw, yy);
        cx += cw;
      }
    }
    lay(top, 0, w, top === root ? ROW : y);
    flame = {rects, root, top, total};
    $('#search-result').textContent = q === '' ? '' : 'matched ' + fmtBytes(matched) + ' (' + pct(matched, total) + ')';
    // Legend: the owners whose frames are drawn.
    const owners = new Set();
    for (const r of rects) if (r.node.f >= 0 && M.frames.owner[r.node.f] >= 0) owners.add(M.frames.owner[r.node.f]);
    const lg = $('#flame-legend');
    lg.replaceChildren(
      h('span', {class: 'chip'}, h('i', {style: 'background:hsl(210,55%,66%)'}), 'Python'),
      h('span', {class: 'chip'}, h('i', {style: 'background:hsl(36,80%,62%)'}), 'native'),
      h('span', {class: 'chip'}, h('i', {style: 'background:hsl(210,8%,76%)'}), "CUDA's own libraries"),
      ...[...owners].map((o) => h('span', {class: 'chip'}, h('i', {style: 'background:' + ownerColor(M.raw.owner_names[o])}), M.raw.owner_names[o])));
  }
  // underZoom: whether stack i's shown frames pass through the flame
  // graph's zoomed frame.
  function underZoom(i) {
    const fs = stackFrames(i);
    const hasPy = fs.some((f) => M.frames.kind[f] === 1);
    const shown = [];
    for (let k = fs.length - 1; k >= 0; k--) if (frameShown(fs[k], hasPy)) shown.push(fs[k]);
    const z = [];
    for (let n = flame.top; n && n.f >= 0; n = n.parent) z.unshift(n.f);
    return z.every((f, k) => shown[k] === f);
  }
  function isAncestor(a, n) { for (let p = n.parent; p; p = p.parent) if (p === a) return true; return false; }
  function flameEvents() {
    const cv = $('#flame');
    const hit = (ev) => {
      const r = cv.getBoundingClientRect();
      const x = ev.clientX - r.left, y = ev.clientY - r.top;
      return flame && flame.rects.find((b) => x >= b.x && x < b.x + b.w && y >= b.y && y < b.y + 18);
    };
    cv.addEventListener('click', (ev) => {
      const b = hit(ev);
      if (!b) return;
      const path = [];
      for (let n = b.node; n && n.f >= 0; n = n.parent) path.unshift(n.f);
      st.zoom = path;
      drawFlame(liveRows(momentInfo()));
    });
    cv.addEventListener('mousemove', (ev) => {
      const b = hit(ev);
      const tip = $('#tip');
      if (!b) { cv.title = ''; return; }
      const n = b.node;
      if (n.f < 0) { cv.title = 'all: ' + fmtBytes(n.bytes) + ' in ' + n.count + ' allocations'; return; }
      const fid = n.f;
      const file = str(M.frames.file[fid]);
      cv.title = str(M.frames.name[fid]) + (file ? '\n' + file + ':' + M.frames.line[fid] : '') +
        (str(M.frames.module[fid]) ? '\n' + str(M.frames.module[fid]) : '') +
        '\n' + fmtBytes(n.bytes) + ' (' + n.bytes + ' bytes, ' + pct(n.bytes, flame.total) + ') in ' + n.count + ' allocations';
      tip.hidden = true;
    });
  }

  // ---------- tables ----------
  function framesList(stack) {
    const ol = h('ol');
    for (const fid of stackFrames(stack)) {
      const kind = M.frames.kind[fid];
      const file = str(M.frames.file[fid]), mod = str(M.frames.module[fid]);
      let text = str(M.frames.name[fid]);
      if (file) text += ' (' + file + ':' + M.frames.line[fid] + ')';
      else if (mod) text += ' ' + mod;
      ol.append(h('li', {class: kind === 1 ? 'py' : kind === 2 ? 'cuda' : '', text}));
    }
    return ol;
  }
  function pathCell(stack) {
    return h('td', {class: 'path', 'data-stack': String(stack)},
      h('details', null, h('summary', {text: stackLabel(stack), title: stackFull(stack)}), framesList(stack)));
  }
  // table fills a table; past SHOWN rows, a button shows the rest.
  const SHOWN = 50;
  function table(id, head, rows) {
    const t = $(id);
    const shown = rows.slice(0, SHOWN);
    // A heading sits over its figures: right-aligned where they are.
    const first = rows.find((r) => r.children.length === head.length);
    t.replaceChildren(h('tr', null, ...head.map((c, i) => h('th', {text: c, class: first && first.children[i].classList.contains('n') ? 'n' : ''}))), ...shown);
    if (rows.length > SHOWN) {
      const more = h('tr', {class: 'more'}, h('td', {colspan: String(head.length)},
        h('button', {text: 'show all ' + rows.length + ' rows', onclick: () => { more.remove(); t.append(...rows.slice(SHOWN)); }})));
      t.append(more);
    }
  }
  function renderMoment() {
    const info = momentInfo();
    const rows = liveRows(info);
    let total = 0, count = 0, before = 0;
    for (const r of rows) { total += r.bytes; count += r.count; before += r.before; }
    const where = levelName(st.level) + ' of ' + procName(st.pid) + ' on ' + devName(st.dev);
    const when = info.what === 'at ' + fmtTime(info.t) ? '' : fmtTime(info.t) + ', ';
    $('#moment-title').textContent = 'Live ' + info.what + ' (' + when + (info.exact ? 'exact' : 'a bucket edge') + '): ' +
      fmtBytes(total) + ' in ' + plural(count, 'allocation') + ' — ' + where + (before > 0 ? '; ' + fmtBytes(before) + ' of it live before tracing began' : '');
    $('#moment-title').dataset.bytes = String(total);
    const ended = M.raw.exits.filter((e) => e.t <= info.t && e.bytes > 0 && (st.pid === 0 || e.pid === st.pid));
    $('#moment-note').textContent = ended.map((e) => 'pid ' + e.pid + ' had ended by then (at ' + fmtTime(e.t) + '), holding ' + fmtBytes(e.bytes) +
      ': the driver released it; the Range tab counts it as left live.').join(' ');
    drawFlame(rows);
    // The table follows the flame graph's zoom: the paths under its frame.
    const under = flame.top === flame.root ? rows : rows.filter((r) => underZoom(r.stack));
    const trs = under.slice(0, 1000).map((r) => h('tr', null, num(r.bytes), h('td', {class: 'n', text: pct(r.bytes, total)}),
      h('td', {class: 'n count', text: String(r.count)}), h('td', {text: M.raw.owner_names[M.stacks.owner[r.stack]]}),
      h('td', {text: str(M.stacks.api[r.stack])}),
      h('td', {text: procShort(M, M.stacks.pid[r.stack])}), pathCell(r.stack)));
    if (under.length > 1000) trs.push(h('tr', null, h('td', {colspan: '7', class: 'muted', text: (under.length - 1000) + ' more call paths, each under ' + fmtBytes(under[999].bytes)})));
    $('#paths-title').textContent = flame.top === flame.root ? 'Call paths live then' : 'Call paths live then under ' + str(M.frames.label[flame.top.f]) + ' (the flame graph\'s zoom)';
    table('#paths', ['bytes', 'share', 'allocations', 'owner', 'call', 'process', 'call path (innermost first)'], trs);
  }
  function rangeJ() { return st.range || {j0: 0, j1: M.endJ}; }
  function renderRange() {
    const {j0, j1} = rangeJ();
    const t0 = tOfJ(j0), t1 = tOfJ(j1);
    $('#range-title').textContent = (st.range ? 'From ' + fmtTime(t0) + ' to ' + fmtTime(t1) : 'The whole trace, ' + fmtTime(t0) + ' to ' + fmtTime(t1)) +
      ' — ' + levelName(st.level) + ' of ' + procName(st.pid) + ' on ' + devName(st.dev);
    // Leaks: made in the range (after moment j0, up to j1), live at j1 or
    // held when its process ended.
    const c = M.spans;
    const by = new Map();
    let tot = 0, n = 0;
    for (let i = 0; i < c.n; i++) {
      if (c.flags[i] & 1) continue;
      if (!(c.sb[i] > j0 && c.sb[i] <= j1)) continue;
      if (!(c.eb[i] > j1 || (c.flags[i] & 2))) continue;
      if (!stackSelected(c.stack[i]) || !devSelected(c.dev[i])) continue;
      let r = by.get(c.stack[i]);
      if (!r) { r = {stack: c.stack[i], bytes: 0, count: 0, exit: 0}; by.set(c.stack[i], r); }
      r.bytes += c.bytes[i]; r.count += c.count[i];
      if (c.flags[i] & 2) r.exit += c.bytes[i];
      tot += c.bytes[i]; n += c.count[i];
    }
    const leaks = [...by.values()].sort((a, b) => b.bytes - a.bytes || a.stack - b.stack);
    $('#leak-total').textContent = fmtBytes(tot) + ' (' + tot + ' bytes) in ' + plural(n, 'allocation') + ' made in the range ' + (n === 1 ? 'was' : 'were') + ' still live at its end' +
      (leaks.some((r) => r.exit > 0) ? ' (or held when their process ended)' : '') + '.';
    $('#leak-total').dataset.bytes = String(tot);
    table('#leaks', ['bytes', 'allocations', 'line', 'call path'], leaks.slice(0, 1000).map((r) => h('tr', null, num(r.bytes),
      h('td', {class: 'n count', text: String(r.count)}), h('td', {class: 'line', text: str(M.stacks.user_line[r.stack])}), pathCell(r.stack))));
    // Moves in [j0, j1): buckets of the move grid.
    const b0 = Math.floor(Math.min(j0 * M.spanF, M.nb) / M.moveF), b1 = j1 >= M.endJ ? Infinity : Math.floor(Math.min(j1 * M.spanF, M.nb) / M.moveF);
    const mv = M.moves;
    const lines = new Map(), funcs = new Map();
    const get = (m, k) => { let r = m.get(k); if (!r) { r = {key: k, added: 0, removed: 0, nAdded: 0, nRemoved: 0, used: 0, acquired: 0, nUsed: 0, nAcquired: 0}; m.set(k, r); } return r; };
    for (let i = 0; i < mv.n; i++) {
      if (mv.b[i] < b0 || mv.b[i] >= b1) continue;
      const s = mv.stack[i];
      if (st.pid !== 0 && M.stacks.pid[s] !== st.pid || !devSelected(mv.dev[i])) continue;
      if (M.stacks.level[s] === st.level) {
        for (const k of M.lineKeys[s]) {
          const r = get(lines, k);
          r.added += mv.added[i]; r.removed += mv.removed[i]; r.nAdded += mv.n_added[i]; r.nRemoved += mv.n_removed[i];
        }
      }
      for (const k of M.funcKeys[s]) {
        const r = get(funcs, k);
        if (M.stacks.level[s] === 1) { r.used += mv.added[i]; r.nUsed += mv.n_added[i]; } else { r.acquired += mv.added[i]; r.nAcquired += mv.n_added[i]; }
      }
    }
    const lr = [...lines.values()].sort((a, b) => b.added - a.added || b.removed - a.removed || a.key - b.key);
    table('#lines', ['added', 'removed', 'net', 'allocations', 'frees', 'line'], lr.slice(0, 1000).map((r) => h('tr', null,
      num(r.added), num(r.removed), num(r.added - r.removed, fmtSigned(r.added - r.removed)), h('td', {class: 'n', text: String(r.nAdded)}),
      h('td', {class: 'n', text: String(r.nRemoved)}), h('td', {class: 'line', text: str(r.key)}))));
    const fr = [...funcs.values()].filter((r) => r.nUsed + r.nAcquired > 0)
      .sort((a, b) => b.used - a.used || b.acquired - a.acquired || a.key - b.key);
    // Tensor columns only where a framework's allocator was traced.
    const tensors = M.levels.includes(1);
    table('#funcs', tensors ? ['tensors used', 'tensor allocations', 'acquired from the device', 'device allocations', 'function'] : ['acquired from the device', 'allocations', 'function'],
      fr.slice(0, 1000).map((r) => h('tr', null, ...(tensors ? [num(r.used), h('td', {class: 'n', text: String(r.nUsed)})] : []),
        num(r.acquired), h('td', {class: 'n', text: String(r.nAcquired)}), h('td', {class: 'func', text: str(r.key)}))));
    renderIntervals(j0, j1);
  }
  function renderIntervals(j0, j1) {
    const s = series();
    const sel = $('#interval');
    const k0 = Math.min(j0 * M.spanF, M.nb), k1 = Math.min(j1 * M.spanF, M.nb);
    const nbk = Math.max(k1 - k0, 1);
    const choices = [];
    for (const m of [1, 2, 5]) for (let p = 1; p <= 1e6; p *= 10) if (m * p <= nbk && nbk / (m * p) <= 500) choices.push(m * p);
    choices.sort((a, b) => a - b);
    if (!choices.includes(st.interval)) st.interval = choices.find((c) => nbk / c <= 50) || choices[choices.length - 1] || 1;
    sel.replaceChildren(...choices.map((c) => h('option', {value: String(c), text: 'every ' + fmtTime(c * M.width)})));
    sel.value = String(st.interval);
    if (!s) { table('#intervals', ['from'], []); return; }
    const rows = [];
    for (let a = k0; a < k1; a += st.interval) {
      const b = Math.min(a + st.interval, k1);
      const start = a === 0 ? 0 : s.end[a - 1];
      let peak = start;
      for (let k = a; k < b; k++) peak = Math.max(peak, s.max[k]);
      const end = s.end[b - 1];
      rows.push(h('tr', null, h('td', {class: 'n', text: fmtTime(a * M.width)}), num(end - start, fmtSigned(end - start)),
        num(peak - Math.max(start, end)), num(peak), num(end)));
    }
    table('#intervals', ['from', 'used (change)', 'peaked (above both ends)', 'peak', 'live at its end'], rows);
  }
  function renderFailures() {
    const fs = M.failures;
    $('#failures-title').textContent = fs.length === 0 ? 'No allocation failed.' :
      plural(M.raw.failed_all, 'allocation') + ' failed' + (M.raw.failed_all > fs.length ? ' (the first ' + fs.length + ' listed; the chart marks every one)' : '') +
      '; the first ' + M.raw.aggregation.failure_snaps + ' of each process have what was live then';
    table('#failures', ['time', 'process', 'call', 'size', 'device', 'error', 'its device held', 'the process held', '', 'call path'],
      fs.map((f) => h('tr', null, h('td', {class: 'n', text: fmtTime(f.t)}), h('td', {text: procShort(M, f.pid)}),
        h('td', {text: f.api}), num(f.size), h('td', {class: 'n', text: f.dev === -1 ? 'unknown' : String(f.dev)}),
        h('td', {text: f.error + ' (' + f.result + ')'}), num(f.device_live), num(f.live),
        h('td', null, f.snapshot >= 0 ? h('button', {text: 'what was live', onclick: () => { st.moment = {kind: 'snap', i: f.snapshot}; st.pid = f.pid; st.level = 0; st.zoom = []; syncControls(); setTab('moment'); render(); }}) : ''),
        pathCell(f.stack))));
  }
  function renderProcesses() {
    const ps = M.raw.processes || [];
    const tens = ps.some((p) => p.tensor_peak_bytes > 0);
    const ranked = ps.some((p) => p.job && p.job.rank != null || p.node);
    table('#procs', ['pid', ...(ranked ? ['job', 'rank', 'node'] : []), 'command', 'allocs', 'frees', 'failed', 'peak', 'live at end', ...(tens ? ['tensors peak'] : []), 'devices', 'notes'],
      ps.map((p) => h('tr', null, h('td', {class: 'n', text: String(p.pid)}),
        ...(ranked ? [h('td', {text: p.job ? p.job.id || '' : ''}), h('td', {class: 'n', text: p.job && p.job.rank != null ? String(p.job.rank) : ''}),
          h('td', {text: (p.node || '') + (p.node_pid ? ':' + p.node_pid : '')})] : []),
        h('td', {text: (p.cmdline && p.cmdline.length ? p.cmdline.join(' ') : p.comm)}),
        h('td', {class: 'n', text: String(p.allocs)}), h('td', {class: 'n', text: String(p.frees)}), h('td', {class: 'n', text: String(p.failed)}),
        num(p.peak_bytes), num(p.live_bytes), ...(tens ? [num(p.tensor_peak_bytes)] : []),
        h('td', {text: (p.devices || []).map((d) => (d.unknown ? 'unknown' : 'GPU ' + d.device) + ': peak ' + fmtBytes(d.peak_bytes)).join(', ')}),
        h('td', {class: 'muted', text: [p.exited ? 'exited holding ' + fmtBytes(p.held_at_exit_bytes || 0) : '',
          p.before_bytes ? fmtBytes(p.before_bytes) + ' live before tracing' : '', p.capture_error ? 'mappings not read: ' + p.capture_error : '',
          p.unknown_frees ? p.unknown_frees + ' frees of memory not seen allocated' : ''].filter(Boolean).join('; ')}))));
    const rows = [];
    for (const po of M.raw.owners || []) {
      const key = (s) => s.device + '|' + s.owner + '|' + (s.module || '');
      const m = new Map();
      for (const s of po.end || []) m.set(key(s), {s, end: s.live_bytes, peak: 0});
      for (const s of po.peak || []) { const r = m.get(key(s)) || {s, end: 0, peak: 0}; r.peak = s.live_bytes; m.set(key(s), r); }
      for (const r of m.values()) rows.push(h('tr', null, h('td', {text: procShort(M, po.pid)}),
        h('td', {text: r.s.unknown ? 'unknown' : String(r.s.device)}), h('td', {text: r.s.owner + (r.s.module ? ' (' + r.s.module + ')' : '')}),
        num(r.end), num(r.peak)));
      if (po.untraced_bytes != null) rows.push(h('tr', null, h('td', {text: procShort(M, po.pid)}), h('td', {text: 'all'}),
        h('td', {text: 'context, modules and untraced (NVML less traced)'}), num(po.untraced_bytes, fmtSigned(po.untraced_bytes)), h('td')));
    }
    table('#owners', ['process', 'device', 'owner', 'at end', 'at peak'], rows);
    const nv = $('#nvml');
    const sum = M.raw.nvml_summary;
    nv.replaceChildren();
    if (!sum) { nv.textContent = 'No sample of the driver\'s view in this trace (recorded with --nvml=false, or where NVML is not loaded).'; return; }
    if (sum.samples === 0) { nv.textContent = 'None while recording: ' + (sum.error || ''); return; }
    const t = h('table', {class: 'rows'});
    t.append(h('tr', null, ...['GPU', 'name', 'total', 'used at the last sample', 'most used'].map((c) => h('th', {text: c}))));
    for (const g of sum.devices) t.append(h('tr', null, h('td', {class: 'n', text: String(g.index)}), h('td', {text: g.name}),
      num(g.total_bytes), num(g.used_bytes), num(g.max_used_bytes)));
    nv.append(h('p', {text: sum.samples + ' samples' + (sum.failed ? ', ' + sum.failed + ' failed: ' + sum.error : '')}), t);
  }
  function renderAbout() {
    const a = M.raw.aggregation;
    const ab = $('#about');
    ab.replaceChildren(
      h('h2', {text: 'What this page holds, and how finely'}),
      h('ul', null,
        h('li', {text: 'Time is cut into ' + a.buckets + ' buckets of ' + fmtTime(a.bucket_ns) + '. Each bar of the chart is the highest the memory reached in its bucket (its start included), split by owner or by call path as it stood at that moment: no peak is lost between pixels.'}),
        h('li', {text: 'Live sets are kept at ' + (a.span_buckets === 1 ? 'every bucket edge' : 'every ' + a.span_buckets + ' bucket edges (' + fmtTime(a.span_buckets * a.bucket_ns) + ')') +
          ' and at the end: ' + a.span_rows + ' rows of (call path, device, first and last moment live). An allocation made and freed between two kept moments is in no live set shown, but is in the chart\'s highest figures. The live set at each series\' peak and at the first ' + a.failure_snaps + ' failures of each process is exact.'}),
        h('li', {text: 'A range\'s views (what it left live, what each line added and removed, each function\'s used and acquired bytes) count in units of ' +
          fmtTime(Math.max(a.span_buckets, a.move_buckets) * a.bucket_ns) + ': the range snaps to them. ' + a.move_rows + ' rows of (call path, device, bucket) hold what was allocated and freed.'}),
        h('li', {text: 'A series splits into its owners (the component whose frame is innermost in the allocating stack, as `cudatrace report` names them) or into its ' + a.top_paths + ' call paths that held the most at any time, the rest as "other".'}),
        h('li', {text: 'GPU memory is what the driver holds (cudaMalloc and the like, VMM memory from cuMemCreate); tensors are what a framework\'s allocator handed out of it (PyTorch\'s pytorch:malloc), in the bytes asked for.'}),
        h('li', {text: 'The driver\'s figure (NVML), where the trace has it, is the most it charged in each bucket: the CUDA context, library workspaces and what no probe saw are in it and not in the traced bytes. NVML numbers GPUs its own way, which CUDA\'s ordinals need not match.'}),
        h('li', {text: M.raw.events + ' events that allocated, freed or failed were read; ' + (M.raw.failed_all || 0) + ' failed allocations (at most ' + a.max_failures + ' listed).'})),
      h('p', {class: 'muted', text: 'Made by cudatrace from ' + M.raw.source + ' at ' + M.raw.generated + '. The page works offline: no script or font is fetched.'}));
  }

  // ---------- controls ----------
  function syncControls() {
    const pid = $('#pid'), dev = $('#dev'), lvl = $('#level');
    pid.replaceChildren(h('option', {value: '0', text: 'all (' + M.pids.length + ')'}), ...M.pids.map((p) => h('option', {value: String(p), text: procShort(M, p) + ' ' + (M.comm.get(p) || '')})));
    pid.value = String(st.pid);
    dev.replaceChildren(h('option', {value: '*', text: 'all'}), ...M.devices.map((d) => h('option', {value: String(d), text: d === -1 ? 'unknown' : 'GPU ' + d})));
    dev.value = st.dev === null ? '*' : String(st.dev);
    lvl.replaceChildren(...M.levels.map((l) => h('option', {value: String(l), text: levelName(l)})));
    if (!M.levels.includes(st.level)) st.level = M.levels[0] || 0;
    lvl.value = String(st.level);
    $('#split').value = st.split;
  }
  function setTab(t) {
    st.tab = t;
    for (const b of document.querySelectorAll('#tabs button')) b.classList.toggle('on', b.dataset.tab === t);
    for (const s of document.querySelectorAll('.tab')) s.hidden = s.id !== 'tab-' + t;
  }
  function controlEvents() {
    $('#pid').addEventListener('change', (e) => { st.pid = Number(e.target.value); st.zoom = []; render(); });
    $('#dev').addEventListener('change', (e) => { st.dev = e.target.value === '*' ? null : Number(e.target.value); st.zoom = []; render(); });
    $('#level').addEventListener('change', (e) => { st.level = Number(e.target.value); st.zoom = []; render(); });
    $('#split').addEventListener('change', (e) => { st.split = e.target.value; render(); });
    $('#frames').addEventListener('change', (e) => { st.frames = e.target.value; st.zoom = []; renderMoment(); });
    $('#search').addEventListener('input', (e) => { st.search = e.target.value; drawFlame(liveRows(momentInfo())); });
    $('#unzoom').addEventListener('click', () => { st.zoom = []; renderMoment(); });
    $('#interval').addEventListener('change', (e) => { st.interval = Number(e.target.value); const {j0, j1} = rangeJ(); renderIntervals(j0, j1); });
    $('#range-clear').addEventListener('click', () => { st.range = null; st.view = null; st.views = []; render(); });
    const go = (m) => () => { st.moment = m(); st.zoom = []; render(); };
    const cur = () => { const i = momentInfo(); return i.j !== undefined ? i.j : jOfT(i.t); };
    $('#go-start').addEventListener('click', go(() => ({kind: 'j', j: 0})));
    $('#go-end').addEventListener('click', go(() => ({kind: 'j', j: M.endJ})));
    $('#go-peak').addEventListener('click', go(() => ({kind: 'peak'})));
    $('#go-prev').addEventListener('click', go(() => ({kind: 'j', j: Math.max(0, cur() - 1)})));
    $('#go-next').addEventListener('click', go(() => ({kind: 'j', j: Math.min(M.endJ, cur() + 1)})));
    for (const b of document.querySelectorAll('#tabs button')) b.addEventListener('click', () => setTab(b.dataset.tab));
    let resize = 0;
    window.addEventListener('resize', () => { clearTimeout(resize); resize = setTimeout(render, 100); });
  }

  function renderHead() {
    document.title = M.raw.title;
    $('#title').textContent = M.raw.title;
    $('#header').textContent = M.raw.header;
    const notes = $('#notes');
    notes.replaceChildren(...M.raw.notes.map((n) => h('li', {class: /^(WARNING|Warning)/.test(n) ? 'warn' : '', text: n})));
  }
  function render() {
    if (st.pid !== 0 && !M.pids.includes(st.pid)) st.pid = 0;
    if (st.dev !== null && !M.devices.includes(st.dev)) st.dev = null;
    if (st.moment.kind === 'snap' && !M.snaps[st.moment.i]) st.moment = {kind: 'peak'};
    if (st.moment.kind === 'j') st.moment.j = Math.min(st.moment.j, M.endJ);
    if (st.range) { st.range.j1 = Math.min(st.range.j1, M.endJ); if (st.range.j0 >= st.range.j1) st.range = null; }
    syncControls();
    drawTimeline();
    renderMoment();
    renderRange();
    renderFailures();
    renderProcesses();
    renderAbout();
  }

  // ---------- live refresh (the agent's /ui) ----------
  function live() {
    const lv = M.raw.live;
    if (!lv) return;
    const el = $('#live');
    const tick = async () => {
      try {
        const r = await fetch(lv.url, {cache: 'no-store', credentials: 'same-origin'});
        if (!r.ok) throw new Error(r.status + ' ' + (await r.text()).trim());
        const raw = await r.json();
        if (raw.version !== M.raw.version) { location.reload(); return; }
        const keepEnd = st.moment.kind === 'j' && st.moment.j === M.endJ;
        M = decode(raw);
        if (keepEnd) st.moment = {kind: 'j', j: M.endJ};
        renderHead();
        render();
        window.cudatrace.refreshes++;
        el.className = '';
        el.textContent = 'live: updated ' + new Date().toLocaleTimeString() + ', every ' + lv.every_seconds + ' s';
      } catch (e) {
        el.className = 'error';
        el.textContent = 'live: refresh failed (' + e.message + '); the figures are as of the last update';
      }
      setTimeout(tick, lv.every_seconds * 1000);
    };
    el.textContent = 'live: every ' + lv.every_seconds + ' s';
    setTimeout(tick, lv.every_seconds * 1000);
  }

  // ---------- start ----------
  window.cudatrace = {ready: false, refreshes: 0};
  try {
    M = decode(JSON.parse($('#data').textContent));
    st.level = M.levels.includes(0) ? 0 : (M.levels[0] || 0);
    const first = series();
    if (first && first.owners.length <= 1 && first.paths.length > 1) st.split = 'path'; // one owner: its paths say more
    renderHead();
    controlEvents();
    timelineEvents();
    flameEvents();
    render();
    live();
    // For tests and scripts: the state, the data and where things are.
    Object.assign(window.cudatrace, {
      state: st, model: () => M, render,
      xOfT: (t) => tl.x(t), tOfJ, endJ: () => M.endJ, zoomTo, view: () => view(),
      steps: () => tl.steps ? tl.steps.map((p) => ({t: p.t, bytes: p.bytes, stack: p.stack})) : null,
      failureMarks: () => tl.failureMarks, labels: () => M.labels.slice(), fmt: {bytes: fmtBytes, time: fmtTime},
      colors: () => Object.fromEntries(cats(series()).map((c) => [c.name, c.color])),
      flameRects: () => flame.rects.map((r) => ({x: r.x, y: r.y, w: r.w, bytes: r.node.bytes, count: r.node.count,
        frame: r.node.f >= 0 ? str(M.frames.label[r.node.f]) : null,
        path: (() => { const p = []; for (let n = r.node; n && n.f >= 0; n = n.parent) p.unshift(str(M.frames.label[n.f])); return p; })()})),
      ready: true,
    });
  } catch (e) {
    const f = $('#fatal');
    f.hidden = false;
    f.textContent = 'This page could not show its data: ' + e.stack;
    throw e;
  }
})();

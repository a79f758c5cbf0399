// rubris ops page: the browser side of `{mount}/ops`.
//
// One ES module, no build step, no dependencies. The server answers `{mount}/ops` with an empty
// HTML shell that loads this file; everything else (style, header, tiles, charts, tables) is built
// here. The module polls `{mount}/ops/stats` once a second (the JSON described in the project's
// "rubris ops: the stats JSON" contract) and turns successive snapshots into rates:
//
//   - every worker writes its own snapshot; counters are monotonic since that worker started, so
//     rates come from diffing two snapshots OF THE SAME WORKER, over that worker's own `time`;
//   - the totals on the page are sums of the per-worker rates and gauges;
//   - the last 5 minutes are kept (300 points) and drawn as inline SVG by `drawChart`.
//
// Reading order: constants and formatting, DOM helpers, per-worker state, the totals of one
// poll, the history, the chart, tiles/tables/header, then the poll loop at the bottom.
//
// Everything the server sends (topic names, users, worker ids, hosts) is untrusted text: it only
// reaches the DOM through textContent and setAttribute, never innerHTML. Objects keyed by such
// names are Maps or prototype-less objects, so a topic called "__proto__" is just a topic.

// ---------------------------------------------------------------------------------------------
// Constants

const POLL_MS = 1000;
const HISTORY = 300; // points kept per series: 5 minutes at 1 s
const WINDOW_S = (HISTORY * POLL_MS) / 1000;
const WORKER_TTL_MS = 5000; // a worker missing from the answers this long is forgotten
const STALE_MS = 3500; // no good answer for this long: the figures on screen are old
const FETCH_TIMEOUT_MS = 4000; // a hung request must not stop the polling
const BREAK_S = 2.5; // two points further apart than this are not joined: the hole is an outage
const TOP_TOPICS = 5;
const MAX_QUEUE_SERIES = 4;
const TABLE_ROWS = 15;
const CHART_H = 200;
const STATS_URL = new URL("stats", import.meta.url);

// Distinct on light and dark backgrounds, and for the common colour-blindnesses first two.
const PALETTE = ["#2563eb", "#e8590c", "#0d9488", "#c026d3", "#ca8a04", "#64748b"];

// Protocol error codes (protocol.md section 9, rubris_asgi/errors.py ErrorCode). Kind "http"
// carries the same codes, answered over long-poll.
const ERROR_CODES = new Map([
  [1, "PROTOCOL"],
  [2, "UNSUPPORTED_VERSION"],
  [3, "UNKNOWN"],
  [4, "NOT_AUTHORISED"],
  [5, "TOO_LARGE"],
  [6, "TOO_MANY"],
  [7, "SLOW_CONSUMER"],
  [8, "SESSION_EXPIRED"],
  [9, "SHUTTING_DOWN"],
  [10, "REJECTED"],
]);

// ---------------------------------------------------------------------------------------------
// Small value helpers and number formatting

const isNum = (x) => typeof x === "number" && Number.isFinite(x);
const num = (x) => (isNum(x) ? x : 0);
const str = (x) => (x == null ? "" : String(x));
const list = (x) => (Array.isArray(x) ? x : []);
const dict = () => Object.create(null);
const sum = (values) => values.reduce((a, b) => a + num(b), 0);

/** Three significant digits and a unit prefix: 1234 -> "1.23k", 0.5 -> "0.5". */
function fmtScaled(x, units, base) {
  if (!isNum(x)) return "–";
  let v = x;
  let i = 0;
  // Compare the rounded value so 999.7 becomes "1k", not "1000".
  while (Math.abs(Number(v.toPrecision(3))) >= base && i < units.length - 1) {
    v /= base;
    i += 1;
  }
  return `${Number(v.toPrecision(3))}${units[i]}`;
}

const fmtNum = (x) => fmtScaled(x, ["", "k", "M", "G", "T"], 1000);
const fmtRate = (x) => (isNum(x) ? `${fmtNum(x)}/s` : "–");
const fmtBytes = (x) => fmtScaled(x, [" B", " kB", " MB", " GB", " TB"], 1000);
const fmtByteRate = (x) => (isNum(x) ? `${fmtBytes(x)}/s` : "–");
const fmtPct = (x) => (isNum(x) ? `${Number(x.toPrecision(x >= 100 ? 4 : 3))}%` : "–");

/** Whole counts are easier to compare with separators, until they get long. */
const fmtCount = (x) =>
  !isNum(x) ? "–" : Math.abs(x) < 1e6 ? Math.round(x).toLocaleString("en-US") : fmtNum(x);

/** Seconds as milliseconds while under a second: 0.0123 -> "12.3 ms". */
function fmtMs(s) {
  if (!isNum(s)) return "–";
  if (s === 0) return "0 ms";
  if (Math.abs(s) >= 1) return `${Number(s.toPrecision(3))} s`;
  const ms = s * 1000;
  return `${Number(ms.toPrecision(ms < 1 ? 2 : 3))} ms`;
}

/** Uptime style: "3d 4h", "2h 5m", "5m 3s", "42s". */
function fmtDuration(s) {
  if (!isNum(s) || s < 0) return "–";
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = Math.floor(s % 60);
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${sec}s`;
  return `${sec}s`;
}

const fmtClock = (ms) => new Date(ms).toLocaleTimeString("en-GB", { hour12: false });

// ---------------------------------------------------------------------------------------------
// DOM helpers: strings always become text nodes (Element.append), so server text cannot inject.

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  node.append(...children.filter((c) => c != null && c !== false));
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  node.append(...children.filter((c) => c != null && c !== false));
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value == null || value === false) continue;
    if (key === "text") node.textContent = str(value);
    else node.setAttribute(key, value === true ? "" : str(value));
  }
}

// ---------------------------------------------------------------------------------------------
// Per-worker state: the last snapshot of each worker and the rates diffed from it.

/**
 * @typedef {object} WorkerState
 * @property {string} id         the snapshot's `worker` (host:pid)
 * @property {object} snap       its newest snapshot
 * @property {boolean} self      it answered the last poll
 * @property {number} firstMs    page clock when it first appeared
 * @property {number} seenMs     page clock when it was last in an answer
 * @property {object|null} rates counter name -> per second, over its last interval
 * @property {object} hist       histogram name -> {bounds, counts} of its last interval
 * @property {Map} errorRates    "kind code" -> per second
 * @property {Map} queueRates    queue name -> {field: per second}
 */

/** @type {Map<string, WorkerState>} */
const workers = new Map();

function observeWorkers(snapshots, nowMs) {
  for (const w of workers.values()) w.self = false;
  for (const snap of snapshots) {
    if (!snap || typeof snap !== "object" || typeof snap.worker !== "string") continue;
    let w = workers.get(snap.worker);
    if (!w) {
      w = { id: snap.worker, snap: null, self: false, firstMs: nowMs, seenMs: nowMs, rates: null, hist: dict() };
      w.errorRates = new Map();
      w.queueRates = new Map();
      workers.set(snap.worker, w);
    }
    w.self = snap.self === true;
    w.seenMs = nowMs;
    advanceWorker(w, snap);
  }
  // Forget workers that stopped appearing (shut down, or their snapshot expired on the server).
  for (const [id, w] of workers) if (nowMs - w.seenMs > WORKER_TTL_MS) workers.delete(id);
}

function advanceWorker(w, snap) {
  const prev = w.snap;
  if (!prev) {
    w.snap = snap;
    return;
  }
  const dt = num(snap.time) - num(prev.time);
  // Another worker's snapshot is rewritten once per interval: the same `time` as before means
  // nothing new, so its last rates stand rather than dropping to zero.
  if (!(dt > 0)) return;
  // Counters going backwards: a restart under the same id. Start again from this snapshot.
  if (wentBackwards(prev.counters, snap.counters)) {
    w.snap = snap;
    return;
  }
  w.rates = counterRates(prev.counters, snap.counters, dt);
  w.hist = histogramDeltas(prev.histograms, snap.histograms);
  w.errorRates = keyedRates(errorEntries(prev), errorEntries(snap), errorKey, ["count"], dt);
  w.queueRates = keyedRates(prev.queues, snap.queues, (q) => str(q.name), QUEUE_COUNTERS, dt);
  w.snap = snap;
}

const QUEUE_COUNTERS = ["enqueued", "delivered", "acked", "nacked", "redelivered", "revoked",
  "dead_lettered", "dropped", "duplicates"];

const errorKey = (e) => `${str(e.kind)} ${str(e.code)}`;

/**
 * A snapshot's protocol errors, and its HTTP API refusals as kind "api" (code: the HTTP status):
 * one list, so the table and the rates treat them alike.
 */
function errorEntries(snap) {
  const refusals = list(snap.api_refusals).map((r) => ({
    kind: "api", code: r?.status, name: `HTTP ${str(r?.status)}`, count: r?.count,
  }));
  return [...list(snap.errors).filter((e) => e && typeof e === "object"), ...refusals];
}

function wentBackwards(prev, next) {
  if (!prev || !next) return false;
  return Object.keys(prev).some((k) => isNum(prev[k]) && isNum(next[k]) && next[k] < prev[k]);
}

function counterRates(prev, next, dt) {
  const out = dict();
  for (const [k, v] of Object.entries(next ?? {})) {
    if (isNum(v) && isNum(prev?.[k])) out[k] = (v - prev[k]) / dt;
  }
  return out;
}

/** The bucket counts of the last interval, per histogram; none when the two do not line up. */
function histogramDeltas(prev, next) {
  const out = dict();
  for (const [name, h] of Object.entries(next ?? {})) {
    const p = prev?.[name];
    const bounds = list(h?.bounds);
    const counts = list(h?.counts);
    if (!p || counts.length !== bounds.length + 1 || list(p.counts).length !== counts.length) continue;
    const delta = counts.map((c, i) => num(c) - num(p.counts[i]));
    if (delta.some((d) => d < 0)) continue;
    out[name] = { bounds, counts: delta };
  }
  return out;
}

/**
 * Rates of the monotonic fields of list entries (errors, queues), matched by key. An entry that
 * was absent before started from zero: entries appear with their first event.
 */
function keyedRates(prevList, nextList, keyOf, fields, dt) {
  const before = new Map(list(prevList).map((e) => [keyOf(e), e]));
  const out = new Map();
  for (const e of list(nextList)) {
    const p = before.get(keyOf(e));
    const rates = dict();
    for (const f of fields) {
      const d = num(e[f]) - num(p?.[f]);
      if (d >= 0) rates[f] = d / dt;
    }
    out.set(keyOf(e), rates);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The totals of one poll: sums across workers.

/** Sum the numeric fields of several objects ({shared: 3, private: 1} + ...). */
function sumFields(objects) {
  const out = dict();
  for (const o of objects) {
    for (const [k, v] of Object.entries(o ?? {})) if (isNum(v)) out[k] = num(out[k]) + v;
  }
  return out;
}

/** Prometheus' histogram_quantile: linear inside the bucket; the +Inf bucket gives the last bound. */
function quantile(q, bounds, counts) {
  const total = sum(counts);
  if (!(total > 0) || bounds.length === 0) return null;
  const rank = q * total;
  let cum = 0;
  for (let i = 0; i < counts.length; i += 1) {
    const c = counts[i];
    if (c > 0 && cum + c >= rank) {
      if (i >= bounds.length) return bounds[bounds.length - 1];
      const lo = i === 0 ? 0 : bounds[i - 1];
      return lo + (bounds[i] - lo) * ((rank - cum) / c);
    }
    cum += c;
  }
  return bounds[bounds.length - 1];
}

/** The last interval's distribution summed across workers (same bounds), then its quantiles. */
function histogramQuantiles(ws, name) {
  let bounds = null;
  let counts = null;
  for (const w of ws) {
    const h = w.hist[name];
    if (!h) continue;
    if (!bounds) {
      bounds = h.bounds;
      counts = h.counts.slice();
    } else if (h.bounds.length === bounds.length) {
      h.counts.forEach((c, i) => { counts[i] += c; });
    }
  }
  // No sample in the interval: null, which the chart draws as a gap rather than a fake zero.
  if (!bounds) return { p50: null, p99: null, count: 0 };
  return { p50: quantile(0.5, bounds, counts), p99: quantile(0.99, bounds, counts), count: sum(counts) };
}

function computeTotals(nowMs) {
  const ws = [...workers.values()];
  const snaps = ws.map((w) => w.snap);
  const withRates = ws.filter((w) => w.rates);
  // A worker that just appeared has no rate yet: summing without it would draw a false dip, so
  // the totals wait for it (a gap) for a few seconds; one that never moves stops being waited for.
  const waiting = ws.some((w) => !w.rates && nowMs - w.firstMs < 3 * POLL_MS);
  const rates = withRates.length && !waiting ? sumFields(withRates.map((w) => w.rates)) : null;
  const rate = (k) => (rates ? num(rates[k]) : null);
  const counters = sumFields(snaps.map((s) => s.counters));
  const gauges = sumFields(snaps.map((s) => s.gauges));
  const fills = snaps.map((s) => s.gauges?.intake_fill_ratio).filter(isNum);
  const sessionsBy = dict();
  for (const s of snaps) {
    for (const [transport, states] of Object.entries(s.sessions ?? {})) {
      sessionsBy[transport] = sumFields([sessionsBy[transport], states]);
    }
  }
  const sessions = sumFields(Object.values(sessionsBy));
  return {
    ws,
    rates,
    rate,
    counters,
    gauges,
    // The worst worker's intake is the one that refuses first: show the maximum, not a sum.
    intakeFill: fills.length ? Math.max(...fills) * 100 : null,
    sessionsBy,
    sessions,
    subscriptions: sumFields(snaps.map((s) => s.subscriptions)),
    topicsCount: sumFields(snaps.map((s) => s.topics)),
    pool: poolTotals(snaps),
    cycle: histogramQuantiles(ws, "cycle_duration_seconds"),
    ptf: histogramQuantiles(ws, "publish_to_frame_seconds"),
    topics: topicRows(ws),
    queues: queueRows(ws),
    errors: errorRows(ws),
    slowest: slowRows(ws),
  };
}

function poolTotals(snaps) {
  const out = dict();
  for (const cls of ["block", "large", "unpooled"]) {
    out[cls] = sumFields(snaps.map((s) => s.pool?.[cls]));
    out[cls].peak = Math.max(0, ...snaps.map((s) => num(s.pool?.[cls]?.peak)));
  }
  return out;
}

function topicRows(ws) {
  const rows = [];
  for (const w of ws) {
    for (const t of list(w.snap.topics_busiest)) rows.push({ ...t, worker: w.id });
  }
  rows.sort((a, b) => num(b.rate) - num(a.rate));
  // A shared topic lives in every worker that has subscribers: its rate is the sum by name.
  const byName = new Map();
  for (const r of rows) byName.set(str(r.name), num(byName.get(str(r.name))) + num(r.rate));
  return { rows, byName };
}

function queueRows(ws) {
  // Queue topics live in one process; should a name show up in several, they are summed.
  const byName = new Map();
  for (const w of ws) {
    for (const q of list(w.snap.queues)) {
      const name = str(q.name);
      const row = byName.get(name) ?? { name, rates: dict(), workers: [] };
      for (const f of ["waiting", "outstanding", "consumers", ...QUEUE_COUNTERS]) {
        row[f] = num(row[f]) + num(q[f]);
      }
      const r = w.queueRates.get(name);
      for (const f of QUEUE_COUNTERS) if (r && isNum(r[f])) row.rates[f] = num(row.rates[f]) + r[f];
      row.workers.push(w.id);
      byName.set(name, row);
    }
  }
  return [...byName.values()].sort((a, b) => b.waiting - a.waiting || a.name.localeCompare(b.name));
}

function errorRows(ws) {
  const byKey = new Map();
  for (const w of ws) {
    for (const e of errorEntries(w.snap)) {
      const key = errorKey(e);
      // The server names the code; the table here covers an older server that does not.
      const name = typeof e.name === "string" ? e.name : ERROR_CODES.get(e.code) ?? "";
      const row = byKey.get(key) ?? { kind: str(e.kind), code: e.code, name, count: 0, rate: 0 };
      row.count += num(e.count);
      row.rate += num(w.errorRates.get(key)?.count);
      byKey.set(key, row);
    }
  }
  return [...byKey.values()].sort((a, b) => b.rate - a.rate || b.count - a.count);
}

/** Worst first, by the same order the server uses: stuck writes, then failures, holds, NAKs. */
function slowRows(ws) {
  const rows = [];
  for (const w of ws) {
    for (const s of list(w.snap.slowest)) {
      // The server lists its worst ten even when they are fine; a session with no sign of
      // trouble is not a slow session.
      const trouble = num(s.blocked_for) + num(s.failed_sends) + num(s.held_for) + num(s.nak_fill)
        + num(s.nak_interval) + num(s.backlog);
      if (trouble > 0) rows.push({ ...s, worker: w.id });
    }
  }
  const keys = ["blocked_for", "failed_sends", "held_for", "nak_fill", "backlog", "nak_interval"];
  rows.sort((a, b) => {
    for (const k of keys) if (num(b[k]) !== num(a[k])) return num(b[k]) - num(a[k]);
    return 0;
  });
  return rows;
}

// ---------------------------------------------------------------------------------------------
// History: one sample per good poll, at most HISTORY of them.

/** @type {{t: number, v: object}[]}  t: page clock in seconds; v: series key -> value or null */
const history = [];

function recordSample(tot, nowMs) {
  const v = dict();
  v.delivered = tot.rate("messages_delivered");
  v.published = tot.rate("published_messages");
  v.cycleP50 = tot.cycle.p50;
  v.cycleP99 = tot.cycle.p99;
  v.ptfP50 = tot.ptf.p50;
  v.ptfP99 = tot.ptf.p99;
  v.connected = num(tot.sessions.connected);
  v.detached = num(tot.sessions.detached);
  v.intake = tot.intakeFill;
  v.pool = tot.pool.block.limit > 0 ? (100 * tot.pool.block.in_use) / tot.pool.block.limit : null;
  v.blocked = tot.rate("blocked_writes");
  v.failed = tot.rate("failed_sends");
  v.naks = tot.rate("naks_received");
  for (const [name, r] of tot.topics.byName) v[`topic:${name}`] = r;
  v.unacked = tot.queues.length ? sum(tot.queues.map((q) => q.outstanding)) : null;
  for (const q of tot.queues) v[`queue:${q.name}`] = q.waiting;
  history.push({ t: nowMs / 1000, v });
  // Bounded memory: the page may stay open for weeks on a wall screen.
  while (history.length > HISTORY) history.shift();
}

// ---------------------------------------------------------------------------------------------
// The chart: inline SVG, one polyline per contiguous run of a series, drawn from scratch on
// every poll (a few hundred nodes; simpler and cheaper than diffing).

const PAD = { left: 62, right: 12, top: 10, bottom: 22 };

function createChart(def) {
  const svg = svgEl("svg", { class: "plot", height: CHART_H, role: "img", "aria-label": def.title });
  const legend = el("div", { class: "legend" });
  const note = el("div", { class: "note", hidden: true });
  const root = el(
    "section",
    { class: "card chart", "data-chart": def.name },
    el("header", {}, el("h3", { text: def.title }), legend),
    svg,
    note,
  );
  const chart = { def, root, svg, legend, note, hoverT: null, series: [], colours: new Map() };
  svg.addEventListener("pointermove", (e) => guard(() => hoverChart(chart, e)));
  svg.addEventListener("pointerleave", () => guard(() => {
    chart.hoverT = null;
    drawChart(chart);
  }));
  return chart;
}

/** Step of about `raw` from 1, 2, 2.5, 5 x 10^n: tick labels stay round. */
function niceStep(raw) {
  const mag = 10 ** Math.floor(Math.log10(raw));
  const f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * mag;
}

function yTop(def, hi) {
  let step = niceStep(Math.max(hi, def.minTop) / 4);
  if (def.integer) step = Math.max(1, Math.ceil(step));
  const top = step * 4;
  return def.cap ? Math.min(def.cap, top) : top;
}

/** The x range: the last WINDOW_S seconds up to the newest sample. */
function timeScale(width) {
  const tEnd = history.length ? history[history.length - 1].t : Date.now() / 1000;
  const tStart = tEnd - WINDOW_S;
  const x0 = PAD.left;
  const x1 = width - PAD.right;
  return { tEnd, tStart, x0, x1, x: (t) => x0 + ((t - tStart) / WINDOW_S) * (x1 - x0) };
}

function drawChart(chart) {
  const { def, svg } = chart;
  const width = Math.max(260, Math.round(svg.getBoundingClientRect().width) || 560);
  svg.setAttribute("viewBox", `0 0 ${width} ${CHART_H}`);
  const ts = timeScale(width);
  const y0 = CHART_H - PAD.bottom;
  const y1 = PAD.top;
  let hi = 0;
  for (const s of history) {
    for (const ser of chart.series) if (isNum(s.v[ser.key])) hi = Math.max(hi, s.v[ser.key]);
  }
  const top = yTop(def, hi);
  const y = (v) => y0 - (Math.min(v, top) / top) * (y0 - y1);

  const nodes = [...yGrid(def, top, y, ts), ...timeTicks(ts, y0)];
  for (const ser of chart.series) nodes.push(seriesNode(ser, ts, y));
  const hovered = hoverSample(chart);
  if (hovered) nodes.push(hoverMarks(chart, hovered, ts, y, y0, y1));
  svg.replaceChildren(...nodes);
  drawLegend(chart, hovered, ts);
}

function yGrid(def, top, y, ts) {
  const nodes = [];
  for (let i = 0; i <= 4; i += 1) {
    const v = (top * i) / 4;
    const yy = y(v).toFixed(1);
    nodes.push(svgEl("line", { class: i ? "grid" : "axis", x1: ts.x0, x2: ts.x1, y1: yy, y2: yy }));
    nodes.push(svgEl("text", { class: "ylab", x: ts.x0 - 6, y: Number(yy) + 3.5, text: def.fmt(v) }));
  }
  return nodes;
}

function timeTicks(ts, y0) {
  const nodes = [];
  for (let m = WINDOW_S / 60; m >= 0; m -= 1) {
    const x = ts.x(ts.tEnd - m * 60).toFixed(1);
    const anchor = m === WINDOW_S / 60 ? "start" : m === 0 ? "end" : "middle";
    nodes.push(svgEl("line", { class: "tick", x1: x, x2: x, y1: y0, y2: y0 + 4 }));
    nodes.push(svgEl("text", { class: "xlab", x, y: y0 + 15, "text-anchor": anchor, text: m ? `-${m}m` : "now" }));
  }
  return nodes;
}

/** A <g> of polylines: a null value or a hole in time ends a run, so a gap shows as a gap. */
function seriesNode(ser, ts, y) {
  const g = svgEl("g", { class: "series", "data-series": ser.label, stroke: ser.colour });
  let run = [];
  let prevT = null;
  const flush = () => {
    // A lone point still shows: a zero-length line with round caps is a dot.
    if (run.length === 1) run.push(run[0]);
    if (run.length) g.append(svgEl("polyline", { points: run.join(" ") }));
    run = [];
  };
  for (const s of history) {
    const v = s.v[ser.key];
    if (prevT !== null && s.t - prevT > BREAK_S) flush();
    prevT = s.t;
    if (!isNum(v) || s.t < ts.tStart) {
      flush();
      continue;
    }
    run.push(`${ts.x(s.t).toFixed(1)},${y(v).toFixed(1)}`);
  }
  flush();
  return g;
}

function hoverChart(chart, event) {
  const rect = chart.svg.getBoundingClientRect();
  if (!rect.width) return;
  const width = Math.max(260, Math.round(rect.width));
  const ts = timeScale(width);
  const x = ((event.clientX - rect.left) / rect.width) * width;
  chart.hoverT = ts.tStart + ((x - ts.x0) / (ts.x1 - ts.x0)) * WINDOW_S;
  drawChart(chart);
}

/** The sample nearest to the pointer, or null when the pointer is not over the chart. */
function hoverSample(chart) {
  if (chart.hoverT == null || !history.length) return null;
  let best = null;
  for (const s of history) {
    if (!best || Math.abs(s.t - chart.hoverT) < Math.abs(best.t - chart.hoverT)) best = s;
  }
  return Math.abs(best.t - chart.hoverT) <= BREAK_S ? best : null;
}

function hoverMarks(chart, sample, ts, y, y0, y1) {
  const x = ts.x(sample.t).toFixed(1);
  const g = svgEl("g", { class: "hover" }, svgEl("line", { x1: x, x2: x, y1, y2: y0 }));
  for (const ser of chart.series) {
    const v = sample.v[ser.key];
    if (isNum(v)) g.append(svgEl("circle", { cx: x, cy: y(v).toFixed(1), r: 3, fill: ser.colour }));
  }
  return g;
}

function drawLegend(chart, hovered, ts) {
  const sample = hovered ?? history[history.length - 1];
  const items = chart.series.map((ser) => el(
    "span",
    { class: "item", title: ser.label },
    el("i", { class: "swatch", style: `background:${ser.colour}` }),
    el("span", { class: "name", text: ser.label }),
    el("b", { class: "num", text: chart.def.fmt(sample?.v[ser.key]) }),
  ));
  if (hovered) items.push(el("span", { class: "at", text: `at -${fmtDuration(ts.tEnd - hovered.t)}` }));
  chart.legend.replaceChildren(...items);
}

/**
 * Colours follow a name while it stays on the chart (a topic keeps its colour when the order of
 * the busiest changes); a name that leaves frees its colour.
 */
function assignColours(chart, series) {
  const keep = new Set(series.map((s) => s.key));
  for (const key of chart.colours.keys()) if (!keep.has(key)) chart.colours.delete(key);
  for (const s of series) {
    if (!chart.colours.has(s.key)) {
      const used = new Set(chart.colours.values());
      chart.colours.set(s.key, PALETTE.find((c) => !used.has(c)) ?? PALETTE[PALETTE.length - 1]);
    }
    s.colour = chart.colours.get(s.key);
  }
  return series;
}

// The charts: name (data-chart), title, value format and which series of the samples to draw.
const rateAxis = { fmt: fmtRate, minTop: 1 };
const msAxis = { fmt: fmtMs, minTop: 0.001 };
const CHART_DEFS = [
  { name: "throughput", title: "Deliveries and publishes", ...rateAxis,
    series: () => [{ key: "delivered", label: "deliveries/s" }, { key: "published", label: "publishes/s" }] },
  { name: "cycle-latency", title: "Cycle time", ...msAxis,
    series: () => [{ key: "cycleP50", label: "p50" }, { key: "cycleP99", label: "p99" }] },
  { name: "publish-latency", title: "Publish to frame", ...msAxis,
    series: () => [{ key: "ptfP50", label: "p50" }, { key: "ptfP99", label: "p99" }] },
  { name: "sessions", title: "Sessions", fmt: fmtNum, minTop: 4, integer: true,
    series: () => [{ key: "connected", label: "connected" }, { key: "detached", label: "detached" }] },
  { name: "capacity", title: "Intake fill and pool use", fmt: fmtPct, minTop: 4, cap: 100,
    series: () => [{ key: "intake", label: "intake fill" }, { key: "pool", label: "pool blocks in use" }] },
  { name: "topics", title: `Busiest topics (top ${TOP_TOPICS})`, ...rateAxis,
    series: (tot) => [...tot.topics.byName]
      .sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))
      .slice(0, TOP_TOPICS)
      .map(([name]) => ({ key: `topic:${name}`, label: name })),
    empty: (tot) => (tot.topics.byName.size ? null : "no topic published yet") },
  { name: "queues", title: "Queue depths", fmt: fmtNum, minTop: 4, integer: true,
    series: (tot) => [
      ...tot.queues.slice(0, MAX_QUEUE_SERIES).map((q) => ({ key: `queue:${q.name}`, label: `${q.name} waiting` })),
      { key: "unacked", label: "unacked (all)" },
    ],
    empty: (tot) => (tot.queues.length ? null : "no queue topics") },
  { name: "slow-clients", title: "Slow clients", ...rateAxis,
    series: () => [
      { key: "blocked", label: "blocked writes/s" },
      { key: "failed", label: "failed sends/s" },
      { key: "naks", label: "NAKs received/s" },
    ] },
];

function updateChart(chart, tot) {
  const emptyText = chart.def.empty?.(tot) ?? null;
  chart.note.hidden = !emptyText;
  chart.note.textContent = emptyText ?? "";
  chart.svg.style.display = emptyText ? "none" : "";
  chart.series = assignColours(chart, chart.def.series(tot));
  if (emptyText) chart.legend.replaceChildren();
  else drawChart(chart);
}

// ---------------------------------------------------------------------------------------------
// Tiles: the current value of the things an operator looks at first.

function createTile(name, label) {
  const value = el("div", { class: "value num", text: "–" });
  const sub = el("div", { class: "sub" });
  const root = el("div", { class: "card tile", "data-tile": name }, el("div", { class: "label", text: label }), value, sub);
  return {
    root,
    set(v, detail = "", level = "") {
      value.textContent = v;
      sub.textContent = detail;
      root.dataset.level = level;
    },
  };
}

const TILE_DEFS = [
  ["sessions", "Sessions"], ["subscriptions", "Subscriptions"], ["topics", "Topics"],
  ["deliveries", "Deliveries"], ["frames", "Frames"], ["publishes", "Publishes"],
  ["sent", "Sent"], ["compression", "Saved by compression"], ["intake", "Intake fill"],
  ["pool", "Pool blocks"], ["gaps", "GAPs"], ["slow-closes", "Slow-consumer closes"],
  ["errors", "Errors"],
];

/** "shared 10 · private 1": the parts of a total, in the server's order. */
const parts = (o, names = {}) =>
  Object.entries(o).map(([k, v]) => `${names[k] ?? k} ${fmtNum(v)}`).join(" · ");

/** Join the non-empty pieces of a tile's detail line. */
const detail = (...pieces) => pieces.filter(Boolean).join(" · ");

/** "warn" or "bad" past the thresholds: the tile gets a coloured edge. */
const level = (value, warnAt, badAt = Infinity) => (value >= badAt ? "bad" : value >= warnAt ? "warn" : "");

function updateTiles(tiles, tot) {
  updateLoadTiles(tiles, tot);
  updateTrafficTiles(tiles, tot);
  updateCapacityTiles(tiles, tot);
  updateTroubleTiles(tiles, tot);
}

/** Sessions, subscriptions, topics: how much the server holds. */
function updateLoadTiles(tiles, tot) {
  const connectedBy = Object.entries(tot.sessionsBy).map(([t, s]) => [t, num(s.connected)]);
  tiles.sessions.set(
    fmtCount(num(tot.sessions.connected)),
    detail(parts(Object.fromEntries(connectedBy), { websocket: "ws", longpoll: "long-poll" }),
      `detached ${fmtNum(num(tot.sessions.detached))}`),
  );
  tiles.subscriptions.set(fmtCount(sum(Object.values(tot.subscriptions))), parts(tot.subscriptions));
  tiles.topics.set(fmtCount(sum(Object.values(tot.topicsCount))), parts(tot.topicsCount));
}

/** Deliveries, frames, publishes, bytes: how much flows. */
function updateTrafficTiles(tiles, tot) {
  const r = tot.rate;
  tiles.deliveries.set(fmtRate(r("messages_delivered")),
    detail(`opened ${fmtRate(r("sessions_opened"))}`, `resumed ${fmtRate(r("sessions_resumed"))}`));
  // Messages per frame says how well the cycle batches: 1 means no batching at all.
  const perFrame = r("frames") > 0 ? r("messages_delivered") / r("frames") : null;
  tiles.frames.set(fmtRate(r("frames")),
    detail(`cycles ${fmtRate(r("cycles"))}`, isNum(perFrame) && `${fmtNum(perFrame)} msgs/frame`));
  tiles.publishes.set(fmtRate(r("published_messages")),
    detail(`intake refused ${fmtRate(r("intake_refused"))}`, `conflated ${fmtRate(r("intake_conflated"))}`),
    r("intake_refused") > 0 ? "warn" : "");
  tiles.sent.set(fmtByteRate(r("sent_bytes")), `total ${fmtBytes(num(tot.counters.sent_bytes))}`);
  const saved = r("compression_saved_bytes");
  const share = saved > 0 ? (100 * saved) / (saved + r("sent_bytes")) : null;
  tiles.compression.set(fmtByteRate(saved), detail(
    isNum(share) && `${fmtPct(share)} of payload`,
    `kept ${fmtNum(num(tot.counters.compressions_kept))}`,
    `discarded ${fmtNum(num(tot.counters.compressions_discarded))}`,
  ));
}

/** Intake and pool: how close the server is to refusing work. */
function updateCapacityTiles(tiles, tot) {
  const r = tot.rate;
  tiles.intake.set(fmtPct(tot.intakeFill), detail(
    `${fmtNum(num(tot.gauges.intake_messages))} msgs`,
    fmtBytes(num(tot.gauges.intake_bytes)),
    tot.ws.length > 1 && "worst worker",
  ), level(num(tot.intakeFill), 70, 95));
  const { block, large } = tot.pool;
  const used = block.limit > 0 ? (100 * num(block.in_use)) / block.limit : 0;
  tiles.pool.set(`${fmtCount(num(block.in_use))} / ${fmtCount(num(block.limit))}`, detail(
    `peak ${fmtNum(num(block.peak))}`,
    `large ${fmtNum(num(large.in_use))}/${fmtNum(num(large.limit))}`,
    `exhausted ${fmtRate(r("pool_exhausted"))}`,
  ), r("pool_refused") > 0 ? "bad" : level(used, 70, 90) || (r("pool_exhausted") > 0 ? "warn" : ""));
}

/** GAPs, slow-consumer closes, errors: what is going wrong for clients. */
function updateTroubleTiles(tiles, tot) {
  const r = tot.rate;
  const { counters, gauges } = tot;
  tiles.gaps.set(fmtRate(r("gaps")), `deferred ${fmtRate(r("deferred_messages"))}`, r("gaps") > 0 ? "warn" : "");
  const blocked = num(counters.slow_consumer_closes_blocked);
  const backlog = num(counters.slow_consumer_closes_backlog);
  tiles["slow-closes"].set(fmtCount(blocked + backlog), detail(
    `blocked ${fmtNum(blocked)}`,
    `backlog ${fmtNum(backlog)}`,
    `paced ${fmtNum(num(gauges.sessions_paced))}`,
    `penalised ${fmtNum(num(gauges.sessions_penalised))}`,
  ), r("slow_consumer_closes_blocked") + r("slow_consumer_closes_backlog") > 0 ? "warn" : "");
  // The tile counts what clients got; refusals of the HTTP API are listed in the table only.
  const protocol = tot.errors.filter((e) => e.kind !== "api");
  const refusals = sum(tot.errors.filter((e) => e.kind === "api").map((e) => e.rate));
  const errRate = tot.rates ? sum(protocol.map((e) => e.rate)) : null;
  tiles.errors.set(fmtRate(errRate), detail(
    `${fmtCount(sum(protocol.map((e) => e.count)))} since start`,
    refusals > 0 && `API refused ${fmtRate(refusals)}`,
  ), errRate > 0 ? "warn" : "");
}

// ---------------------------------------------------------------------------------------------
// Tables

/** A cell: plain text, or {text, cls} (cls "dim" greys out a zero so the eye finds the rest). */
function createTable(name, title, columns, emptyText, wide = false) {
  const tbody = el("tbody");
  const count = el("span", { class: "count" });
  const root = el(
    "section",
    { class: `card table${wide ? " wide" : ""}`, "data-table": name },
    el("header", {}, el("h3", { text: title }), count),
    el("div", { class: "scroll" }, el("table", {},
      el("thead", {}, el("tr", {}, ...columns.map((c) => el("th", { class: c.num ? "n" : null, text: c.label })))),
      tbody)),
  );
  return {
    root,
    update(rows, total = rows.length) {
      count.textContent = total > rows.length ? `${rows.length} of ${total}` : total ? String(total) : "";
      if (!rows.length) {
        tbody.replaceChildren(el("tr", {}, el("td", { class: "empty", colspan: columns.length, text: emptyText })));
        return;
      }
      tbody.replaceChildren(...rows.map((cells) => el("tr", {}, ...cells.map((cell, i) => {
        const c = typeof cell === "object" && cell ? cell : { text: cell };
        const cls = [columns[i].num ? "n num" : "", c.cls ?? ""].join(" ").trim() || null;
        return el("td", { class: cls, title: c.title, text: c.text });
      }))));
    },
  };
}

/** Zero shown as a dim dash: in a table of mostly zeros the non-zero values stand out. */
const cell = (v, fmt) => (num(v) === 0 ? { text: "–", cls: "dim" } : fmt(v));

function createTables() {
  const n = true;
  return {
    slowest: createTable("slowest", "Slowest sessions", [
      { label: "session" }, { label: "worker" }, { label: "transport" }, { label: "state" }, { label: "user" },
      { label: "blocked for", num: n }, { label: "failed sends", num: n }, { label: "hold left", num: n },
      { label: "NAK fill", num: n }, { label: "NAK interval", num: n }, { label: "backlog", num: n },
    ], "no slow sessions", true),
    queues: createTable("queues", "Queues", [
      { label: "name" }, { label: "waiting", num: n }, { label: "unacked", num: n }, { label: "consumers", num: n },
      { label: "enqueued/s", num: n }, { label: "acked/s", num: n }, { label: "redelivered", num: n },
      { label: "dead-lettered", num: n }, { label: "revoked", num: n },
    ], "no queue topics", true),
    topics: createTable("topics", "Busiest topics", [
      { label: "name" }, { label: "mode" }, { label: "subscribers", num: n }, { label: "msgs/s", num: n },
      { label: "seq", num: n }, { label: "worker" },
    ], "no topic published yet"),
    errors: createTable("errors", "Errors", [
      { label: "kind" }, { label: "code" }, { label: "count", num: n }, { label: "per s", num: n },
    ], "no errors"),
  };
}

function updateTables(tables, tot) {
  const slow = tot.slowest.slice(0, TABLE_ROWS);
  tables.slowest.update(slow.map((s) => [
    { text: str(s.session), cls: "mono" }, { text: str(s.worker), cls: "mono" }, str(s.transport), str(s.state),
    s.user == null ? { text: "–", cls: "dim" } : str(s.user),
    cell(s.blocked_for, fmtMs), cell(s.failed_sends, fmtCount), cell(s.held_for, fmtMs),
    cell(s.nak_fill, (v) => fmtPct(num(v))), cell(s.nak_interval, fmtMs), cell(s.backlog, fmtCount),
  ]), tot.slowest.length);

  const topics = tot.topics.rows.slice(0, TABLE_ROWS);
  tables.topics.update(topics.map((t) => [
    { text: str(t.name), cls: "mono" }, str(t.mode), fmtCount(num(t.subscribers)), fmtNum(num(t.rate)),
    fmtCount(num(t.seq)), { text: str(t.worker), cls: "mono" },
  ]), tot.topics.rows.length);

  tables.queues.update(tot.queues.slice(0, TABLE_ROWS).map((q) => [
    { text: q.name, cls: "mono", title: q.workers.join(", ") }, fmtCount(q.waiting), fmtCount(q.outstanding),
    fmtCount(q.consumers), fmtNum(num(q.rates.enqueued)), fmtNum(num(q.rates.acked)),
    cell(q.redelivered, fmtCount), cell(q.dead_lettered, fmtCount), cell(q.revoked, fmtCount),
  ]), tot.queues.length);

  tables.errors.update(tot.errors.slice(0, TABLE_ROWS).map((e) => [
    e.kind,
    { text: e.kind === "api" ? e.name : `${str(e.code)} ${e.name}`.trim(), cls: "mono" },
    fmtCount(e.count),
    cell(e.rate, fmtNum),
  ]), tot.errors.length);
}

// ---------------------------------------------------------------------------------------------
// Header: title, workers, last update, status.

const uptime = (s) => (isNum(s.time) && isNum(s.started) ? fmtDuration(s.time - s.started) : "–");

function updateWorkers(container, data) {
  const interval = num(data.interval) || 1;
  const chips = [...workers.values()]
    .sort((a, b) => Number(b.self) - Number(a.self) || a.id.localeCompare(b.id))
    .map((w) => {
      const s = w.snap;
      // A snapshot much older than the answer: that worker has stopped writing (hung or dying).
      const lagging = num(data.time) - num(s.time) > 3 * interval + 1;
      return el(
        "div",
        { class: `worker${lagging ? " lagging" : ""}`, "data-worker": w.id, title: `version ${str(s.version)}` },
        el("b", { class: "mono", text: w.id }),
        el("span", { text: `${str(s.host)} · pid ${str(s.pid)} · up ${uptime(s)}` }),
        w.self && el("span", { class: "badge self", text: "this worker" }),
        lagging && el("span", { class: "badge late", text: `no update for ${fmtDuration(num(data.time) - num(s.time))}` }),
      );
    });
  container.replaceChildren(...chips);
}

const status = { lastOkMs: 0, problem: null };

function showProblem(message) {
  status.problem = message;
  refreshStatus();
}

function refreshStatus() {
  const { statusText, statusWrap, banner, updated } = ui;
  const old = status.lastOkMs && Date.now() - status.lastOkMs > STALE_MS;
  const state = status.problem ? "error" : !status.lastOkMs || old ? "stale" : "live";
  statusText.textContent = state;
  statusText.dataset.status = state;
  statusWrap.dataset.state = state;
  document.body.dataset.state = state;
  banner.hidden = !status.problem;
  banner.textContent = status.problem ?? "";
  if (status.lastOkMs) {
    const ago = Math.round((Date.now() - status.lastOkMs) / 1000);
    updated.textContent = `updated ${fmtClock(status.lastOkMs)}${ago >= 3 ? ` (${fmtDuration(ago)} ago)` : ""}`;
  } else {
    updated.textContent = status.problem ? "no data yet" : "connecting…";
  }
  document.title = state === "live" ? "rubris ops" : `rubris ops (${state})`;
}

// ---------------------------------------------------------------------------------------------
// Building the page

const STYLE = `
:root { --bg:#f3f5f8; --card:#fff; --fg:#18212d; --muted:#687385; --line:#e3e7ed; --grid:#edf0f4;
  --ok:#16a34a; --warn:#d97706; --bad:#dc2626; --hover:#f6f8fb; color-scheme: light dark;
  font: 13px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", sans-serif; }
@media (prefers-color-scheme: dark) {
  :root { --bg:#0e1319; --card:#161d26; --fg:#e4e8ee; --muted:#94a0b2; --line:#263140; --grid:#1f2833; --hover:#1b2430; }
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg); }
.num { font-variant-numeric: tabular-nums; }
.mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
.top { position: sticky; top: 0; z-index: 2; background: var(--card); border-bottom: 1px solid var(--line);
  padding: 10px 20px; display: flex; flex-wrap: wrap; align-items: center; gap: 8px 18px; }
.top h1 { margin: 0; font-size: 17px; font-weight: 700; letter-spacing: -0.01em; }
.status { display: inline-flex; align-items: center; gap: 7px; font-weight: 600; }
.status .dot { width: 10px; height: 10px; border-radius: 50%; background: var(--muted); }
.status[data-state=live] .dot { background: var(--ok); box-shadow: 0 0 0 3px color-mix(in srgb, var(--ok) 22%, transparent); }
.status[data-state=live] { color: var(--ok); }
.status[data-state=stale] .dot { background: var(--warn); }
.status[data-state=stale] { color: var(--warn); }
.status[data-state=error] .dot { background: var(--bad); }
.status[data-state=error] { color: var(--bad); }
.updated { color: var(--muted); }
.workers { display: flex; flex-wrap: wrap; gap: 6px; flex-basis: 100%; }
.worker { display: inline-flex; gap: 8px; align-items: center; padding: 3px 10px; border: 1px solid var(--line);
  border-radius: 999px; color: var(--muted); background: var(--bg); }
.worker b { color: var(--fg); font-weight: 600; white-space: nowrap; }
.worker.lagging { border-color: var(--warn); }
.badge { white-space: nowrap; font-size: 11px; padding: 0 7px; border-radius: 999px; font-weight: 600; }
.badge.self { background: color-mix(in srgb, #2563eb 14%, transparent); color: #2563eb; }
.badge.late { background: color-mix(in srgb, var(--warn) 16%, transparent); color: var(--warn); }
.banner { margin: 12px 20px 0; padding: 10px 14px; border-radius: 8px; font-weight: 600;
  background: color-mix(in srgb, var(--bad) 10%, var(--card)); color: var(--bad); border: 1px solid color-mix(in srgb, var(--bad) 35%, transparent); }
main { padding: 14px 20px 28px; display: grid; gap: 14px; }
h2 { margin: 6px 0 -4px; font-size: 11.5px; font-weight: 700; text-transform: uppercase; letter-spacing: .06em; color: var(--muted); }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 10px; min-width: 0; }
.tiles { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(170px, 100%), 1fr)); gap: 10px; }
.tile { padding: 10px 12px 11px; border-left: 3px solid transparent; }
.tile[data-level=warn] { border-left-color: var(--warn); }
.tile[data-level=bad] { border-left-color: var(--bad); }
.tile .label { color: var(--muted); font-size: 11.5px; font-weight: 600; text-transform: uppercase; letter-spacing: .04em; }
.tile .value { font-size: 23px; font-weight: 650; margin: 2px 0 1px; white-space: nowrap; letter-spacing: -0.01em; }
.tile .sub { color: var(--muted); font-size: 11.5px; }
/* Figures that are no longer current fade, so nobody acts on them as if they were. */
body[data-state=stale] main .value, body[data-state=error] main .value,
body[data-state=stale] .plot .series, body[data-state=error] .plot .series { opacity: .45; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(420px, 100%), 1fr)); gap: 12px; }
.chart { padding: 10px 12px 6px; }
.chart header, .table header { display: flex; flex-wrap: wrap; align-items: baseline; gap: 4px 14px; margin-bottom: 4px; }
h3 { margin: 0; font-size: 13.5px; font-weight: 650; }
.legend { display: flex; flex-wrap: wrap; gap: 2px 12px; font-size: 12px; color: var(--muted); min-width: 0; }
.legend .item { display: inline-flex; align-items: center; gap: 5px; max-width: 100%; }
.legend .name { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; max-width: 160px; }
.legend b { color: var(--fg); font-weight: 600; }
.legend .at { font-style: italic; }
.swatch { display: inline-block; width: 10px; height: 3px; border-radius: 2px; }
.plot { display: block; width: 100%; height: ${CHART_H}px; overflow: visible; touch-action: none; }
.plot .grid { stroke: var(--grid); }
.plot .axis, .plot .tick { stroke: var(--line); }
.plot text { fill: var(--muted); font-size: 10.5px; font-variant-numeric: tabular-nums; }
.plot .ylab { text-anchor: end; }
.plot .series { fill: none; stroke-width: 1.8; stroke-linejoin: round; stroke-linecap: round; }
.plot .hover line { stroke: var(--muted); stroke-dasharray: 3 3; }
.note { color: var(--muted); padding: 28px 0; text-align: center; }
.tables { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(560px, 100%), 1fr)); gap: 12px; }
.table { padding: 10px 12px; }
.table.wide { grid-column: 1 / -1; }
.table .count { color: var(--muted); font-size: 12px; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 12.5px; }
th { text-align: left; color: var(--muted); font-weight: 600; font-size: 11.5px; padding: 5px 8px; border-bottom: 1px solid var(--line); white-space: nowrap; }
td { padding: 4px 8px; border-bottom: 1px solid var(--grid); white-space: nowrap; max-width: 260px; overflow: hidden; text-overflow: ellipsis; }
tbody tr:hover td { background: var(--hover); }
.n { text-align: right; }
.dim { color: var(--muted); opacity: .6; }
td.empty { color: var(--muted); text-align: center; padding: 14px; }
footer { color: var(--muted); font-size: 12px; padding: 0 20px 20px; }
`;

function buildPage() {
  const statusText = el("span", { "data-status": "stale", text: "stale" });
  const statusWrap = el("span", { class: "status", "data-state": "stale" }, el("span", { class: "dot" }), statusText);
  const updated = el("span", { class: "updated" });
  const workerList = el("div", { class: "workers" });
  const banner = el("div", { class: "banner", role: "alert", "data-message": "", hidden: true });
  const tiles = {};
  for (const [name, label] of TILE_DEFS) tiles[name] = createTile(name, label);
  const charts = CHART_DEFS.map(createChart);
  const tables = createTables();

  // An empty icon: otherwise the browser asks for /favicon.ico, and its 404 is a console error.
  document.head.append(el("style", { text: STYLE }), el("link", { rel: "icon", href: "data:," }));
  document.body.replaceChildren(
    el("header", { class: "top" }, el("h1", { text: "rubris ops" }), statusWrap, updated, workerList),
    banner,
    el("main", {},
      el("h2", { text: "Now" }),
      el("div", { class: "tiles" }, ...Object.values(tiles).map((t) => t.root)),
      el("h2", { text: "Last 5 minutes" }),
      el("div", { class: "charts" }, ...charts.map((c) => c.root)),
      el("h2", { text: "Details" }),
      el("div", { class: "tables" }, ...Object.values(tables).map((t) => t.root))),
    el("footer", { text: `Polls ${STATS_URL.pathname} every ${POLL_MS / 1000} s. Rates are per worker over its own snapshot interval, summed.` }),
  );
  return { statusText, statusWrap, updated, workerList, banner, tiles, charts, tables };
}

// ---------------------------------------------------------------------------------------------
// The poll loop

/** Run `fn`; a bug in the page shows on the page instead of escaping to the console. */
function guard(fn) {
  try {
    fn();
  } catch (err) {
    showProblem(`display error: ${err?.message ?? err}`);
  }
}

/** One request: the parsed JSON, or a message saying what went wrong. Never throws. */
async function fetchStats() {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
  try {
    const response = await fetch(STATS_URL, { cache: "no-store", signal: abort.signal });
    if (response.status === 401 || response.status === 403) {
      return { problem: `not authorised (${response.status}): reload and sign in` };
    }
    if (!response.ok) return { problem: `server answered HTTP ${response.status}, retrying` };
    const data = await response.json().catch(() => null);
    if (!data || typeof data !== "object" || !Array.isArray(data.workers)) {
      return { problem: "unexpected answer from the server, retrying" };
    }
    return { data };
  } catch (err) {
    return { problem: err?.name === "AbortError" ? "server not answering, retrying" : "server unreachable, retrying" };
  } finally {
    clearTimeout(timer);
  }
}

function render(data) {
  const nowMs = Date.now();
  observeWorkers(data.workers, nowMs);
  const tot = computeTotals(nowMs);
  recordSample(tot, nowMs);
  updateWorkers(ui.workerList, data);
  updateTiles(ui.tiles, tot);
  for (const chart of ui.charts) updateChart(chart, tot);
  updateTables(ui.tables, tot);
}

const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

async function pollForever() {
  for (;;) {
    const started = performance.now();
    const { data, problem } = await fetchStats();
    if (data) {
      status.lastOkMs = Date.now();
      status.problem = null;
      guard(() => render(data));
    } else {
      status.problem = problem;
    }
    guard(refreshStatus);
    // Keep a steady 1 s cadence whatever the request took.
    await sleep(Math.max(100, POLL_MS - (performance.now() - started)));
  }
}

const ui = buildPage();
refreshStatus();
// Empty axes until the first answer: the layout does not jump when data arrive.
for (const chart of ui.charts) guard(() => drawChart(chart));
// The status ("stale", "n s ago") must move even while a request hangs.
setInterval(() => guard(refreshStatus), 1000);
// Charts are drawn at the width of their card: redraw when the window changes size.
window.addEventListener("resize", () => guard(() => {
  for (const chart of ui.charts) if (chart.svg.style.display !== "none") drawChart(chart);
}));
pollForever().catch((err) => showProblem(`polling stopped: ${err?.message ?? err}`));

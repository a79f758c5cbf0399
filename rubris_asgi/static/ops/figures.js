// rubris ops page: what the polls mean. Each worker's newest snapshot and the rates diffed from
// the one before, then the totals of one poll across workers.
//
//   - every worker writes its own snapshot; counters are monotonic since that worker started, so
//     rates come from diffing two snapshots OF THE SAME WORKER, over that worker's own `time`;
//   - the totals on the page are sums of the per-worker rates and gauges, and quantiles of the
//     per-worker histogram deltas added up.
//
// The server's history (history.js) goes through the same functions, so the charts' first five
// minutes are computed exactly as the live figures are.

import { dict, isNum, list, num, str, sum } from "./format.js";

export const POLL_MS = 1000;
const WORKER_TTL_MS = 5000; // a worker missing from the answers this long is forgotten

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
export const workers = new Map();

export function observeWorkers(snapshots, nowMs) {
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
  // A sample of the server's history (history.js) has no error or queue counters: diffing the
  // first live snapshot against it would make every count since start one second's worth.
  if (!prev.fromHistory) {
    w.errorRates = keyedRates(errorEntries(prev), errorEntries(snap), errorKey, ["count"], dt);
    w.queueRates = keyedRates(prev.queues, snap.queues, (q) => str(q.name), QUEUE_COUNTERS, dt);
  }
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
export function quantile(q, bounds, counts) {
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

export function computeTotals(nowMs) {
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
    // Publish to frame, apart by transport: long-poll's includes the wait for the client's polls.
    ptf: histogramQuantiles(ws, "publish_to_frame_seconds"),
    lp: histogramQuantiles(ws, "longpoll_publish_to_frame_seconds"),
    lpReady: histogramQuantiles(ws, "longpoll_ready_to_frame_seconds"),
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

// rubris ops page: the samples the charts draw, the last five minutes of them.
//
// One sample per good poll (`recordSample`), at most HISTORY. So that the charts do not start
// empty, the page's first request asks for the server's history (`stats?history=1`,
// rubris_asgi/history.py): each worker keeps one sample a second of the last five minutes,
// whether or not a page was open, shaped like a snapshot cut down to what the charts need.
// `replayHistory` feeds those samples, a second at a time and in time order, through the very
// functions the live snapshots go through (observeWorkers, computeTotals, recordSample), so the
// history is summed across workers and turned into rates and quantiles exactly as the live
// figures are; the live polls then carry on from the last sample.

import { computeTotals, observeWorkers, POLL_MS } from "./figures.js";
import { dict, isNum, list, num, sum } from "./format.js";

export const HISTORY = 300; // points kept per series: 5 minutes at 1 s
export const WINDOW_S = (HISTORY * POLL_MS) / 1000;

/** @type {{t: number, v: object}[]}  t: page clock in seconds; v: series key -> value or null */
export const history = [];

export function recordSample(tot, nowMs) {
  const v = dict();
  v.delivered = tot.rate("messages_delivered");
  v.published = tot.rate("published_messages");
  v.cycleP50 = tot.cycle.p50;
  v.cycleP99 = tot.cycle.p99;
  v.ptfP50 = tot.ptf.p50;
  v.ptfP99 = tot.ptf.p99;
  v.lpP50 = tot.lp.p50;
  v.lpP99 = tot.lp.p99;
  v.lpReadyP99 = tot.lpReady.p99;
  v.connected = num(tot.sessions.connected);
  v.detached = num(tot.sessions.detached);
  v.longpoll = tot.sessionsBy.longpoll ? sum(Object.values(tot.sessionsBy.longpoll)) : 0;
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

/** Whether any sample still on the charts has a value for `key`. */
export const hasValues = (key) => history.some((s) => isNum(s.v[key]));

/**
 * Draw the server's history (the `history` part of the first answer) as if the page had been
 * polling all along. `serverTime` is the answer's `time` and `nowMs` the page clock when it came:
 * the server's clock is mapped onto the page's, so history and live samples share the time axis
 * whatever the two clocks say. Returns the number of samples replayed.
 */
export function replayHistory(h, serverTime, nowMs) {
  if (!h || typeof h !== "object" || !isNum(serverTime)) return 0;
  const interval = num(h.interval) > 0 ? h.interval : POLL_MS / 1000;
  const bounds = h.bounds && typeof h.bounds === "object" ? h.bounds : {};
  const offsetMs = nowMs - serverTime * 1000;
  let slot = null;
  let atMs = 0;
  let replayed = 0;
  // A worker's samples and the others' fall in the same second: their totals are taken once
  // per second, after all of them, as one poll would see them.
  const close = () => recordSample(computeTotals(atMs), atMs);
  for (const raw of list(h.samples)) {
    if (!raw || typeof raw !== "object" || !isNum(raw.time) || typeof raw.worker !== "string") continue;
    if (raw.time > serverTime) continue; // not before the live answer it leads up to
    const s = Math.floor(raw.time / interval);
    if (slot !== null && s !== slot) close();
    slot = s;
    atMs = raw.time * 1000 + offsetMs;
    observeWorkers([expand(raw, bounds)], atMs);
    replayed += 1;
  }
  if (slot !== null) close();
  return replayed;
}

/** A history sample as a snapshot: its histograms' counts get their bounds back. */
function expand(raw, bounds) {
  const histograms = dict();
  for (const [name, counts] of Object.entries(raw.histograms ?? {})) {
    if (Array.isArray(counts) && Array.isArray(bounds[name])) {
      histograms[name] = { bounds: bounds[name], counts };
    }
  }
  return { ...raw, histograms, self: false, fromHistory: true };
}

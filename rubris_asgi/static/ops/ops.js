// rubris ops page: the browser side of `{mount}/ops`.
//
// ES modules, no build step, no dependencies. The server answers `{mount}/ops` with an empty HTML
// shell that loads this file; everything else (style, header, tiles, charts, tables) is built
// here. The page polls `{mount}/ops/stats` once a second (the JSON described in the project's
// "rubris ops: the stats JSON" contract); its first request asks for the server's history too,
// so the "last 5 minutes" charts open full. The modules, by concern:
//
//   format.js    value helpers and number formatting
//   dom.js       building elements from untrusted text
//   figures.js   per-worker state, rates diffed from snapshots, the totals of one poll
//   history.js   the samples the charts draw, and the server's history replayed into them
//   charts.js    the charts (inline SVG) and what each one measures
//   ops.js       tiles, tables, header, the page itself and the poll loop (this file)
//
// Everything the server sends (topic names, users, worker ids, hosts) is untrusted text: it only
// reaches the DOM through textContent and setAttribute, never innerHTML. Objects keyed by such
// names are Maps or prototype-less objects, so a topic called "__proto__" is just a topic.

import { CAPTIONS, CHART_DEFS, CHART_H, createChart, drawChart, updateChart } from "./charts.js";
import { el } from "./dom.js";
import { computeTotals, observeWorkers, POLL_MS, workers } from "./figures.js";
import {
  fmtByteRate, fmtBytes, fmtClock, fmtCount, fmtDuration, fmtMs, fmtNum, fmtPct, fmtRate, isNum, num, str,
  sum,
} from "./format.js";
import { recordSample, replayHistory } from "./history.js";

const STALE_MS = 3500; // no good answer for this long: the figures on screen are old
const FETCH_TIMEOUT_MS = 4000; // a hung request must not stop the polling
const TABLE_ROWS = 15;
const STATS_URL = new URL("stats", import.meta.url);
// The first answer also brings the server's last five minutes (history.js).
const HISTORY_URL = new URL("stats?history=1", import.meta.url);

// ---------------------------------------------------------------------------------------------
// Tiles: the current value of the things an operator looks at first.

function createTile(name, label, title) {
  const value = el("div", { class: "value num", text: "–" });
  const sub = el("div", { class: "sub" });
  const root = el("div", { class: "card tile", "data-tile": name, title },
    el("div", { class: "label", text: label }), value, sub);
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
  ["latency", "Publish to frame", `${CAPTIONS.websocket}\n\n${CAPTIONS.longpoll}`],
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
  updateLatencyTile(tiles, tot);
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

const BUDGET_S = 0.25; // the scheduler's publish-to-frame budget (docs/operations.md, "Alerts")

/**
 * Publish to frame: WebSocket's p99 is the server's latency. Long-poll's, when there are such
 * sessions, is shown beside it with the server's part of it, so that the difference explains
 * itself: the rest is the time messages waited for the client to poll (charts.js, CAPTIONS).
 */
function updateLatencyTile(tiles, tot) {
  const { ptf, lp, lpReady } = tot;
  const longpoll = sum(Object.values(tot.sessionsBy.longpoll ?? {})) > 0 || isNum(lp.p99);
  tiles.latency.set(fmtMs(ptf.p99), detail(
    `WebSocket p99 · p50 ${fmtMs(ptf.p50)}`,
    longpoll && `long-poll p99 ${fmtMs(lp.p99)} incl. waiting for polls, server's part ${fmtMs(lpReady.p99)}`,
  ), num(ptf.p99) > BUDGET_S || num(lpReady.p99) > BUDGET_S ? "warn" : "");
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
.caption { margin: 0 0 6px; color: var(--muted); font-size: 11.5px; line-height: 1.4; }
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
  for (const [name, label, title] of TILE_DEFS) tiles[name] = createTile(name, label, title);
  const charts = CHART_DEFS.map((def) => createChart(def, guard));
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
    el("footer", { text: `Polls ${STATS_URL.pathname} every ${POLL_MS / 1000} s. Rates are per worker over its own `
      + "snapshot interval, summed. The charts open with the server's last 5 minutes (one sample a second per "
      + "worker, kept whether or not a page is open)." }),
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
async function fetchStats(withHistory) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
  try {
    const url = withHistory ? HISTORY_URL : STATS_URL;
    const response = await fetch(url, { cache: "no-store", signal: abort.signal });
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
  // Before the first live figures: the charts' last five minutes, from the server.
  if (data.history) replayHistory(data.history, data.time, nowMs);
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
  let haveHistory = false;
  for (;;) {
    const started = performance.now();
    const { data, problem } = await fetchStats(!haveHistory);
    if (data) {
      haveHistory = true;
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

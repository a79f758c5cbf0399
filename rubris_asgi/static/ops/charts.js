// rubris ops page: the charts of the last five minutes. Inline SVG, one polyline per contiguous
// run of a series, drawn from scratch on every poll (a few hundred nodes; simpler and cheaper
// than diffing), from the samples of history.js.
//
// Every chart says what it measures in a caption under its title (and the same words as the
// title's tooltip): the latency figures especially, since "publish to frame" means something
// else for a long-poll session, which can only be sent a frame while one of its polls waits.
// docs/operations.md ("The operations page") has the same words.

import { el, svgEl } from "./dom.js";
import { fmtDuration, fmtMs, fmtNum, fmtPct, fmtRate, isNum, num, sum } from "./format.js";
import { hasValues, history, WINDOW_S } from "./history.js";

export const CHART_H = 200;
const BREAK_S = 2.5; // two points further apart than this are not joined: the hole is an outage
const TOP_TOPICS = 5;
const MAX_QUEUE_SERIES = 4;

// Distinct on light and dark backgrounds, and for the common colour-blindnesses first two.
const PALETTE = ["#2563eb", "#e8590c", "#0d9488", "#c026d3", "#ca8a04", "#64748b"];

const PAD = { left: 62, right: 12, top: 10, bottom: 22 };

/** A chart's card; `guard` runs its event handlers (a bug shows on the page, not the console). */
export function createChart(def, guard) {
  const svg = svgEl("svg", { class: "plot", height: CHART_H, role: "img", "aria-label": def.title });
  const legend = el("div", { class: "legend" });
  const note = el("div", { class: "note", hidden: true });
  const root = el(
    "section",
    { class: "card chart", "data-chart": def.name },
    el("header", {}, el("h3", { text: def.title, title: def.caption }), legend),
    el("p", { class: "caption", "data-caption": def.name, text: def.caption }),
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

export function drawChart(chart) {
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

// Long-poll's figure differs from WebSocket's by design (CAPTIONS.longpoll says why): its chart
// is there while long-poll sessions are, or were in the last five minutes.
const longpollSeen = (tot) => sum(Object.values(tot.sessionsBy.longpoll ?? {})) > 0
  || history.some((s) => num(s.v.longpoll) > 0) || hasValues("lpP99");

// What each chart measures: its caption and its title's tooltip (docs/operations.md says the same).
export const CAPTIONS = {
  throughput: "Messages put into frames a second (every kind: PUSH, ITEM, RESULT, GAP…), and "
    + "messages published to shared topics a second.",
  cycle: "How long one scheduler cycle takes (p50, p99 of each second's cycles). A cycle serves "
    + "every session with work once.",
  websocket: "WebSocket sessions: from a shared topic's publish (its arrival, through the intake) "
    + "to the frame handed to the socket. The server's own delay: the wait for a cycle and the "
    + "cycle. Sampled, up to 16 sessions a cycle.",
  longpoll: "Long-poll sessions. A frame goes out only while the client's poll waits, with one "
    + "message of each topic, so this includes waiting for the client's next polls, one per earlier "
    + "message of the same topic: it grows while a topic is published faster than the client polls. "
    + "Server's part: from the later of publish and poll arrival to the frame.",
  sessions: "Sessions connected now, and detached ones waiting to be resumed.",
  capacity: "Intake fill (outside publishes waiting for a cycle; the fullest worker) and the writer "
    + "pool's blocks in use.",
  topics: "Publishes a second of the busiest shared topics.",
  queues: "Items waiting in the deepest work queues, and items delivered but not yet acknowledged "
    + "(all queues).",
  slow: "Writes that found a socket full, those that took longer than blocked_after (each a "
    + "penalty), and NAKs from clients behind with their own processing.",
};

// The charts: name (data-chart), title, caption, value format and which series to draw.
const rateAxis = { fmt: fmtRate, minTop: 1 };
const msAxis = { fmt: fmtMs, minTop: 0.001 };
export const CHART_DEFS = [
  { name: "throughput", title: "Deliveries and publishes", caption: CAPTIONS.throughput, ...rateAxis,
    series: () => [{ key: "delivered", label: "deliveries/s" }, { key: "published", label: "publishes/s" }] },
  { name: "cycle-latency", title: "Cycle time", caption: CAPTIONS.cycle, ...msAxis,
    series: () => [{ key: "cycleP50", label: "p50" }, { key: "cycleP99", label: "p99" }] },
  { name: "publish-latency", title: "Publish to frame · WebSocket", caption: CAPTIONS.websocket, ...msAxis,
    series: () => [{ key: "ptfP50", label: "p50" }, { key: "ptfP99", label: "p99" }] },
  { name: "longpoll-latency", title: "Publish to frame · long-poll", caption: CAPTIONS.longpoll, ...msAxis,
    series: () => [
      { key: "lpP50", label: "p50" },
      { key: "lpP99", label: "p99" },
      { key: "lpReadyP99", label: "server's part p99" },
    ],
    empty: (tot) => (longpollSeen(tot) ? null : "no long-poll sessions in the last 5 minutes") },
  { name: "sessions", title: "Sessions", caption: CAPTIONS.sessions, fmt: fmtNum, minTop: 4, integer: true,
    series: () => [{ key: "connected", label: "connected" }, { key: "detached", label: "detached" }] },
  { name: "capacity", title: "Intake fill and pool use", caption: CAPTIONS.capacity, fmt: fmtPct, minTop: 4,
    cap: 100,
    series: () => [{ key: "intake", label: "intake fill" }, { key: "pool", label: "pool blocks in use" }] },
  { name: "topics", title: `Busiest topics (top ${TOP_TOPICS})`, caption: CAPTIONS.topics, ...rateAxis,
    series: (tot) => [...tot.topics.byName]
      .sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))
      .slice(0, TOP_TOPICS)
      .map(([name]) => ({ key: `topic:${name}`, label: name })),
    empty: (tot) => (tot.topics.byName.size ? null : "no topic published yet") },
  { name: "queues", title: "Queue depths", caption: CAPTIONS.queues, fmt: fmtNum, minTop: 4, integer: true,
    series: (tot) => [
      ...tot.queues.slice(0, MAX_QUEUE_SERIES).map((q) => ({ key: `queue:${q.name}`, label: `${q.name} waiting` })),
      { key: "unacked", label: "unacked (all)" },
    ],
    empty: (tot) => (tot.queues.length ? null : "no queue topics") },
  { name: "slow-clients", title: "Slow clients", caption: CAPTIONS.slow, ...rateAxis,
    series: () => [
      { key: "blocked", label: "blocked writes/s" },
      { key: "failed", label: "failed sends/s" },
      { key: "naks", label: "NAKs received/s" },
    ] },
];

export function updateChart(chart, tot) {
  const emptyText = chart.def.empty?.(tot) ?? null;
  chart.note.hidden = !emptyText;
  chart.note.textContent = emptyText ?? "";
  chart.svg.style.display = emptyText ? "none" : "";
  chart.series = assignColours(chart, chart.def.series(tot));
  if (emptyText) chart.legend.replaceChildren();
  else drawChart(chart);
}

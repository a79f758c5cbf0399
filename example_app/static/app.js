// Rubris Markets: the example app's live trading page.
//
// Everything on the page comes through one rubris client: snapshot topics prices.{symbol}
// (the watchlist), the ring topic `trades` (the tape), the keyed topic book.{symbol} (the order
// book: one entry per price level, its changes sent as PATCHes of their sizes), who else watches
// that book (its presence, book.{symbol}@presence), the user's positions (the keyed topic
// positions.{user}), the private topic `fills`, and the RPCs `symbols`,
// `place_order` and the streamed `history`. The tab also works jobs of the queue topic `reprice`
// (consume()), competing with other tabs and Python workers; it shows the ring `reprice.results`
// and the snapshot `reprice.stats`. The RPC `reprice_all` enqueues a job per symbol as one batch,
// whose progress the tab follows on `batch.{id}` (watchBatch()). The Spark pipeline
// (`python3 -m example_app.pipeline`) writes OHLC bars to the ring bars.{symbol}, drawn as candles
// of the selected symbol, and announces its catalog batches on the ring `pipeline.batches`.
//
// Messages update plain state; the DOM is painted at most once per animation frame, so a burst
// of hundreds of prices per second costs one layout per frame, not one per message.

import { ErrorCode, connect } from "/rubris/client.js";

// ?transport=longpoll or ?transport=websocket forces a transport (for demos and tests).
const wanted = new URLSearchParams(location.search).get("transport");
const transport = ["auto", "websocket", "longpoll"].includes(wanted) ? wanted : "auto";
// The demo's stand-in for a login: a name this browser keeps (a cookie, sent with the
// WebSocket's handshake and every long-poll), the user of its sessions. Two tabs of one browser
// are one user: one member of a book's presence, one set of positions.
function demoUser() {
  const found = document.cookie.match(/(?:^|; )demo_user=([a-z0-9-]{1,32})(?:;|$)/);
  if (found) return found[1];
  const name = `trader-${Math.random().toString(36).slice(2, 6)}`;
  document.cookie = `demo_user=${name}; path=/; max-age=31536000; SameSite=Lax`;
  return name;
}
const me = demoUser();
const client = connect("/rubris", { transport });
window.rubris = client; // for browser tests and the console

const TAPE_ROWS = 50;
const FILL_ROWS = 50;
const BOOK_LEVELS = 50;
const CHART_POINTS = 240;

const $ = (id) => document.getElementById(id);
const el = (tag, className, text) => {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
};

// ---- formatting ---------------------------------------------------------------------------

const priceFmt = new Intl.NumberFormat("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
const qtyFmt = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const isNum = (v) => typeof v === "number" && Number.isFinite(v);
const fmtPrice = (v) => (isNum(v) ? priceFmt.format(v) : "—");
const fmtQty = (v) => (isNum(v) ? qtyFmt.format(v) : "—");
const fmtSigned = (v, suffix = "") => (isNum(v) ? `${v > 0 ? "+" : ""}${priceFmt.format(v)}${suffix}` : "—");
const fmtTime = (ts) => {
  const d = new Date(isNum(ts) ? ts : Date.now());
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
};
const fmtBytes = (n) => {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KB`;
  if (n < 1024 ** 3) return `${(n / 1024 / 1024).toFixed(1)} MB`;
  return `${(n / 1024 ** 3).toFixed(2)} GB`;
};
const signClass = (v) => (v > 0 ? "up" : v < 0 ? "down" : "");

const css = getComputedStyle(document.documentElement);
const FLASH_UP = css.getPropertyValue("--up-flash").trim() || "rgba(31,191,143,.42)";
const FLASH_DOWN = css.getPropertyValue("--down-flash").trim() || "rgba(240,80,110,.42)";
const SOFT_UP = css.getPropertyValue("--up-bg").trim() || "rgba(31,191,143,.14)";
const SOFT_DOWN = css.getPropertyValue("--down-bg").trim() || "rgba(240,80,110,.14)";
const reducedMotion = matchMedia("(prefers-reduced-motion: reduce)").matches;

/**
 * Brief green/red background flash; the Web Animations API restarts it without a reflow.
 * Bid/ask flash softer than the last price, so the eye goes to trades rather than quote noise.
 */
function flash(cell, up, soft = false) {
  if (reducedMotion) return;
  const color = soft ? (up ? SOFT_UP : SOFT_DOWN) : (up ? FLASH_UP : FLASH_DOWN);
  cell.animate([{ backgroundColor: color }, { backgroundColor: "transparent" }],
    { duration: soft ? 450 : 700, easing: "ease-out" });
}

// ---- paint scheduling ---------------------------------------------------------------------

const dirtyQuotes = new Map(); // symbol → latest quote not yet painted
let pendingTrades = []; // newest last; never more than a tape's worth
let chartDirty = false;
let barsDirty = false;
let frameRequested = false;

function schedulePaint() {
  if (frameRequested) return;
  frameRequested = true;
  requestAnimationFrame(paint);
}

function paint() {
  frameRequested = false;
  paintQuotes();
  paintTrades();
  paintBook();
  if (chartDirty) paintChart();
  if (barsDirty) paintBars();
}

// ---- watchlist ----------------------------------------------------------------------------

const grid = $("grid");
const rows = new Map(); // symbol → {tr, cells, quote}
let selected = null;

function buildGrid(symbols) {
  const frag = document.createDocumentFragment();
  for (const { symbol, name } of symbols) {
    const tr = el("tr");
    tr.dataset.symbol = symbol;
    const cells = {
      sym: el("td", "sym", symbol),
      name: el("td", "name", name ?? ""),
      bid: el("td", "num bid", "—"),
      ask: el("td", "num ask", "—"),
      last: el("td", "num last", "—"),
      change: el("td", "num change", "—"),
      changePct: el("td", "num change-pct", "—"),
    };
    cells.name.title = name ?? "";
    tr.append(...Object.values(cells));
    frag.append(tr);
    rows.set(symbol, { tr, cells, quote: null });
  }
  grid.replaceChildren(frag);
  $("watch-count").textContent = `${symbols.length} instruments · click to select`;
}

grid.addEventListener("click", (ev) => {
  const tr = ev.target.closest("tr[data-symbol]");
  if (tr) selectSymbol(tr.dataset.symbol);
});

function paintQuotes() {
  for (const [symbol, q] of dirtyQuotes) {
    const row = rows.get(symbol);
    if (!row) continue;
    const prev = row.quote;
    const c = row.cells;
    c.bid.textContent = fmtPrice(q.bid);
    c.ask.textContent = fmtPrice(q.ask);
    c.last.textContent = fmtPrice(q.last);
    c.change.textContent = fmtSigned(q.change);
    c.changePct.textContent = fmtSigned(q.change_pct, "%");
    c.change.className = `num change ${signClass(q.change)}`;
    c.changePct.className = `num change-pct ${signClass(q.change_pct)}`;
    if (prev) {
      if (q.bid !== prev.bid && isNum(q.bid) && isNum(prev.bid)) flash(c.bid, q.bid > prev.bid, true);
      if (q.ask !== prev.ask && isNum(q.ask) && isNum(prev.ask)) flash(c.ask, q.ask > prev.ask, true);
      if (q.last !== prev.last && isNum(q.last) && isNum(prev.last)) {
        const up = q.last > prev.last;
        flash(c.last, up);
        c.last.classList.toggle("tick-up", up);
        c.last.classList.toggle("tick-down", !up);
      }
    }
    row.quote = q;
  }
  dirtyQuotes.clear();
}

function onQuote(symbol, q) {
  dirtyQuotes.set(symbol, q);
  if (symbol === selected && isNum(q.last)) {
    chart.live.push(q.last);
    if (chart.live.length > CHART_POINTS) chart.live.shift();
    chartDirty = true;
  }
  schedulePaint();
}

// ---- trades tape --------------------------------------------------------------------------

const tape = $("tape");

function paintTrades() {
  if (!pendingTrades.length) return;
  const frag = document.createDocumentFragment();
  // newest on top
  for (let i = pendingTrades.length - 1; i >= 0; i--) {
    const t = pendingTrades[i];
    const tr = el("tr");
    if (t.gap) {
      tr.className = "gap";
      const td = el("td", "", `${t.count} trade${t.count === 1 ? "" : "s"} missed (#${t.from}…)`);
      td.colSpan = 5;
      tr.append(td);
    } else {
      tr.dataset.id = String(t.id);
      tr.dataset.symbol = t.symbol;
      tr.dataset.side = t.side;
      if (t.symbol === selected) tr.className = "mine";
      tr.append(
        el("td", "", fmtTime(t.ts)),
        el("td", "sym", t.symbol),
        el("td", t.side === "sell" ? "side-sell" : "side-buy", t.side === "sell" ? "SELL" : "BUY"),
        el("td", "num", fmtQty(t.qty)),
        el("td", `num ${t.side === "sell" ? "down" : "up"}`, fmtPrice(t.price)),
      );
    }
    frag.append(tr);
  }
  pendingTrades = [];
  tape.prepend(frag);
  while (tape.rows.length > TAPE_ROWS) tape.lastElementChild.remove();
}

function queueTrade(item) {
  pendingTrades.push(item);
  // A hidden tab paints nothing; only the newest tape's worth can ever be shown.
  if (pendingTrades.length > TAPE_ROWS) pendingTrades.splice(0, pendingTrades.length - TAPE_ROWS);
  schedulePaint();
}

// ---- order book (a keyed topic) ----------------------------------------------------------

const book = $("book");
const bookLevels = $("book-levels");
const ladder = []; // prebuilt rows, reused on every update
let bookSub = null;
let bookDirty = false;
let bookUpdates = 0; // frames of changes (a step of the book) since the symbol was selected
let watchers = null; // the book's presence

for (let i = 0; i < BOOK_LEVELS; i++) {
  const tr = el("tr");
  const cells = {
    bidQty: el("td", "num bid-qty"),
    bidPx: el("td", "num bid-px"),
    askPx: el("td", "num ask-px"),
    askQty: el("td", "num ask-qty"),
  };
  tr.append(cells.bidQty, cells.bidPx, cells.askPx, cells.askQty);
  bookLevels.append(tr);
  ladder.push(cells);
}

// What the deltas save: the bytes the book's ENTRY messages took, against the same book sent
// whole at every step as the snapshot topic it used to be (deflated where that halves it, as
// the server would; the deflated size measured on this very book every second).
const savings = { entries: 0, patches: 0, wire: 0, whole: 0, wholeSize: 0, since: 0, measuring: false };
let stepOpen = false;

function resetSavings() {
  Object.assign(savings, { entries: 0, patches: 0, wire: 0, whole: 0, wholeSize: 0, since: performance.now() });
}

function asSnapshot(entries, symbol) {
  const bids = [];
  const asks = [];
  for (const level of entries.values()) (level.side === "bid" ? bids : asks).push([level.px, level.qty, level.orders]);
  bids.sort((a, b) => b[0] - a[0]);
  asks.sort((a, b) => a[0] - b[0]);
  return JSON.stringify({ symbol, bids, asks, ts: Date.now() });
}

async function measureWhole(symbol) {
  if (savings.measuring || !bookSub?.entries.size) return;
  savings.measuring = true;
  try {
    const raw = new TextEncoder().encode(asSnapshot(bookSub.entries, symbol));
    const deflated = await new Response(new Blob([raw]).stream().pipeThrough(new CompressionStream("deflate-raw"))).arrayBuffer();
    const size = 2 * deflated.byteLength <= raw.length ? deflated.byteLength : raw.length;
    if (!savings.wholeSize) savings.since = performance.now(); // the figures start now
    savings.wholeSize = size;
  } finally {
    savings.measuring = false;
  }
}

function onBookChange(change, symbol) {
  if (change.op === "reset" || change.op === "synced") {
    if (change.op === "synced" && !savings.since) {
      resetSavings(); // counted from the whole book on, once its size as a snapshot is known
      measureWhole(symbol);
    }
    bookDirty = true;
    schedulePaint();
    return;
  }
  if (savings.since && savings.wholeSize) {
    savings.entries++;
    if (change.op === "patch") savings.patches++;
    savings.wire += change.bytes;
    if (!stepOpen) { // the changes of one frame are one step of the book: one snapshot's worth
      stepOpen = true;
      queueMicrotask(() => {
        stepOpen = false;
        bookUpdates++;
        book.dataset.updates = String(bookUpdates);
        savings.whole += savings.wholeSize;
      });
    }
  }
  bookDirty = true;
  schedulePaint();
}

function clearBook() {
  for (const c of ladder) {
    c.bidQty.textContent = c.bidPx.textContent = c.askPx.textContent = c.askQty.textContent = "";
    c.bidQty.style.removeProperty("--d");
    c.askQty.style.removeProperty("--d");
  }
  for (const id of ["book-bid", "book-ask", "book-spread", "book-mid", "book-wire", "book-whole"]) $(id).textContent = "—";
  $("book-codec").textContent = "—";
  $("book-codec").removeAttribute("data-patches");
  $("book-saving").textContent = "";
}

function paintBook() {
  if (!bookDirty || !bookSub) return;
  bookDirty = false;
  const bids = [];
  const asks = [];
  for (const level of bookSub.entries.values()) (level.side === "bid" ? bids : asks).push(level);
  bids.sort((a, b) => b.px - a.px);
  asks.sort((a, b) => a.px - b.px);
  // Size bars: each level's size against the largest level shown on either side.
  let largest = 1;
  for (const level of [...bids.slice(0, BOOK_LEVELS), ...asks.slice(0, BOOK_LEVELS)]) {
    if (isNum(level.qty) && level.qty > largest) largest = level.qty;
  }
  const bar = (level) => (level && isNum(level.qty) ? `${((level.qty / largest) * 100).toFixed(1)}%` : "0%");
  for (let i = 0; i < BOOK_LEVELS; i++) {
    const c = ladder[i];
    const bid = bids[i];
    const ask = asks[i];
    c.bidQty.textContent = bid ? fmtQty(bid.qty) : "";
    c.bidPx.textContent = bid ? fmtPrice(bid.px) : "";
    c.askPx.textContent = ask ? fmtPrice(ask.px) : "";
    c.askQty.textContent = ask ? fmtQty(ask.qty) : "";
    c.bidQty.style.setProperty("--d", bar(bid));
    c.askQty.style.setProperty("--d", bar(ask));
  }
  const bestBid = bids[0]?.px;
  const bestAsk = asks[0]?.px;
  $("book-bid").textContent = fmtPrice(bestBid);
  $("book-ask").textContent = fmtPrice(bestAsk);
  $("book-spread").textContent = isNum(bestBid) && isNum(bestAsk) ? fmtPrice(bestAsk - bestBid) : "—";
  $("book-mid").textContent = isNum(bestBid) && isNum(bestAsk) ? fmtPrice((bestAsk + bestBid) / 2) : "—";
  paintSavings();
}

function paintSavings() {
  const seconds = (performance.now() - savings.since) / 1000;
  if (!savings.since || seconds < 1 || !savings.entries) return;
  const codec = $("book-codec");
  const share = Math.round((savings.patches / savings.entries) * 100);
  codec.textContent = `${share}% patches`;
  codec.dataset.patches = String(savings.patches);
  $("book-wire").textContent = `${fmtBytes(Math.round(savings.wire / seconds))}/s`;
  $("book-whole").textContent = savings.whole ? `${fmtBytes(Math.round(savings.whole / seconds))}/s` : "—";
  if (savings.whole) {
    $("book-saving").textContent = `${Math.round((1 - savings.wire / savings.whole) * 100)}% less`;
  }
}

// ---- who watches the book (presence) -------------------------------------------------------

const watching = $("watching");

function paintWatchers() {
  if (!watchers) return;
  // this user first, then the others by name; a user with several tabs open shows how many
  const members = [...watchers.members.entries()].sort(([a], [b]) => (a === me ? -1 : b === me ? 1 : a.localeCompare(b)));
  const chips = members.map(([member, { sessions, info }]) => {
    const name = member === me ? "you" : info?.name ?? member;
    return el("span", member === me ? "chip me" : "chip", sessions > 1 ? `${name} ×${sessions}` : name);
  });
  $("watching-count").textContent = String(watchers.count);
  watching.dataset.members = String(watchers.count);
  watching.replaceChildren(...chips);
}

function selectSymbol(symbol) {
  if (!symbol || symbol === selected || !rows.has(symbol)) return;
  rows.get(selected)?.tr.classList.remove("selected");
  selected = symbol;
  rows.get(symbol).tr.classList.add("selected");
  orderForm.elements.symbol.value = symbol;
  $("book-title-symbol").textContent = symbol;

  // One book at a time: the book is a table of 100 price levels, and watching it makes this
  // user one of its presence's members (unsubscribing is leaving).
  bookSub?.unsubscribe();
  watchers?.unsubscribe();
  bookUpdates = 0;
  savings.since = 0;
  bookDirty = false;
  book.dataset.symbol = symbol;
  book.dataset.updates = "0";
  clearBook();
  const sub = client.subscribeTable(`book.${symbol}`, {
    onChange: (change) => {
      if (sub === bookSub) onBookChange(change, symbol); // else a late change of the previous symbol
    },
    onError: (err) => notice(`Order book for ${symbol} unavailable: ${err.reason || err.code}`, "warn"),
  });
  bookSub = sub;
  watchers = client.presence(`book.${symbol}`, { onChange: () => paintWatchers() });
  watchers.whenSynced().then(paintWatchers, () => {});
  loadHistory(symbol);
  followBars(symbol);
}

// ---- price chart (streamed history, then live) -------------------------------------------

const chart = { history: [], live: [], token: 0 };

async function loadHistory(symbol) {
  const token = ++chart.token;
  chart.history = [];
  chart.live = [];
  chartDirty = true;
  schedulePaint();
  try {
    for await (const item of client.streamIter("history", { symbol })) {
      if (token !== chart.token) break; // another symbol was selected meanwhile
      if (isNum(item?.last)) chart.history.push(item.last);
      if (chart.history.length > CHART_POINTS) chart.history.shift();
      chartDirty = true;
      schedulePaint();
    }
  } catch (err) {
    if (token === chart.token) console.warn(`history of ${symbol}:`, err);
  }
}

function paintChart() {
  chartDirty = false;
  const points = chart.history.concat(chart.live).slice(-CHART_POINTS);
  const line = document.querySelector("#chart .chart-line");
  const area = document.querySelector("#chart .chart-area");
  if (points.length < 2) {
    line.setAttribute("points", "");
    area.setAttribute("d", "");
    $("chart-range").textContent = "";
    return;
  }
  const lo = Math.min(...points);
  const hi = Math.max(...points);
  const span = hi - lo || 1;
  const xs = 300 / (points.length - 1);
  const coords = points.map((p, i) => `${(i * xs).toFixed(1)},${(56 - ((p - lo) / span) * 52).toFixed(1)}`);
  line.setAttribute("points", coords.join(" "));
  area.setAttribute("d", `M0,60 L${coords.join(" L")} L300,60 Z`);
  $("chart-range").textContent = `${fmtPrice(lo)} – ${fmtPrice(hi)}`;
}

// ---- order ticket -------------------------------------------------------------------------

const orderForm = $("order-form");
const orderResult = $("order-result");
const submitButton = orderForm.querySelector("button[type=submit]");

function syncSubmitSide() {
  const side = orderForm.elements.side.value;
  submitButton.dataset.side = side;
  submitButton.textContent = side === "sell" ? "Sell" : "Buy";
}
orderForm.elements.side.addEventListener("change", syncSubmitSide);

function showOrderResult(status, text, extra = {}) {
  orderResult.dataset.status = status;
  orderResult.textContent = text;
  for (const key of ["orderId", "code"]) delete orderResult.dataset[key];
  Object.assign(orderResult.dataset, extra);
}

orderForm.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const symbol = orderForm.elements.symbol.value;
  const side = orderForm.elements.side.value;
  const raw = orderForm.elements.qty.value.trim();
  const qty = Number(raw);
  if (raw === "" || !Number.isInteger(qty)) {
    showOrderResult("error", "Quantity must be a whole number.", { code: "input" });
    return;
  }
  // Range checks are the server's: the page shows what place_order answers.
  submitButton.disabled = true;
  showOrderResult("pending", `Sending ${side} ${fmtQty(qty)} ${symbol}…`);
  try {
    const res = await client.call("place_order", { symbol, side, qty });
    showOrderResult("ok", `Accepted · ${side.toUpperCase()} ${fmtQty(qty)} ${symbol} · order ${res?.order_id ?? "?"}`,
      { orderId: String(res?.order_id ?? "") });
  } catch (err) {
    showOrderResult("error", `Rejected · ${err.message}${err.code !== undefined ? ` (code ${err.code})` : ""}`,
      { code: String(err.code ?? "") });
  } finally {
    submitButton.disabled = false;
  }
});

// ---- fills (private topic) ----------------------------------------------------------------

const fills = $("fills");

function addFill(f) {
  $("fills-empty").hidden = true;
  const tr = el("tr", "new");
  tr.dataset.orderId = String(f.order_id);
  tr.dataset.symbol = f.symbol;
  tr.append(
    el("td", "", fmtTime(f.ts)),
    el("td", "order", String(f.order_id)),
    el("td", "sym", f.symbol),
    el("td", f.side === "sell" ? "side-sell" : "side-buy", f.side === "sell" ? "SELL" : "BUY"),
    el("td", "num", fmtQty(f.qty)),
    el("td", "num", fmtPrice(f.price)),
  );
  fills.prepend(tr);
  while (fills.rows.length > FILL_ROWS) fills.lastElementChild.remove();
}

// the deltas' figures move with time too (bytes a second), and the whole book's deflated size
// is measured again each second on the book as it is then
setInterval(() => {
  if (!bookSub || !savings.since) return;
  measureWhole(book.dataset.symbol);
  paintSavings();
}, 1000);

// A tab that closes leaves the book's presence at once: its UNSUBSCRIBE goes out before the
// connection closes (a session that merely lost its connection stays a member until it ends).
addEventListener("pagehide", () => {
  bookSub?.unsubscribe();
  bookSub = null;
});

$("me").textContent = me;

// ---- positions (a keyed topic: this user's, one entry per symbol) --------------------------

const positionRows = new Map(); // symbol → <tr>
const positionsBody = $("positions");

function onPosition({ key, op, value }) {
  if (op === "reset") {
    for (const tr of positionRows.values()) tr.remove();
    positionRows.clear();
  } else if (op === "delete") {
    positionRows.get(key)?.remove();
    positionRows.delete(key);
  } else if (op === "set" || op === "patch") {
    let tr = positionRows.get(key);
    if (!tr) {
      tr = el("tr");
      tr.dataset.symbol = key;
      for (const cls of ["sym", "num qty", "num avg", "num last", "num pnl"]) tr.append(el("td", cls));
      positionRows.set(key, tr);
      const after = [...positionRows.keys()].sort().indexOf(key);
      positionsBody.insertBefore(tr, positionsBody.rows[after] ?? null);
    }
    const [sym, qty, avg, last, pnl] = tr.cells;
    sym.textContent = key;
    qty.textContent = fmtQty(value.qty);
    avg.textContent = fmtPrice(value.avg);
    last.textContent = fmtPrice(value.last);
    pnl.textContent = fmtSigned(value.pnl);
    pnl.className = `num pnl ${signClass(value.pnl)}`;
  }
  $("positions-empty").hidden = positionRows.size > 0;
}

// ---- work queue: reprice jobs -------------------------------------------------------------
//
// The server enqueues "reprice" jobs ({job, symbol, last}); every tab of this page and every
// `python3 -m example_app.worker` competes for them, each job going to one consumer. The tab's
// handler "works" a job for 150–450 ms, puts its result on the ring "reprice.results" and
// returns, which ACKs the job; if it throws (its result refused, say) the job goes back to the
// queue for another try, and after three tries to the dead letters of "reprice.failed".

const RESULT_ROWS = 12;
const randomHex = (bytes) => Array.from(crypto.getRandomValues(new Uint8Array(bytes)),
  (b) => b.toString(16).padStart(2, "0")).join("");
const WORKER = `tab-${randomHex(2)}`;

const queuePanel = $("reprice");
const workToggle = $("rq-work");
const results = $("rq-results");
let consumer = null; // this tab's Consumer of "reprice" while the toggle is on
let consumerLive = false; // the server has answered its SUBSCRIBE
let stopping = null; // the close() of the previous consumer, while its job in hand finishes
let jobsDone = 0;

const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

// A worker PUBLISHes its result ("reprice.results" has client_publish=True); a browser client
// without publish() hands it to the server's reprice_result RPC, which publishes it the same way.
const publishResult = typeof client.publish === "function"
  ? (result) => client.publish("reprice.results", result)
  : (result) => client.call("reprice_result", result);

async function reprice(item) {
  const job = item.value;
  const started = performance.now();
  await sleep(150 + Math.random() * 300); // the "work"
  const fair = Math.round(job.last * (0.98 + Math.random() * 0.04) * 100) / 100;
  const result = {
    job: job.job,
    symbol: job.symbol,
    fair,
    worker: WORKER,
    attempt: item.attempt,
    ms: Math.round(performance.now() - started),
  };
  try {
    await publishResult(result);
  } catch (err) {
    // The session was lost meanwhile: the server has taken the job back already and hands it
    // out again, so there is nothing to ACK or give back (the client sends neither).
    if (err.code === ErrorCode.SESSION_EXPIRED || err.code === ErrorCode.CLOSED) return;
    throw err; // refused: the job goes back to the queue (NACK) for another try
  }
  jobsDone++;
  paintWorker();
} // returning ACKs the job

/** Make the consumer follow the toggle: consume() when ticked, close() when not. */
function syncWorker() {
  const want = workToggle.checked;
  if (want && !consumer && !stopping) {
    const c = client.consume("reprice", reprice, {
      // No prefetch: the server sizes it from this tab's round trip and time per job (a job
      // takes hundreds of round trips, so it settles at 2: one in hand, one on its way).
      onUnsubscribed: (why) => {
        if (consumer !== c) return;
        consumer = null;
        workToggle.checked = false;
        notice(`Work queue: the server ended this tab's consumer (${why.reason || why.code})`, "warn");
        paintWorker();
      },
    });
    consumer = c;
    consumerLive = false;
    c.ready.then(() => {
      if (consumer === c) consumerLive = true;
      paintWorker();
    }, (err) => {
      if (consumer !== c) return; // closed by the toggle before the server answered
      consumer = null;
      if (err.code === ErrorCode.TOO_MANY) {
        // The consumer just closed still holds the topic until the server has answered it.
        setTimeout(syncWorker, 250);
      } else {
        workToggle.checked = false;
        notice(`Work queue unavailable: ${err.message}`, "warn");
      }
      paintWorker();
    });
  } else if (!want && consumer) {
    const c = consumer;
    consumer = null;
    consumerLive = false;
    // Jobs not started go back to the queue; the one in hand is finished (and ACKed) first.
    stopping = c.close().finally(() => {
      stopping = null;
      syncWorker(); // ticked again meanwhile?
    });
  }
  paintWorker();
}

function paintWorker() {
  const state = consumer ? (consumerLive ? "working" : "starting") : stopping ? "stopping" : "off";
  queuePanel.dataset.state = state;
  queuePanel.dataset.done = String(jobsDone);
  $("rq-state").textContent = jobsDone ? `${state} · ${fmtQty(jobsDone)} done here` : state;
  paintBatch();
}

function paintQueueStats(s) {
  if (!s || typeof s !== "object") return;
  const show = (id, v, cls = "") => {
    const cell = $(id);
    cell.textContent = fmtQty(v);
    cell.dataset.value = String(v);
    if (cls !== null) cell.className = `num ${cls}`;
  };
  const dead = s.dead_lettered ?? 0;
  queueConsumers = s.consumers ?? 0;
  paintBatch();
  show("rq-waiting", s.waiting ?? 0);
  show("rq-outstanding", s.outstanding ?? 0);
  show("rq-consumers", s.consumers ?? 0, (s.consumers ?? 0) === 0 ? "warn" : "");
  show("rq-acked", s.acked ?? 0, "up");
  show("rq-returned", (s.nacked ?? 0) + (s.revoked ?? 0));
  show("rq-dead", dead, dead > 0 ? "bad" : "");
}

function addResult(r) {
  if (!r || typeof r !== "object") return;
  $("rq-empty").hidden = true;
  const worker = String(r.worker ?? "?");
  const kind = worker === WORKER ? "mine" : worker.startsWith("tab-") ? "tab" : "py";
  const attempt = isNum(r.attempt) ? r.attempt : 1;
  const tr = el("tr", kind === "mine" ? "mine new" : "new");
  Object.assign(tr.dataset, { job: String(r.job), worker, kind, attempt: String(attempt) });
  const chip = el("span", `worker-chip ${kind}`, kind === "mine" ? `${worker} (this tab)` : worker);
  chip.title = { mine: "this tab", tab: "another tab of the page", py: "a worker process" }[kind];
  const who = el("td", "worker");
  who.append(chip);
  const tries = el("td", attempt > 1 ? "num attempt retry" : "num attempt",
    attempt > 1 ? `↻ ${attempt}` : String(attempt));
  if (attempt > 1) tries.title = `delivery ${attempt}: an earlier worker gave the job back or went away`;
  tr.append(
    el("td", "num job", `#${r.job}`),
    el("td", "sym", String(r.symbol ?? "")),
    el("td", "num", fmtPrice(r.fair)),
    who,
    tries,
    el("td", "num took", isNum(r.ms) ? `${r.ms} ms` : "—"),
  );
  results.prepend(tr);
  while (results.rows.length > RESULT_ROWS) results.lastElementChild.remove();
}

// ---- work queue: every symbol as one batch --------------------------------------------------
//
// "Reprice all" calls the RPC reprice_all: the server opens a batch, enqueues one ordinary
// reprice job per symbol on the same queue (each carrying its batch item) and seals the batch.
// Whoever works the queue (this tab, other tabs, Python workers) works and ACKs them as usual,
// knowing nothing of the batch; the server counts each ACK (done) or dead letter (failed) and
// pushes the batch's state on `batch.{id}`, which watchBatch() follows until it is complete.

const batchBox = $("rq-batch");
const batchButton = $("rq-batch-start");
const BATCH_KEY = "rubris-demo-batch"; // sessionStorage: a reloaded tab goes on watching its batch
let symbolCount = 0;
let queueConsumers = null; // consumers of "reprice" in the last reprice.stats
/** The batch on show: state idle | starting | running | complete | expired | error. */
let batch = { state: "idle" };

const fmtSeconds = (ms) => `${(ms / 1000).toFixed(1)} s`;

function batchProgress(b) {
  const failed = b.failed ? `, ${fmtQty(b.failed)} failed` : "";
  return `${fmtQty(b.done)} / ${fmtQty(b.total)} done${failed}`;
}

function batchText(b) {
  switch (b.state) {
    case "idle":
      return symbolCount ? `${symbolCount} jobs, one per symbol` : "one job per symbol";
    case "starting":
      return "enqueueing…";
    case "running": {
      const ahead = b.done + b.failed === 0 && b.ahead > 0
        ? ` · ${fmtQty(b.ahead)} job${b.ahead === 1 ? "" : "s"} ahead` : "";
      return batchProgress(b) + ahead;
    }
    case "complete":
      return `${batchProgress(b)}, complete in ${fmtSeconds(b.ended - b.started)}`;
    case "expired":
      return `expired at ${batchProgress(b)}`;
    default:
      return b.message ?? "";
  }
}

function paintBatch() {
  const b = batch;
  const active = b.state === "starting" || b.state === "running";
  batchButton.disabled = active || symbolCount === 0;
  batchButton.textContent = symbolCount
    ? `Reprice all ${symbolCount} symbols as one batch` : "Reprice all symbols as one batch";
  Object.assign(batchBox.dataset, {
    state: b.state,
    batch: b.id ?? "",
    total: String(b.total ?? 0),
    done: String(b.done ?? 0),
    failed: String(b.failed ?? 0),
  });
  if (b.state === "complete") batchBox.dataset.ms = String(b.ended - b.started);
  else delete batchBox.dataset.ms;
  const total = b.total || 0;
  const share = (n) => (total ? `${((100 * (n || 0)) / total).toFixed(2)}%` : "0%");
  $("rq-batch-done").style.width = share(b.done);
  $("rq-batch-failed").style.width = share(b.failed);
  const bar = $("rq-batch-bar");
  bar.setAttribute("aria-valuemax", String(total));
  bar.setAttribute("aria-valuenow", String((b.done || 0) + (b.failed || 0)));
  const text = $("rq-batch-text");
  text.textContent = text.title = batchText(b);
  // Jobs only move while someone consumes the queue: this tab, or anyone the stats count.
  const idleQueue = active && !consumerLive && queueConsumers === 0;
  $("rq-batch-hint").hidden = !idleQueue;
  batchBox.dataset.stalled = String(idleQueue);
}

function setBatch(next) {
  batch = next;
  paintBatch();
}

async function startBatch() {
  if (batch.state === "starting" || batch.state === "running") return;
  const started = Date.now();
  setBatch({ state: "starting", total: symbolCount, done: 0, failed: 0, started });
  let res;
  try {
    res = await client.call("reprice_all");
  } catch (err) {
    setBatch({ state: "error", message: `Refused: ${err.message}` });
    return;
  }
  const run = { id: res.batch, total: res.total, ahead: res.ahead ?? 0, started };
  try {
    sessionStorage.setItem(BATCH_KEY, JSON.stringify(run));
  } catch {
    // storage unavailable: a reload just forgets the batch
  }
  watchRun(run);
}

/** Follow a batch on `batch.{id}` until it is complete or expired. */
async function watchRun(run) {
  setBatch({ state: "running", done: 0, failed: 0, ...run });
  const current = batch;
  try {
    const final = await client.watchBatch(run.id, (s) => {
      if (batch !== current) return;
      Object.assign(batch, { total: s.total, done: s.done, failed: s.failed });
      paintBatch();
    });
    if (batch !== current) return;
    Object.assign(batch, { state: final.state, total: final.total, done: final.done,
      failed: final.failed, ended: Date.now() });
    paintBatch();
  } catch (err) {
    if (batch !== current) return;
    const why = err.code === ErrorCode.UNKNOWN
      ? "the server does not know it (restarted?)" : err.message;
    setBatch({ state: "error", message: `Lost batch ${run.id}: ${why}` });
  } finally {
    try {
      sessionStorage.removeItem(BATCH_KEY);
    } catch {
      // nothing to forget
    }
  }
}

/** A batch this tab started before a reload, if any. */
function savedRun() {
  try {
    const run = JSON.parse(sessionStorage.getItem(BATCH_KEY) ?? "null");
    return run && typeof run.id === "string" && isNum(run.total) && isNum(run.started) ? run : null;
  } catch {
    return null;
  }
}

function setBatchSymbols(n) {
  symbolCount = n;
  paintBatch();
}

function startWorkQueue() {
  queuePanel.dataset.worker = WORKER;
  $("rq-name").textContent = WORKER;
  const command = `python3 -m example_app.worker --url ${location.origin}/rubris`;
  $("rq-command").textContent = command;
  $("rq-command").title = `${command} --name py-1 --work 0.3 (Ctrl-C stops it; its jobs go to the others)`;
  client.subscribe("reprice.stats", paintQueueStats);
  client.subscribe("reprice.results", addResult);
  workToggle.addEventListener("change", syncWorker);
  syncWorker();
  batchButton.addEventListener("click", startBatch);
  const run = savedRun();
  if (run) watchRun(run);
  else paintBatch();
}

// ---- spark pipeline: candles of bars.{symbol} ----------------------------------------------
//
// The Spark job writes a bar per symbol and window to the ring bars.{symbol} in update mode: the
// bar of a window still open is written again, with newer values, every micro-batch that has its
// trades. The page follows the selected symbol's topic (one subscription at a time, like the
// book), keeps its bars keyed by window start (the latest write wins) and draws the newest
// CANDLES of them by hand as SVG: wicks high–low, bodies open–close, VWAP dots, a price axis and
// the last close. The subscription asks for the ring's last BARS_REPLAY messages (a late joiner,
// `last`), so a symbol just selected shows at once the bars the ring holds, then the new ones.

const CANDLES = 40; // drawn at most
const MIN_SLOTS = 20; // fewer bars are drawn wider, the newest at the right edge
const BARS_KEPT = 120; // per symbol, late windows included
const BARS_REPLAY = 256; // all the ring bars.{symbol} keeps (app.py): a window is written many times
const SVG_NS = "http://www.w3.org/2000/svg";

const pipelinePanel = $("pipeline");
const candlesBox = $("candles-box");
const candlesSvg = $("candles");
const layer = (name) => candlesSvg.querySelector(`g.${name}`);
const bars = {
  symbol: null,
  byStart: new Map(), // window start (ms) → latest bar written for it
  sub: null,
  updates: 0,
  lastAt: 0, // Date.now() of the last bar received
  windowMs: 0,
  everSeen: false, // bars of any symbol arrived in this tab: the pipeline runs
  latencyMs: null, // from the newest trade of the last bar received to its arrival here
};

const svg = (tag, attrs, text) => {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
};
const fmtClock = (ms) => new Date(ms).toLocaleTimeString("en-GB");
const fmtWindow = (ms) => (ms % 60_000 === 0 ? `${ms / 60_000} min` : `${+(ms / 1000).toFixed(3)} s`);
const compactFmt = new Intl.NumberFormat("en-US", { notation: "compact", maximumFractionDigits: 1 });

function followBars(symbol) {
  bars.sub?.unsubscribe();
  Object.assign(bars, { symbol, byStart: new Map(), updates: 0, lastAt: 0, latencyMs: null });
  pipelinePanel.dataset.symbol = symbol;
  $("bars-symbol").textContent = symbol;
  const sub = client.subscribe(`bars.${symbol}`, (bar, meta) => {
    // else a late message of the previous symbol; seq <= head: one the ring held (the replay)
    if (sub === bars.sub) onBar(bar, meta.seq <= (sub.info?.head ?? 0));
  }, {
    last: BARS_REPLAY,
    onError: (err) => notice(`Bars of ${symbol} unavailable: ${err.reason || err.code}`, "warn"),
  });
  bars.sub = sub;
  paintBarsLive();
  barsDirty = true;
  schedulePaint();
}

function onBar(b, replayed = false) {
  if (!b || typeof b !== "object" || b.symbol !== bars.symbol) return;
  if (![b.start, b.end, b.open, b.high, b.low, b.close].every(isNum)) return;
  bars.byStart.set(b.start, b);
  if (bars.byStart.size > BARS_KEPT) bars.byStart.delete(Math.min(...bars.byStart.keys()));
  bars.updates++;
  bars.windowMs = b.end - b.start;
  bars.everSeen = true;
  if (replayed) {
    // written before this tab asked: "live" is judged by when its trades happened, and the
    // time it waited in the ring is no latency
    bars.lastAt = Math.max(bars.lastAt, isNum(b.last_ts) ? b.last_ts : b.end);
  } else {
    bars.lastAt = Date.now();
    // the same clock only when page and pipeline run on one machine, as in the demo
    if (isNum(b.last_ts)) bars.latencyMs = Math.max(0, bars.lastAt - b.last_ts);
  }
  paintBarsLive();
  barsDirty = true;
  schedulePaint();
}

/** live: bars arrive; idle: none for a while; waiting: none yet for this symbol. */
function paintBarsLive() {
  const quiet = Math.max(15_000, 3 * bars.windowMs);
  const state = !bars.lastAt ? "waiting" : Date.now() - bars.lastAt < quiet ? "live" : "idle";
  if (pipelinePanel.dataset.live === state) return;
  pipelinePanel.dataset.live = state;
  $("bars-live-text").textContent = state;
}
setInterval(paintBarsLive, 1000);

/** A round step near `raw` (1, 2, 2.5 or 5 times a power of ten) and the decimals it needs. */
function niceStep(raw) {
  const p = 10 ** Math.floor(Math.log10(raw));
  const m = raw / p;
  const step = (m < 1.5 ? 1 : m < 2.25 ? 2 : m < 3.5 ? 2.5 : m < 7.5 ? 5 : 10) * p;
  let decimals = 2;
  while (decimals < 6 && Math.abs(Number(step.toFixed(decimals)) - step) > step * 1e-6) decimals++;
  return { step, decimals };
}

new ResizeObserver(() => {
  barsDirty = true;
  schedulePaint();
}).observe(candlesBox);

/** The hint's pipeline command for this demo: the page cannot know the API token (the demo
 * prints the command with it at start-up), so it shows the one for RUBRIS_API_TOKEN=demo, with
 * --url unless the demo is at the pipeline's default URL. */
function showPipelineCommand() {
  const url = `${location.origin}/rubris`;
  const where = url === "http://127.0.0.1:8000/rubris" ? "" : ` --url ${url}`;
  $("bars-command").textContent = `RUBRIS_API_TOKEN=demo python3 -m example_app.pipeline${where}`;
}

function paintEmptyBars() {
  const hint = $("bars-empty");
  if (bars.everSeen && bars.symbol) {
    hint.replaceChildren(el("span", "", `No bars of ${bars.symbol} yet: the pipeline writes one when it trades next.`));
  }
  for (const name of ["grid", "bodies", "vwap", "last", "axis"]) layer(name).replaceChildren();
  $("candles-legend").replaceChildren();
  candlesSvg.setAttribute("aria-label", `Candlestick chart of ${bars.symbol ?? "the selected symbol"}: no bars yet`);
  $("bars-meta").textContent = bars.symbol ? `bars.${bars.symbol}` : "bars.{symbol}";
}

function paintBars() {
  barsDirty = false;
  const list = [...bars.byStart.values()].sort((a, b) => a.start - b.start).slice(-CANDLES);
  pipelinePanel.dataset.bars = String(list.length);
  pipelinePanel.dataset.updates = String(bars.updates);
  $("pl-bars").textContent = fmtQty(bars.byStart.size);
  $("pl-updates").textContent = fmtQty(bars.updates);
  const lat = bars.latencyMs;
  $("pl-latency").textContent = lat === null ? "—" : lat < 1000 ? `${Math.round(lat)} ms` : fmtSeconds(lat);
  if (!list.length) {
    paintEmptyBars();
    return;
  }
  const newest = list[list.length - 1];
  const first = list[0];
  const change = newest.close - first.open;
  paintLegend(newest, change);

  const W = Math.max(120, candlesBox.clientWidth);
  const H = Math.max(80, candlesBox.clientHeight);
  candlesSvg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const axisW = 62;
  const top = $("candles-legend").offsetHeight + 12;
  const bottom = H - 16;
  const left = 6;
  const right = W - axisW;

  // the price scale: every high, low and VWAP shown, with some air above and below
  let lo = Infinity;
  let hi = -Infinity;
  for (const b of list) {
    lo = Math.min(lo, b.low, isNum(b.vwap) ? b.vwap : b.low);
    hi = Math.max(hi, b.high, isNum(b.vwap) ? b.vwap : b.high);
  }
  const minSpan = Math.max(Math.abs(hi) * 2e-4, 0.02);
  if (hi - lo < minSpan) {
    const mid = (hi + lo) / 2;
    lo = mid - minSpan / 2;
    hi = mid + minSpan / 2;
  }
  const pad = (hi - lo) * 0.06;
  lo -= pad;
  hi += pad;
  const y = (p) => top + ((hi - p) / (hi - lo)) * (bottom - top);
  const slot = (right - left) / Math.max(MIN_SLOTS, list.length);
  const x = (i) => right - (list.length - i - 0.5) * slot; // the newest at the right edge
  const crisp = (v) => Math.round(v) + 0.5;

  // grid and price labels
  const grid = [];
  const axis = [svg("line", { class: "axis-line", x1: crisp(right), x2: crisp(right), y1: top - 6, y2: bottom })];
  const lastY = y(newest.close);
  const { step, decimals } = niceStep((hi - lo) / Math.max(2, Math.floor((bottom - top) / 30)));
  const tickFmt = new Intl.NumberFormat("en-US", { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
  for (let p = Math.ceil(lo / step) * step; p <= hi; p += step) {
    const py = crisp(y(p));
    grid.push(svg("line", { x1: left, x2: right, y1: py, y2: py }));
    if (Math.abs(py - lastY) > 14) axis.push(svg("text", { x: right + 6, y: py + 3.5 }, tickFmt.format(p)));
  }

  // time labels under candles, anchored to window starts so they do not slide along
  const perLabel = Math.max(1, Math.ceil(64 / slot));
  const win = bars.windowMs || 1000;
  let lastLabelX = -Infinity;
  list.forEach((b, i) => {
    if (Math.round(b.start / win) % perLabel !== 0) return;
    const cx = x(i);
    if (cx - lastLabelX < 58 || cx < left + 24 || cx > right - 24) return;
    lastLabelX = cx;
    axis.push(svg("text", { x: cx, y: H - 4, "text-anchor": "middle" }, fmtClock(b.start)));
    grid.push(svg("line", { x1: crisp(cx), x2: crisp(cx), y1: top - 6, y2: bottom, class: "vgrid" }));
  });

  // candles and VWAP dots
  const bodyW = Math.max(1, Math.round(slot * 0.62));
  const dotR = Math.min(2.4, Math.max(1.3, slot * 0.13));
  const candles = [];
  const dots = [];
  list.forEach((b, i) => {
    const up = b.close >= b.open;
    const cx = x(i);
    const g = svg("g", {
      class: `candle ${up ? "up" : "down"}${b === newest ? " newest" : ""}`,
      "data-symbol": b.symbol, "data-start": b.start,
      "data-open": b.open, "data-high": b.high, "data-low": b.low, "data-close": b.close,
    });
    const yOpen = y(b.open);
    const yClose = y(b.close);
    const bodyTop = Math.round(Math.min(yOpen, yClose));
    const bodyH = Math.max(1, Math.round(Math.abs(yOpen - yClose)));
    g.append(
      svg("line", { class: "wick", x1: crisp(cx), x2: crisp(cx), y1: y(b.high), y2: y(b.low) }),
      svg("rect", { class: "candle-body", x: Math.round(cx - bodyW / 2), y: bodyTop, width: bodyW, height: bodyH }),
    );
    const title = `${fmtClock(b.start)} · O ${fmtPrice(b.open)} H ${fmtPrice(b.high)} L ${fmtPrice(b.low)}`
      + ` C ${fmtPrice(b.close)} · VWAP ${fmtPrice(b.vwap)} · ${fmtQty(b.volume)} in ${fmtQty(b.trades)} trades`;
    g.append(svg("title", {}, title));
    candles.push(g);
    if (isNum(b.vwap)) dots.push(svg("circle", { class: "vwap-dot", cx: cx.toFixed(1), cy: y(b.vwap).toFixed(1), r: dotR }));
  });

  // the last close: a dashed line across and its price on the axis
  const lastUp = newest.close >= newest.open;
  const ly = crisp(lastY);
  const last = layer("last");
  last.setAttribute("class", `last ${lastUp ? "up" : "down"}`);
  last.replaceChildren(
    svg("line", { class: "last-line", x1: left, x2: right, y1: ly, y2: ly }),
    svg("rect", { class: "last-tag", x: right + 1, y: ly - 8, width: axisW - 3, height: 16, rx: 2 }),
    svg("text", { class: "last-text", x: right + 6, y: ly + 3.5 }, fmtPrice(newest.close)),
  );

  layer("grid").replaceChildren(...grid);
  layer("axis").replaceChildren(...axis);
  layer("bodies").replaceChildren(...candles);
  layer("vwap").replaceChildren(...dots);

  const span = `${list.length} ${fmtWindow(newest.end - newest.start)} bar${list.length === 1 ? "" : "s"}`;
  $("bars-meta").textContent = `${fmtWindow(newest.end - newest.start)} bars · ${fmtClock(newest.start)}`;
  $("bars-meta").title = `Newest bar: ${fmtClock(newest.start)} – ${fmtClock(newest.end)}, `
    + `${fmtQty(bars.updates)} bar updates received`;
  candlesSvg.setAttribute("aria-label", `Candlestick chart of ${bars.symbol}, last ${span}: newest at `
    + `${fmtClock(newest.start)}, open ${fmtPrice(newest.open)}, high ${fmtPrice(newest.high)}, `
    + `low ${fmtPrice(newest.low)}, close ${fmtPrice(newest.close)}, VWAP ${fmtPrice(newest.vwap)}`);
}

function paintLegend(b, change) {
  const cls = b.close >= b.open ? "up" : "down";
  const item = (k, v, vcls = "", kcls = "") => {
    const span = el("span", "");
    span.append(el("span", `k ${kcls}`, k), el("span", `v ${vcls}`, v));
    return span;
  };
  const pct = (change / b.open) * 100;
  $("candles-legend").replaceChildren(
    item("O", fmtPrice(b.open), cls),
    item("H", fmtPrice(b.high), cls),
    item("L", fmtPrice(b.low), cls),
    item("C", `${fmtPrice(b.close)}`, cls),
    item("Δ", isNum(pct) ? fmtSigned(pct, "%") : "—", signClass(change)),
    item("VWAP", fmtPrice(b.vwap), "", "vwap-key"),
    item("Vol", isNum(b.volume) ? compactFmt.format(b.volume) : "—"),
  );
}

// ---- spark pipeline: catalog batches ------------------------------------------------------
//
// The catalog job (spark.read of the prices, a reprice job per symbol and book written with
// mode=enqueue, track=true) announces its batch on the ring `pipeline.batches`: {batch, state:
// "open"} when it opens, then {batch, state, total, done, failed, completed, rows} once the
// driver sealed it. A batch this tab has not shown yet is followed with watchBatch() until it is
// complete: its bar fills as whoever works the queue ACKs the jobs. The newest three are shown.
// The subscription asks for the ring's last announcements (`last`: two per batch shown), so a
// tab opened after a batch was announced shows it too.

const PIPELINE_BATCHES = 3;
const ANNOUNCEMENTS_REPLAY = 2 * PIPELINE_BATCHES; // open and sealed of each batch shown
const STATE_RANK = { open: 0, sealed: 1, complete: 2, expired: 2, error: 2 };
const plList = $("pl-batches");
const plBatches = new Map(); // batch id → shown batch, oldest first
const plSeen = new Set(); // ids shown at some point (a dropped batch's later news is old news)

function srAnnounce(text) {
  $("pl-announce").textContent = text;
}

/** Merge a state (an announcement's or the watch's): counts and states only move forward. */
function mergeBatch(b, s) {
  if (!s || typeof s !== "object") return;
  if (typeof s.state === "string" && (STATE_RANK[s.state] ?? -1) >= (STATE_RANK[b.state] ?? -1)) {
    b.state = s.state;
  }
  for (const k of ["total", "done", "failed"]) if (isNum(s[k]) && s[k] >= (b[k] ?? 0)) b[k] = s[k];
  if (isNum(s.rows)) b.rows = s.rows;
}

function onPipelineBatch(a, replayed = false) {
  if (!a || typeof a !== "object" || typeof a.batch !== "string" || !a.batch) return;
  let b = plBatches.get(a.batch);
  if (!b) {
    if (plSeen.has(a.batch)) return;
    b = showPipelineBatch(a.batch, replayed);
  }
  const before = b.state;
  mergeBatch(b, a);
  if (b.state === "complete" && before !== "complete") b.ended ??= Date.now();
  paintPipelineBatch(b);
}

function showPipelineBatch(id, replayed = false) {
  const short = id.length > 10 ? `${id.slice(0, 8)}…` : id;
  const li = el("li", "pl-batch");
  li.dataset.batch = id;
  const name = el("span", "pl-batch-name", `catalog batch ${short}`);
  name.title = `Batch ${id}: the reprice jobs the Spark catalog job enqueued`;
  const chip = el("span", "pl-batch-state");
  const top = el("div", "pl-batch-top");
  top.append(name, chip);
  const bar = el("div", "batch-bar");
  bar.setAttribute("role", "progressbar");
  bar.setAttribute("aria-label", `Catalog batch ${short}`);
  bar.setAttribute("aria-valuemin", "0");
  const doneBar = el("span", "batch-bar-done");
  const failedBar = el("span", "batch-bar-failed");
  bar.append(doneBar, failedBar);
  const text = el("span", "batch-text");
  const progress = el("div", "pl-batch-progress");
  progress.append(bar, text);
  li.append(top, progress);
  const b = {
    id, short, li, text, chip, bar, doneBar, failedBar, state: "open", total: 0, done: 0, failed: 0,
    seenAt: Date.now(), ended: null, dropped: false,
  };
  plBatches.set(id, b);
  plSeen.add(id);
  if (plSeen.size > 256) plSeen.delete(plSeen.values().next().value);
  plList.prepend(li);
  while (plBatches.size > PIPELINE_BATCHES) {
    const [oldId, old] = plBatches.entries().next().value;
    old.dropped = true; // its watch ends by itself (complete or expired); nothing is shown of it
    old.li.remove();
    plBatches.delete(oldId);
  }
  if (!replayed) srAnnounce(`Catalog batch ${short} opened by the Spark pipeline`); // not old news
  client.watchBatch(id, (s) => {
    if (b.dropped) return;
    mergeBatch(b, s);
    paintPipelineBatch(b);
  }).then((final) => {
    if (b.dropped) return;
    mergeBatch(b, final);
    b.ended ??= Date.now();
    paintPipelineBatch(b);
    srAnnounce(`Catalog batch ${short} ${b.state}: ${b.done} of ${b.total} jobs done, ${b.failed} failed`);
  }, (err) => {
    if (b.dropped || STATE_RANK[b.state] === 2) return;
    b.state = "error";
    b.message = err.code === ErrorCode.UNKNOWN ? "unknown to the server (expired or restarted?)" : err.message;
    paintPipelineBatch(b);
  });
  return b;
}

/** The batch's counts, e.g. "142/200 done, 0 failed". */
function pipelineBatchText(b) {
  if (b.state === "error") return b.message;
  if (b.state === "open" && !b.total) return "enqueueing jobs…";
  return `${fmtQty(b.done)}/${fmtQty(b.total)} done, ${fmtQty(b.failed)} failed`;
}

/** The state chip: enqueueing (open), running (sealed), complete in …, expired, error. */
function pipelineBatchState(b) {
  switch (b.state) {
    case "open":
      return "enqueueing";
    case "sealed":
      return "running";
    case "complete":
      // how long since this tab saw it announced (a tab opened later saw less of it)
      return b.ended && b.ended - b.seenAt >= 100 ? `complete · ${fmtSeconds(b.ended - b.seenAt)}` : "complete";
    default:
      return b.state;
  }
}

function paintPipelineBatch(b) {
  if (b.dropped) return;
  const total = b.total || 0;
  const share = (n) => (total ? `${Math.min(100, (100 * (n || 0)) / total).toFixed(2)}%` : "0%");
  b.doneBar.style.width = share(b.done);
  b.failedBar.style.width = share(b.failed);
  Object.assign(b.li.dataset, {
    state: b.state, total: String(total), done: String(b.done), failed: String(b.failed),
  });
  if (isNum(b.rows)) b.li.dataset.rows = String(b.rows);
  const text = pipelineBatchText(b);
  const state = pipelineBatchState(b);
  b.text.textContent = text;
  b.chip.textContent = state;
  b.bar.setAttribute("aria-valuemax", String(total));
  b.bar.setAttribute("aria-valuenow", String(b.done + b.failed));
  b.bar.setAttribute("aria-valuetext", `catalog batch ${b.short}: ${text} (${state})`);
  if (isNum(b.rows)) b.text.title = `${fmtQty(b.rows)} rows written by the catalog job`;
}

function startPipeline() {
  showPipelineCommand();
  const sub = client.subscribe("pipeline.batches", (a, meta) => {
    onPipelineBatch(a, meta.seq <= (sub.info?.head ?? 0)); // seq <= head: the ring's replay
  }, { last: ANNOUNCEMENTS_REPLAY });
}

// ---- status bar ---------------------------------------------------------------------------

let gapsSeen = 0;
let noticeTimer = null;

function notice(text, level = "info", ms = 8000) {
  const n = $("status-notice");
  n.textContent = text;
  n.dataset.level = level;
  clearTimeout(noticeTimer);
  if (ms) noticeTimer = setTimeout(() => { n.textContent = ""; }, ms);
}

function paintStatus() {
  const s = client.stats;
  $("status-transport").textContent = client.transport ?? "—";
  const state = $("status-state");
  state.textContent = client.state;
  state.dataset.state = client.state;
  $("status-resumed").textContent = client.resumed ? "yes" : "no";
  $("status-rate").textContent = String(Math.round(s.messagesPerSecond));
  const saved = $("status-saved");
  saved.textContent = fmtBytes(s.bytesSaved);
  saved.dataset.bytes = String(s.bytesSaved);
  saved.title = `${s.compressed} compressed messages of ${s.messages}`;
  $("status-gaps").textContent = String(gapsSeen);
  $("status-rtt").textContent = s.rttMs === null ? "—" : `${s.rttMs} ms`;
  $("status-session").textContent = client.sessionId ?? "—";
  const pill = $("conn-pill");
  pill.dataset.state = client.state;
  $("conn-pill-text").textContent = {
    connecting: "Connecting",
    open: `Live · ${client.transport === "longpoll" ? "long-poll" : "WebSocket"}`,
    reconnecting: "Reconnecting",
    closed: "Disconnected",
  }[client.state] ?? client.state;
}

let everOpen = false;
client.on("state", (ev) => {
  paintStatus();
  if (ev.state === "open" && ev.resumed) notice("Reconnected: session resumed, nothing lost.", "info");
  else if (ev.state === "open" && everOpen) notice("Reconnected with a new session: subscriptions restored.", "warn");
  else if (ev.state === "reconnecting") {
    notice(lastGoodbye ? `${lastGoodbye}; reconnecting…` : "Connection lost, reconnecting…", "warn", 0);
  }
  else if (ev.state === "closed") notice("Disconnected. Reload the page to reconnect.", "error", 0);
  if (ev.state === "open") everOpen = true;
  lastGoodbye = null;
});
client.on("gap", (g) => {
  gapsSeen++;
  $("status-gaps").title = `last: ${g.count} on ${g.name} from #${g.from}`;
});
// GOODBYE comes just before the state change it causes; keep its reason for that notice.
let lastGoodbye = null;
client.on("goodbye", (g) => {
  lastGoodbye = `Server closed the session: ${g.reason || "no reason"} (code ${g.code})`;
  notice(lastGoodbye, "warn", 0);
});
client.on("error", (e) => console.warn("rubris:", e.message));

setInterval(paintStatus, 500);
paintStatus();

const clock = $("clock");
setInterval(() => { clock.textContent = new Date().toLocaleTimeString("en-GB"); }, 1000);
clock.textContent = new Date().toLocaleTimeString("en-GB");

// ---- start-up -----------------------------------------------------------------------------

/** The instrument list, retried while the connection is not there yet. */
async function loadSymbols() {
  for (let attempt = 0; ; attempt++) {
    try {
      const list = await client.call("symbols");
      if (Array.isArray(list)) return list;
      throw new Error("symbols did not return a list");
    } catch (err) {
      if (client.state === "closed") throw err;
      $("watch-count").textContent = `waiting for the server… (${err.message})`;
      await new Promise((r) => setTimeout(r, Math.min(5000, 500 * 2 ** attempt)));
    }
  }
}

async function start() {
  const symbols = await loadSymbols();
  buildGrid(symbols);
  setBatchSymbols(symbols.length);
  const select = orderForm.elements.symbol;
  select.replaceChildren(...symbols.map(({ symbol, name }) => {
    const option = el("option", "", symbol);
    option.value = symbol;
    option.title = name ?? "";
    return option;
  }));
  syncSubmitSide();

  // Subscriptions survive reconnects by themselves: the client resumes or re-subscribes.
  for (const { symbol } of symbols) {
    client.subscribe(`prices.${symbol}`, (q) => onQuote(symbol, q));
  }
  client.subscribe("trades", (t) => queueTrade(t), {
    onGap: ({ from, count }) => queueTrade({ gap: true, from, count }),
  });
  client.subscribe("fills", (f) => addFill(f));
  client.subscribeTable(`positions.${me}`, { onChange: onPosition });
  if (symbols.length) selectSymbol(symbols[0].symbol);
}

startWorkQueue();
startPipeline();
start().catch((err) => {
  $("watch-count").textContent = `cannot load instruments: ${err.message}`;
  console.error(err);
});

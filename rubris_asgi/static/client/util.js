// Small runtime helpers with no protocol knowledge: the clock, sleeping and yielding to the event
// loop, calling app code without letting it break the client (safeCall), the message-rate meter,
// the reconnect backoff and where the endpoints live (resolveUrls). Browser globals are only
// used inside functions or behind a `typeof` test, so the modules load anywhere (node included).

/**
 * Exponential backoff with jitter: 250 ms, 500 ms, 1 s … capped, each scaled by a random factor
 * in [0.5, 1) so that clients cut off together do not come back together.
 */
export function backoffDelay(attempt, baseMs = 250, capMs = 5000, random = Math.random) {
  const ceiling = Math.min(capMs, baseMs * 2 ** Math.min(attempt, 20));
  return Math.round(ceiling * (0.5 + random() * 0.5));
}

export const now = typeof performance !== "undefined" && performance.now
  ? () => performance.now()
  : () => Date.now();

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Yield to the event loop with a real task. A MessageChannel task is not clamped the way nested
 * setTimeout(0) is (4 ms), and lets WebSocket/fetch events run between delivery slices.
 */
let yieldQueue = null;
let yieldPort = null;
export function yieldToEventLoop() {
  if (typeof MessageChannel !== "function") return sleep(0);
  if (!yieldPort) {
    const channel = new MessageChannel();
    yieldQueue = [];
    channel.port1.onmessage = () => yieldQueue.shift()?.();
    // Node keeps a process alive for a referenced port; a browser has no unref.
    channel.port1.unref?.();
    channel.port2.unref?.();
    yieldPort = channel.port2;
  }
  return new Promise((resolve) => {
    yieldQueue.push(resolve);
    yieldPort.postMessage(0);
  });
}

/** Surface an exception thrown by app code without breaking the client's own loops. */
export function reportAppError(err) {
  if (typeof globalThis.reportError === "function") globalThis.reportError(err);
  else console.error(err);
}

export function safeCall(fn, ...args) {
  if (typeof fn !== "function") return undefined;
  try {
    return fn(...args);
  } catch (err) {
    reportAppError(err);
    return undefined;
  }
}

/** Messages per second over a sliding window of ~2 s, in 200 ms buckets. */
export class RateMeter {
  constructor(slots = 10, slotMs = 200) {
    this.slotMs = slotMs;
    this.counts = new Float64Array(slots);
    this.slot = Math.floor(now() / slotMs);
  }

  _advance() {
    const slot = Math.floor(now() / this.slotMs);
    const n = this.counts.length;
    for (let s = Math.max(this.slot + 1, slot - n + 1); s <= slot; s++) this.counts[s % n] = 0;
    this.slot = Math.max(this.slot, slot);
  }

  add(k = 1) {
    this._advance();
    this.counts[this.slot % this.counts.length] += k;
  }

  rate() {
    this._advance();
    let sum = 0;
    for (const c of this.counts) sum += c;
    const spanMs = (this.counts.length - 1) * this.slotMs + (now() % this.slotMs);
    return spanMs > 0 ? (sum * 1000) / spanMs : 0;
  }
}

/**
 * Where the endpoints live. A relative `url` resolves against the page; the query string (an auth
 * token, say) is carried to every endpoint.
 */
export function resolveUrls(url) {
  const base = typeof location !== "undefined" ? location.href : undefined;
  let u;
  try {
    u = new URL(url, base);
  } catch {
    throw new TypeError(`rubris: cannot resolve ${JSON.stringify(url)}; outside a page, pass an absolute URL`);
  }
  const secure = u.protocol === "https:" || u.protocol === "wss:";
  const path = u.pathname.replace(/\/+$/, "");
  const query = u.search.replace(/^\?/, "");
  return {
    ws: `${secure ? "wss" : "ws"}://${u.host}${path}/ws${query ? `?${query}` : ""}`,
    lpOpen: `${secure ? "https" : "http"}://${u.host}${path}/lp${query ? `?${query}` : ""}`,
    lpSession: (session) => `${secure ? "https" : "http"}://${u.host}${path}/lp/${encodeURIComponent(session)}`,
    query,
  };
}

// rubris browser client: one ES module, no build step, no dependencies.
//
// Served by the plugin at `{mount}/client.js`:
//
//     import { connect } from "/rubris/client.js";
//     const client = connect("/rubris");
//     client.subscribe("prices.AAPL", (price) => render(price));
//     const result = await client.call("place_order", { symbol: "AAPL", side: "buy", qty: 10 });
//
// The wire contract is the project's protocol.md ("rubris wire protocol, version 1"); section
// numbers quoted below (§n) refer to it. The module has four layers, top to bottom in this file:
//
//   1. the codec: varints, strings, frames of `kind len body` messages (pure functions);
//   2. two transports with one small interface: WebSocket and HTTP long-poll;
//   3. RubrisClient: session, subscriptions, calls, reconnect/resume, ACK, NAK, heartbeats;
//   4. the public value classes (Subscription, RubrisError) and `connect()`.
//
// Everything the client keeps is bounded: frames waiting for a connection (`maxPending`),
// the inbound queue (snapshot topics conflate in it, the server slows down on NAK, private topics
// are ACKed only once the app has seen them so the server's queue capacity bounds them), and the
// buffer of a `streamIter` (its producer waits for the consumer).

// ---------------------------------------------------------------------------------------------
// 1. Codec
// ---------------------------------------------------------------------------------------------

const PROTOCOL_VERSION = 1;
const SUBPROTOCOL = "rubris.v1";

/** Message kinds (§3, §4). The low 7 bits of the kind byte; 0x80 is the COMPRESSED flag. */
export const Kind = Object.freeze({
  WELCOME: 0x01,
  PUSH: 0x02,
  RESULT: 0x03,
  STREAM: 0x04,
  SUBSCRIBED: 0x05,
  REJECTED: 0x06,
  UNSUBSCRIBED: 0x07,
  GAP: 0x08,
  PONG: 0x09,
  GOODBYE: 0x0a,
  FLOW: 0x0b,
  HELLO: 0x21,
  SUBSCRIBE: 0x22,
  UNSUBSCRIBE: 0x23,
  CALL: 0x24,
  ACK: 0x25,
  NACK: 0x26,
  NAK: 0x27,
  PING: 0x28,
  PUBLISH: 0x29,
});

const COMPRESSED = 0x80;

/** Topic modes announced in SUBSCRIBED (§3). */
export const Mode = Object.freeze({ SNAPSHOT: 1, RING: 2, PRIVATE: 3, QUEUE: 4 });

/** Payload codecs announced in SUBSCRIBED (§2). */
export const Codec = Object.freeze({ JSON: 0, BYTES: 1, TEXT: 2 });

/**
 * Error codes: the numbers are the protocol's (§9); the strings are this client's own
 * conditions, which never come from a server.
 */
export const ErrorCode = Object.freeze({
  PROTOCOL: 1,
  UNSUPPORTED_VERSION: 2,
  UNKNOWN: 3,
  NOT_AUTHORISED: 4,
  TOO_LARGE: 5,
  TOO_MANY: 6,
  SLOW_CONSUMER: 7,
  SESSION_EXPIRED: 8,
  SHUTTING_DOWN: 9,
  REJECTED: 10,
  CLOSED: "closed",
  TIMEOUT: "timeout",
  UNSUBSCRIBED: "unsubscribed",
});

const SERVER_KINDS = new Set([
  Kind.WELCOME, Kind.PUSH, Kind.RESULT, Kind.STREAM, Kind.SUBSCRIBED, Kind.REJECTED,
  Kind.UNSUBSCRIBED, Kind.GAP, Kind.PONG, Kind.GOODBYE, Kind.FLOW,
]);
const SERVER_COMPRESSIBLE = new Set([Kind.PUSH, Kind.RESULT, Kind.STREAM]);
const CLIENT_KINDS = new Set([
  Kind.HELLO, Kind.SUBSCRIBE, Kind.UNSUBSCRIBE, Kind.CALL, Kind.ACK, Kind.NACK, Kind.NAK,
  Kind.PING, Kind.PUBLISH,
]);
const CLIENT_COMPRESSIBLE = new Set([Kind.SUBSCRIBE, Kind.CALL, Kind.PUBLISH]);

const EMPTY = new Uint8Array(0);
const utf8Encoder = new TextEncoder();
// fatal: bad UTF-8 in a str field is a protocol error (§2), not something to paper over.
const utf8Decoder = new TextDecoder("utf-8", { fatal: true });

/** Raised by the codec on malformed input; the client turns it into a reconnect. */
class ProtocolError extends Error {
  constructor(message) {
    super(message);
    this.name = "ProtocolError";
    this.code = 1;
  }
}

/**
 * Growable byte buffer for encoding. Varints use arithmetic, not bit operators: JS bit operators
 * work on 32 bits, and sequence numbers, epochs and call ids can be larger.
 */
class Writer {
  constructor(size = 64) {
    this.buf = new Uint8Array(size);
    this.len = 0;
  }

  _room(n) {
    if (this.len + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.len + n) size *= 2;
    const grown = new Uint8Array(size);
    grown.set(this.buf.subarray(0, this.len));
    this.buf = grown;
  }

  u8(v) {
    this._room(1);
    this.buf[this.len++] = v & 0xff;
    return this;
  }

  uv(v) {
    if (!Number.isSafeInteger(v) || v < 0) {
      throw new RangeError(`uv must be an integer in 0..2^53-1, got ${v}`);
    }
    this._room(10);
    while (v >= 0x80) {
      this.buf[this.len++] = (v % 0x80) | 0x80;
      v = Math.floor(v / 0x80);
    }
    this.buf[this.len++] = v;
    return this;
  }

  bytes(b) {
    this._room(b.length);
    this.buf.set(b, this.len);
    this.len += b.length;
    return this;
  }

  str(s) {
    const b = utf8Encoder.encode(s);
    return this.uv(b.length).bytes(b);
  }

  view() {
    return this.buf.subarray(0, this.len);
  }

  finish() {
    return this.buf.slice(0, this.len);
  }
}

/** Cursor over one message body (or a whole frame); every read checks the bounds. */
class Reader {
  constructor(bytes, start = 0, end = bytes.length) {
    this.buf = bytes;
    this.pos = start;
    this.end = end;
  }

  get remaining() {
    return this.end - this.pos;
  }

  u8() {
    if (this.pos >= this.end) throw new ProtocolError("truncated message: expected a byte");
    return this.buf[this.pos++];
  }

  /**
   * Unsigned LEB128 (§1). The protocol allows values below 2^64; this client works in JS numbers
   * and refuses anything above 2^53-1 rather than silently rounding it.
   */
  uv() {
    let value = 0;
    let scale = 1;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.end) throw new ProtocolError("truncated varint");
      const b = this.buf[this.pos++];
      value += (b & 0x7f) * scale;
      if (b < 0x80) {
        // A final zero group after the first byte adds nothing: an overlong encoding (§1).
        if (b === 0 && i > 0) throw new ProtocolError("overlong varint");
        if (value > Number.MAX_SAFE_INTEGER) {
          throw new ProtocolError("varint above 2^53-1: this client cannot represent it exactly");
        }
        return value;
      }
      scale *= 0x80;
    }
    throw new ProtocolError("varint longer than 10 bytes");
  }

  bytes(n) {
    if (n > this.end - this.pos) {
      throw new ProtocolError(`truncated: ${n} bytes announced, ${this.end - this.pos} left`);
    }
    const b = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return b;
  }

  str() {
    const b = this.bytes(this.uv());
    try {
      return utf8Decoder.decode(b);
    } catch {
      throw new ProtocolError("string is not valid UTF-8");
    }
  }

  rest() {
    const b = this.buf.subarray(this.pos, this.end);
    this.pos = this.end;
    return b;
  }
}

/**
 * Split a frame into its messages (§2) without interpreting bodies.
 * @param {Uint8Array} frame
 * @returns {{kind: number, compressed: boolean, body: Uint8Array}[]}
 */
function splitFrame(frame) {
  if (frame.length === 0) throw new ProtocolError("empty frame");
  const r = new Reader(frame);
  const out = [];
  while (r.remaining > 0) {
    const kindByte = r.u8();
    const len = r.uv();
    if (len > r.remaining) {
      throw new ProtocolError(`message length ${len} runs past the end of the frame`);
    }
    out.push({ kind: kindByte & 0x7f, compressed: (kindByte & COMPRESSED) !== 0, body: r.bytes(len) });
  }
  return out;
}

/**
 * Parse one server→client message body (§3). Fixed fields come first; `payload` is the `rest`
 * field and stays a view into the frame (still deflated when `compressed`). Trailing bytes after
 * the last fixed field of a non-payload kind are ignored, so a later minor version can append
 * fields.
 */
function parseServerMessage(kind, compressed, body) {
  if (compressed && !SERVER_COMPRESSIBLE.has(kind)) {
    throw new ProtocolError(`COMPRESSED flag on kind 0x${kind.toString(16)}, which is not compressible`);
  }
  const r = new Reader(body);
  switch (kind) {
    case Kind.WELCOME:
      return {
        kind, compressed,
        session: r.str(), resume: r.str(), heartbeatMs: r.uv(), maxFrame: r.uv(), resumed: r.u8(),
      };
    case Kind.PUSH:
      return { kind, compressed, topic: r.uv(), seq: r.uv(), payload: r.rest() };
    case Kind.RESULT:
      return { kind, compressed, call: r.uv(), status: r.u8(), payload: r.rest() };
    case Kind.STREAM:
      return { kind, compressed, call: r.uv(), last: r.u8(), payload: r.rest() };
    case Kind.SUBSCRIBED:
      return {
        kind, compressed,
        req: r.uv(), topic: r.uv(), mode: r.u8(), codec: r.u8(), epoch: r.uv(), head: r.uv(),
        recovered: r.u8(), name: r.str(),
      };
    case Kind.REJECTED:
      return { kind, compressed, req: r.uv(), code: r.uv(), reason: r.str() };
    case Kind.UNSUBSCRIBED:
      return { kind, compressed, topic: r.uv(), code: r.uv(), reason: r.str() };
    case Kind.GAP:
      return { kind, compressed, topic: r.uv(), from: r.uv(), count: r.uv() };
    case Kind.PONG:
      return { kind, compressed, token: r.uv() };
    case Kind.GOODBYE:
      return { kind, compressed, code: r.uv(), reason: r.str() };
    case Kind.FLOW:
      return { kind, compressed, fill: r.u8() };
    default:
      throw new ProtocolError(`not a server message kind: 0x${kind.toString(16)}`);
  }
}

/**
 * Decode a server frame into parsed messages. Unknown kinds are skipped (their length says how
 * far, §2); anything malformed throws ProtocolError.
 */
function decodeFrame(frame) {
  const out = [];
  for (const m of splitFrame(frame)) {
    if (!SERVER_KINDS.has(m.kind)) continue;
    out.push(parseServerMessage(m.kind, m.compressed, m.body));
  }
  return out;
}

/**
 * Parse one client→server message body (§4). The client never needs it; it is here so tests and
 * fake servers read client frames with the same code that writes them.
 */
function parseClientMessage(kind, compressed, body) {
  if (compressed && !CLIENT_COMPRESSIBLE.has(kind)) {
    throw new ProtocolError(`COMPRESSED flag on kind 0x${kind.toString(16)}, which is not compressible`);
  }
  const r = new Reader(body);
  switch (kind) {
    case Kind.HELLO:
      return { kind, version: r.uv(), resume: r.str() };
    case Kind.SUBSCRIBE:
      return {
        kind, compressed, req: r.uv(), name: r.str(), epoch: r.uv(), since: r.uv(), params: r.rest(),
      };
    case Kind.UNSUBSCRIBE:
      return { kind, topic: r.uv() };
    case Kind.CALL:
      return { kind, compressed, call: r.uv(), method: r.str(), payload: r.rest() };
    case Kind.ACK: {
      // Private topics carry `topic upto`, queue topics `topic n seq×n`: the wire alone cannot
      // tell them apart, so return the raw numbers and let the reader who knows the mode decide.
      const topic = r.uv();
      const rest = [];
      while (r.remaining > 0) rest.push(r.uv());
      return { kind, topic, numbers: rest };
    }
    case Kind.NACK:
      return { kind, topic: r.uv(), seq: r.uv(), requeue: r.u8() };
    case Kind.NAK:
      return { kind, fill: r.u8() };
    case Kind.PING:
      return { kind, token: r.uv() };
    case Kind.PUBLISH:
      return { kind, compressed, req: r.uv(), name: r.str(), payload: r.rest() };
    default:
      throw new ProtocolError(`not a client message kind: 0x${kind.toString(16)}`);
  }
}

function decodeClientFrame(frame) {
  const out = [];
  for (const m of splitFrame(frame)) {
    if (!CLIENT_KINDS.has(m.kind)) continue;
    out.push(parseClientMessage(m.kind, m.compressed, m.body));
  }
  return out;
}

/** `kind:u8 len:uv body` around a body built by `fill(writer)`. */
function message(kind, fill) {
  const body = new Writer();
  fill(body);
  const out = new Writer(body.len + 11);
  return out.u8(kind).uv(body.len).bytes(body.view()).finish();
}

/** Concatenate encoded messages (or frames) into one frame. */
function joinFrames(parts) {
  if (parts.length === 1) return parts[0];
  let size = 0;
  for (const p of parts) size += p.length;
  const out = new Uint8Array(size);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** Encoders of the client→server messages (§4); each returns one encoded message. */
const encode = Object.freeze({
  hello: (resume = "") => message(Kind.HELLO, (w) => w.uv(PROTOCOL_VERSION).str(resume)),
  subscribe: (req, name, epoch, since, params = EMPTY, compressed = false) =>
    message(Kind.SUBSCRIBE | (compressed ? COMPRESSED : 0),
      (w) => w.uv(req).str(name).uv(epoch).uv(since).bytes(params)),
  unsubscribe: (topic) => message(Kind.UNSUBSCRIBE, (w) => w.uv(topic)),
  call: (call, method, payload = EMPTY) =>
    message(Kind.CALL, (w) => w.uv(call).str(method).bytes(payload)),
  ackPrivate: (topic, upto) => message(Kind.ACK, (w) => w.uv(topic).uv(upto)),
  ackQueue: (topic, seqs) => message(Kind.ACK, (w) => {
    w.uv(topic).uv(seqs.length);
    for (const s of seqs) w.uv(s);
  }),
  nack: (topic, seq, requeue = true) =>
    message(Kind.NACK, (w) => w.uv(topic).uv(seq).u8(requeue ? 1 : 0)),
  nak: (fill) => message(Kind.NAK, (w) => w.u8(fill)),
  ping: (token) => message(Kind.PING, (w) => w.uv(token)),
});

async function pipeBytes(bytes, transform) {
  const stream = new Blob([bytes]).stream().pipeThrough(transform);
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/** Raw DEFLATE (RFC 1951, no zlib header) as the COMPRESSED flag means it (§2). */
function inflateRaw(bytes) {
  return pipeBytes(bytes, new DecompressionStream("deflate-raw"));
}

function deflateRaw(bytes) {
  return pipeBytes(bytes, new CompressionStream("deflate-raw"));
}

/** Decode a topic payload by the codec SUBSCRIBED announced. */
function decodePayload(codec, bytes) {
  switch (codec) {
    case Codec.JSON:
      return bytes.length ? JSON.parse(utf8Decoder.decode(bytes)) : undefined;
    case Codec.TEXT:
      return utf8Decoder.decode(bytes);
    default:
      // A copy, so a value the app keeps does not pin the whole received frame in memory.
      return bytes.slice();
  }
}

function encodeJson(value) {
  // "no args" travels as an empty payload, like SUBSCRIBE's empty params (§4).
  return value === undefined ? EMPTY : utf8Encoder.encode(JSON.stringify(value));
}

function decodeJson(bytes) {
  return bytes.length ? JSON.parse(utf8Decoder.decode(bytes)) : undefined;
}

/** The NAK level (§8) for an inbound queue of `length` items against `limit`: 0, 50, 75, 87, 100. */
function nakLevel(length, limit) {
  if (length >= limit) return 100;
  if (length >= limit * 0.87) return 87;
  if (length >= limit * 0.75) return 75;
  if (length >= limit * 0.5) return 50;
  return 0;
}

/**
 * Exponential backoff with jitter: 250 ms, 500 ms, 1 s … capped, each scaled by a random factor
 * in [0.5, 1) so that clients cut off together do not come back together.
 */
function backoffDelay(attempt, baseMs = 250, capMs = 5000, random = Math.random) {
  const ceiling = Math.min(capMs, baseMs * 2 ** Math.min(attempt, 20));
  return Math.round(ceiling * (0.5 + random() * 0.5));
}

// ---------------------------------------------------------------------------------------------
// Small runtime helpers
// ---------------------------------------------------------------------------------------------

const now = typeof performance !== "undefined" && performance.now
  ? () => performance.now()
  : () => Date.now();

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Yield to the event loop with a real task. A MessageChannel task is not clamped the way nested
 * setTimeout(0) is (4 ms), and lets WebSocket/fetch events run between delivery slices.
 */
let yieldQueue = null;
let yieldPort = null;
function yieldToEventLoop() {
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
function reportAppError(err) {
  if (typeof globalThis.reportError === "function") globalThis.reportError(err);
  else console.error(err);
}

function safeCall(fn, ...args) {
  if (typeof fn !== "function") return undefined;
  try {
    return fn(...args);
  } catch (err) {
    reportAppError(err);
    return undefined;
  }
}

/** Messages per second over a sliding window of ~2 s, in 200 ms buckets. */
class RateMeter {
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
function resolveUrls(url) {
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

// ---------------------------------------------------------------------------------------------
// 2. Transports
//
// Both have the same shape: start(helloFrame), send(frame), sendUrgent(frame), close(), backlog,
// kind. They report to the client through _onFrame(conn, bytes), _onConnLost(conn, info) and
// (long-poll only) _onConnStalled(conn, stalled). A transport never reconnects by itself beyond
// what its own contract asks (long-poll retries a lost poll with the same ack, §7); deciding
// what comes next is the client's job.
// ---------------------------------------------------------------------------------------------

class WebSocketConnection {
  constructor(client, url) {
    this.client = client;
    this.url = url;
    this.kind = "websocket";
    this.ws = null;
    this.dead = false;
  }

  start(hello) {
    let ws;
    try {
      ws = new this.client._opts.WebSocket(this.url, SUBPROTOCOL);
    } catch (err) {
      // e.g. a blocked port or a bad URL: report asynchronously, like a failed connection.
      queueMicrotask(() => this._lost({ reason: `cannot open WebSocket: ${err.message}` }));
      return;
    }
    this.ws = ws;
    ws.binaryType = "arraybuffer";
    ws.onopen = () => {
      if (!this.dead) ws.send(hello);
    };
    ws.onmessage = (ev) => {
      if (this.dead) return;
      if (typeof ev.data === "string") {
        this.client._protocolError(this, "text WebSocket message (rubris is binary only)");
        return;
      }
      this.client._onFrame(this, new Uint8Array(ev.data));
    };
    // An error is always followed by close, which carries the code; nothing to do here.
    ws.onerror = () => {};
    ws.onclose = (ev) => this._lost({ closeCode: ev.code, reason: ev.reason || `WebSocket closed (${ev.code})` });
  }

  get backlog() {
    return this.ws ? this.ws.bufferedAmount : 0;
  }

  send(frame) {
    if (!this.dead && this.ws && this.ws.readyState === 1) this.ws.send(frame);
  }

  sendUrgent(frame) {
    this.send(frame);
  }

  close(code = 1000, reason = "") {
    if (this.dead) return;
    this.dead = true;
    const ws = this.ws;
    if (!ws) return;
    ws.onopen = ws.onmessage = ws.onclose = null;
    try {
      ws.close(code, reason.slice(0, 60)); // a close reason is limited to 123 UTF-8 bytes
    } catch {
      // already closing
    }
  }

  _lost(info) {
    if (this.dead) return;
    this.close();
    this.client._onConnLost(this, info);
  }
}

/** How long a poll may hang before we assume an intermediary ate it (server default wait: 25 s). */
const LP_POLL_ABORT_MS = 60_000;
/** How long the first POST (HELLO → WELCOME) may take. */
const LP_OPEN_TIMEOUT_MS = 20_000;
/** How long a client frame POST may take before it is retried. */
const LP_POST_TIMEOUT_MS = 20_000;
/** Give up retrying a poll or POST after this long: the server drops the session at 30 s anyway. */
const LP_GIVE_UP_MS = 25_000;

class LongPollConnection {
  constructor(client, urls) {
    this.client = client;
    this.urls = urls;
    this.kind = "longpoll";
    this.session = null;
    this.ack = 0;
    this.dead = false;
    this.queue = []; // {bytes, count}: frames waiting for the POST in flight to finish
    this.queued = 0; // messages in `queue`
    this.posting = false;
    this.controllers = new Set();
    this.handover = null; // called instead of the next poll once nothing is in flight
  }

  /** Stop at the next point with no poll waiting and no POST in flight or queued; call `fn`. */
  handOver(fn) {
    this.handover = fn;
  }

  get backlog() {
    return this.queued;
  }

  async _fetch(url, init, timeoutMs) {
    const controller = new AbortController();
    this.controllers.add(controller);
    const timer = setTimeout(() => controller.abort(), timeoutMs);
    try {
      return await this.client._opts.fetch(url, { ...init, signal: controller.signal });
    } finally {
      clearTimeout(timer);
      this.controllers.delete(controller);
    }
  }

  _sessionUrl(extra = "") {
    const q = [extra, this.urls.query].filter(Boolean).join("&");
    return this.urls.lpSession(this.session) + (q ? `?${q}` : "");
  }

  async start(hello) {
    let res;
    let body;
    try {
      res = await this._fetch(this.urls.lpOpen, {
        method: "POST",
        body: hello,
        headers: { "Content-Type": "application/octet-stream" },
        cache: "no-store",
      }, LP_OPEN_TIMEOUT_MS);
      if (this.dead) return;
      if (res.status !== 200) {
        this._lost(httpFailure(res.status, "long-poll open"));
        return;
      }
      body = new Uint8Array(await res.arrayBuffer());
    } catch (err) {
      this._lost({ reason: `long-poll open failed: ${err.message}` });
      return;
    }
    if (this.dead) return;
    // The session id is inside WELCOME (§7); read it here so polling can start. The client
    // parses the same messages again through the ordinary path.
    let messages;
    try {
      messages = decodeFrame(body);
    } catch (err) {
      this.client._protocolError(this, err.message);
      return;
    }
    const first = messages[0];
    if (first && first.kind === Kind.WELCOME) this.session = first.session;
    this.client._onFrame(this, body, messages);
    if (this.dead || this.session === null) return;
    this._poll();
    this._pump();
  }

  async _poll() {
    let failingSince = 0;
    let attempt = 0;
    const retry = async (reason) => {
      // The same ack again: the server re-sends frame ack+1, so a lost response loses nothing.
      if (!failingSince) {
        failingSince = now();
        this.client._onConnStalled(this, true);
      }
      if (now() - failingSince > LP_GIVE_UP_MS) {
        this._lost({ reason: `long-poll unreachable: ${reason}` });
        return false;
      }
      await sleep(backoffDelay(attempt++));
      return !this.dead;
    };
    while (!this.dead) {
      if (this.handover) {
        await sleep(0); // what the frame just handled made the client write goes out first
        if (this.dead) return;
        if (this.handover && !this.posting && !this.queue.length) {
          const fn = this.handover;
          this.handover = null;
          fn();
          return;
        }
      }
      let res;
      let body = null;
      try {
        res = await this._fetch(this._sessionUrl(`ack=${this.ack}`), {
          method: "GET",
          cache: "no-store",
        }, LP_POLL_ABORT_MS);
        if (res.status === 200) body = new Uint8Array(await res.arrayBuffer());
      } catch (err) {
        if (this.dead || !(await retry(err.message))) return;
        continue;
      }
      if (this.dead) return;
      if (res.status >= 500 || res.status === 429) {
        if (!(await retry(`HTTP ${res.status}`))) return;
        continue;
      }
      if (res.status !== 200 && res.status !== 204) {
        // Before un-stalling: a 404 after an outage (a restarted server) is not "open again".
        this._lost(httpFailure(res.status, "long-poll"));
        return;
      }
      if (failingSince) {
        failingSince = 0;
        attempt = 0;
        this.client._onConnStalled(this, false);
      }
      if (res.status === 204) continue; // the poll timed out with nothing to send: poll again
      const number = Number(res.headers.get("Rubris-Frame"));
      if (!Number.isSafeInteger(number) || number < 1) {
        this.client._protocolError(this, "long-poll response without a valid Rubris-Frame header");
        return;
      }
      if (number <= this.ack) continue; // a frame we already have, re-sent after a lost response
      this.ack = number;
      if (body.length) this.client._onFrame(this, body);
    }
  }

  send(frame, count = 1) {
    if (this.dead) return;
    this.queue.push({ bytes: frame, count });
    this.queued += count;
    this._pump();
  }

  /** For page unload: a keepalive POST outlives the page; ordering does not matter for ACKs. */
  sendUrgent(frame) {
    if (this.dead || this.session === null) return;
    this.client._opts.fetch(this._sessionUrl(), {
      method: "POST",
      body: frame,
      headers: { "Content-Type": "application/octet-stream" },
      keepalive: true,
    }).catch(() => {});
  }

  /**
   * One POST at a time, so that client messages reach the server in the order they were sent
   * (a SUBSCRIBE before its UNSUBSCRIBE); whatever queued meanwhile goes in the next POST.
   */
  async _pump() {
    if (this.posting || this.dead || this.session === null) return;
    this.posting = true;
    try {
      while (!this.dead && this.queue.length) {
        const max = this.client._maxFrame;
        // Frames are message sequences, so frames back to back are one valid frame (§2).
        const first = this.queue.shift();
        const parts = [first.bytes];
        let size = first.bytes.length;
        while (this.queue.length && size + this.queue[0].bytes.length <= max) {
          size += this.queue[0].bytes.length;
          parts.push(this.queue.shift().bytes);
        }
        const body = joinFrames(parts);
        let failingSince = 0;
        let attempt = 0;
        for (;;) {
          let res;
          try {
            res = await this._fetch(this._sessionUrl(), {
              method: "POST",
              body,
              headers: { "Content-Type": "application/octet-stream" },
              cache: "no-store",
            }, LP_POST_TIMEOUT_MS);
          } catch (err) {
            res = { status: 0, error: err };
          }
          if (this.dead) return;
          if (res.status >= 200 && res.status < 300) break;
          if (res.status === 0 || res.status >= 500 || res.status === 429) {
            // Retried as is: the protocol has no client frame numbers, so a POST whose 202 was
            // lost may arrive twice. Network errors almost always mean it never arrived.
            failingSince ||= now();
            if (now() - failingSince > LP_GIVE_UP_MS) {
              this._lost({ reason: `long-poll POST failed: ${res.error?.message ?? `HTTP ${res.status}`}` });
              return;
            }
            await sleep(backoffDelay(attempt++));
            if (this.dead) return;
            continue;
          }
          this._lost(httpFailure(res.status, "long-poll POST"));
          return;
        }
        this.queued = this.queue.reduce((n, f) => n + f.count, 0);
      }
      this.queued = 0;
    } finally {
      this.posting = false;
    }
  }

  close() {
    if (this.dead) return;
    this.dead = true;
    for (const c of this.controllers) c.abort();
    this.controllers.clear();
    this.queue = [];
    this.queued = 0;
  }

  _lost(info) {
    if (this.dead) return;
    this.close();
    this.client._onConnLost(this, info);
  }
}

/** What an HTTP status means to the client (§7). */
function httpFailure(status, what) {
  switch (status) {
    case 401:
    case 403:
      return { fatal: true, code: ErrorCode.NOT_AUTHORISED, status, reason: `${what}: not authorised (HTTP ${status})` };
    case 404:
      return { ended: true, status, reason: `${what}: session ended (HTTP 404)` };
    case 409:
      return { superseded: true, status, reason: `${what}: superseded by another poll (HTTP 409)` };
    case 400:
      return { protocol: true, status, reason: `${what}: server refused the frame as malformed (HTTP 400)` };
    case 413:
      return { protocol: true, status, reason: `${what}: frame too large (HTTP 413)` };
    default:
      return { status, reason: `${what}: HTTP ${status}` };
  }
}

// ---------------------------------------------------------------------------------------------
// 3. The client
// ---------------------------------------------------------------------------------------------

const DEFAULTS = Object.freeze({
  transport: "auto",
  reconnect: true,
  wsOpenTimeoutMs: 4000,
  ackEvery: 32,
  ackMs: 200,
  inboundLimit: 2048,
  compressSubscribe: false,
  callTimeoutMs: 30_000,
  maxPending: 1000,
  backoffMaxMs: 5000,
  WebSocket: undefined,
  fetch: undefined,
});

/** Work per delivery slice before yielding to the event loop (rendering, input, sockets). */
const SLICE_MS = 8;
/** Minimum spacing of repeated NAKs while the inbound queue stays full (§8). */
const NAK_REPEAT_MS = 100;
/** Two WebSocket drops without a byte of data within this window mean "something kills them". */
const BAD_DROP_WINDOW_MS = 30_000;
/** A connection that lived this long resets the backoff. */
const STABLE_MS = 10_000;
/** Backoff of the WebSocket probes while long-poll stands in for a WebSocket that had worked. */
const UPGRADE_BASE_MS = 1000;
const UPGRADE_MAX_MS = 60_000;
/** Stop accepting calls while the WebSocket's own send buffer holds more than this. */
const WS_BUFFER_LIMIT = 16 * 1024 * 1024;
/** Items a streamIter buffers before delivery waits for its consumer. */
const STREAM_ITER_BUFFER = 256;
/** Params shorter than this are not worth deflating. */
const COMPRESS_MIN = 64;
const DEFAULT_MAX_FRAME = 1 << 20;

/**
 * One subscription on the wire. Several app Subscriptions to the same name and params share one,
 * because the server gives a topic one number per session (§3) and cannot tell two subscribers of
 * the same topic in one session apart.
 */
class WireSubscription {
  constructor(key, name, params) {
    this.key = key;
    this.name = name;
    this.params = params; // JSON bytes, or EMPTY
    this.wireParams = params; // what SUBSCRIBE carries (maybe deflated)
    this.wireCompressed = false;
    this.paramsReady = null; // a Promise while the params are being deflated
    this.state = "unsent"; // unsent → pending → active → closed
    this.closing = false; // no listener left; unsubscribe once SUBSCRIBED names the topic
    this.reqs = new Set(); // SUBSCRIBE req ids this subscription waits on
    this.topic = null;
    this.mode = 0;
    this.codec = 0;
    this.epoch = null;
    this.info = null;
    this.lastSeq = 0; // highest seq received (duplicate filter; `since` for ring recovery)
    this.delivered = 0; // highest private seq the app has seen (what ACK reports)
    this.acked = 0;
    this.unacked = 0;
    this.queueDone = []; // queue-topic seqs processed, not yet ACKed
    this.incarnation = 0; // bumps when seq numbering restarts, so stale items cannot ACK
    this.queued = null; // the snapshot item waiting in the inbound queue (conflation target)
    this.last = null; // {value, meta}: the latest snapshot value, for listeners that join later
    this.listeners = new Set();
    this.joining = new Set(); // Subscriptions that have not seen onSubscribed yet
  }

  resetNumbering() {
    this.lastSeq = 0;
    this.delivered = 0;
    this.acked = 0;
    this.unacked = 0;
    this.queueDone = [];
    this.incarnation++;
  }
}

/**
 * A connection to a rubris server that survives network trouble: it picks a transport, resumes
 * or re-creates its session after a drop, and keeps subscriptions, ACKs and flow control going.
 *
 * Events (see {@link RubrisClient#on}):
 * - `"state"`: `{state, transport, resumed}` whenever `state` changes (and at every WELCOME).
 * - `"gap"`: `{name, from, count}`: messages of a ring topic that will never arrive.
 * - `"error"`: `{code, message}`: protocol trouble, refused frames, a fatal stop.
 * - `"goodbye"`: `{code, reason}`: the server is closing the session (§3 GOODBYE).
 * - `"flow"`: `{fill}`: the server's ingest fill (only relevant to publishing clients).
 */
export class RubrisClient {
  /**
   * Starts connecting at once; usually created through {@link connect}.
   *
   * @param {string} [url="/rubris"] Where the plugin is mounted; relative to the page, or absolute
   *   (http(s):// or ws(s)://). A query string is sent to every endpoint.
   * @param {object} [options]
   * @param {"auto"|"websocket"|"longpoll"} [options.transport="auto"] "auto" tries WebSocket and
   *   falls back to long-poll when WebSockets do not get through: for good if no WebSocket has
   *   worked on this page yet; otherwise until a WebSocket opens again (probed with backoff).
   * @param {boolean} [options.reconnect=true] Reconnect (and resume) after a drop.
   * @param {number} [options.wsOpenTimeoutMs=4000] Time for a WebSocket to reach WELCOME.
   * @param {number} [options.ackEvery=32] ACK a private topic after this many messages…
   * @param {number} [options.ackMs=200] …or this long after the first unacknowledged one.
   * @param {number} [options.inboundLimit=2048] Inbound queue size that NAK percentages refer to.
   * @param {boolean} [options.compressSubscribe=false] Deflate large SUBSCRIBE params.
   * @param {number} [options.callTimeoutMs=30000] Reject a call with no answer (or, for a stream,
   *   no item) for this long; 0 waits forever. A call lost with a dropped connection cannot
   *   otherwise be told apart from a slow one.
   * @param {number} [options.maxPending=1000] Messages kept while disconnected; beyond it calls
   *   reject with code 6.
   * @param {number} [options.backoffMaxMs=5000] Cap of the reconnect backoff.
   * @param {Function} [options.WebSocket] WebSocket constructor (default: the global one).
   * @param {Function} [options.fetch] fetch implementation (default: the global one).
   */
  constructor(url = "/rubris", options = {}) {
    const opts = { ...DEFAULTS, ...options };
    opts.WebSocket ??= globalThis.WebSocket;
    opts.fetch ??= globalThis.fetch?.bind(globalThis);
    if (!["auto", "websocket", "longpoll"].includes(opts.transport)) {
      throw new TypeError(`transport must be "auto", "websocket" or "longpoll", got ${JSON.stringify(opts.transport)}`);
    }
    if (opts.transport === "auto" && !opts.WebSocket) opts.transport = "longpoll";
    this._opts = opts;
    this._urls = resolveUrls(url);
    this._events = new Map();

    /** @type {"connecting"|"open"|"reconnecting"|"closed"} */
    this.state = "connecting";
    /** @type {"websocket"|"longpoll"|null} The transport of the current (or last) connection. */
    this.transport = null;
    /** Whether the last WELCOME resumed the previous session (subscriptions intact). */
    this.resumed = false;
    /** @type {string|null} */
    this.sessionId = null;

    this._resume = ""; // resume token from the last WELCOME
    this._conn = null;
    this._welcomed = false; // the current connection has seen WELCOME
    this._sessionGen = 0; // bumps at every new (not resumed) session
    this._everOpen = false;
    this._attempt = 0;
    this._reconnectTimer = null;
    this._fallback = false; // auto: WebSockets do not work here; long-poll did
    this._tryLongPoll = false; // auto: the last WebSocket attempt failed; try long-poll next
    this._badDrops = [];
    this._wsWorked = false; // auto: a WebSocket here has carried data
    this._upgradeTimer = null; // auto: next probe for a way back from long-poll to WebSocket
    this._upgradeAttempt = 0;
    this._probe = null; // {ws, timer}: the probe WebSocket being opened
    this._heartbeatMs = 0;
    this._maxFrame = DEFAULT_MAX_FRAME;
    this._hbTimer = null;
    this._lastRx = 0;
    this._lastPing = 0;
    this._pingToken = 0;
    this._pingSent = new Map(); // token → time, for the RTT

    this._nextReq = 1;
    this._nextCall = 1;
    this._wires = new Map(); // key → WireSubscription the app holds
    this._byTopic = new Map(); // topic number → WireSubscription (active)
    this._byReq = new Map(); // SUBSCRIBE req → WireSubscription
    this._unsubPending = new Set(); // topics we UNSUBSCRIBEd; their UNSUBSCRIBED(code 0) is expected
    this._calls = new Map(); // call id → call record

    this._outbox = []; // entries waiting for a connection
    this._tx = []; // entries to write on this connection at the end of the current task
    this._txScheduled = false;

    this._inbox = []; // inbound items in arrival order, drained into app callbacks in slices
    this._inboxHead = 0;
    this._draining = false;

    this._nakLevel = 0; // level of the inbound queue now
    this._nakPeak = 0; // strongest level since the last NAK
    this._nakSentLevel = 0;
    this._nakSentAt = -Infinity;
    this._nakTimer = null;

    this._ackTimer = null;
    this._ackDirty = new Set();

    this._counters = { frames: 0, messages: 0, bytesIn: 0, compressed: 0, bytesSaved: 0, gaps: 0, naks: 0 };
    this._rtt = null;
    this._rate = new RateMeter();

    this._installPageHooks();
    this._connect();
  }

  // ----- public API --------------------------------------------------------------------------

  /**
   * Listen to a client event ("state", "gap", "error", "goodbye", "flow").
   * @param {string} event
   * @param {(detail: object) => void} fn
   * @returns {RubrisClient} this, for chaining
   */
  on(event, fn) {
    if (!this._events.has(event)) this._events.set(event, new Set());
    this._events.get(event).add(fn);
    return this;
  }

  /** Remove a listener added with {@link RubrisClient#on}. */
  off(event, fn) {
    this._events.get(event)?.delete(fn);
    return this;
  }

  /**
   * Counters since the client was created.
   * @returns {{frames: number, messages: number, bytesIn: number, compressed: number,
   *   bytesSaved: number, messagesPerSecond: number, gaps: number, naks: number,
   *   inbound: number, pending: number, rttMs: number|null}}
   *   `messages` counts every protocol message received; `compressed` those that came deflated;
   *   `bytesSaved` is inflated minus compressed bytes; `inbound` the queue not yet delivered;
   *   `pending` the messages waiting for a connection.
   */
  get stats() {
    return {
      ...this._counters,
      messagesPerSecond: Math.round(this._rate.rate() * 10) / 10,
      inbound: this._inbox.length - this._inboxHead,
      pending: this._outbox.length + this._tx.length,
      rttMs: this._rtt,
    };
  }

  /**
   * Subscribe to a topic. The subscription is kept across reconnects: after a resumed session it
   * simply continues; after a new session it is made again (ring topics ask to replay from the
   * last seq received, and `onSubscribed` reports whether that replay was complete).
   *
   * @param {string} name Topic name, e.g. "prices.AAPL".
   * @param {(value: any, meta: {name: string, seq: number, compressed: boolean}) => any} callback
   *   Called for every message, in order. The value is decoded by the topic's codec: JSON →
   *   parsed value, bytes → Uint8Array, text → string. For queue topics the item is ACKed when
   *   the callback returns (or its promise resolves) and given back (NACK) when it throws.
   * @param {object} [opts]
   * @param {any} [opts.params] JSON params for the server's subscribe handler.
   * @param {(gap: {from: number, count: number}) => void} [opts.onGap] Messages lost for good.
   * @param {(info: {mode: number, codec: number, epoch: number, head: number, recovered: boolean}) => void} [opts.onSubscribed]
   *   Called at every SUBSCRIBED, including the re-subscribe after a new session.
   * @param {(err: {code: number, reason: string}) => void} [opts.onError] The server refused.
   * @param {(why: {code: number, reason: string}) => void} [opts.onUnsubscribed] The server
   *   ended the subscription (code from §9).
   * @returns {Subscription}
   */
  subscribe(name, callback, opts = {}) {
    const sub = new Subscription(this, name, callback, opts);
    if (this.state === "closed") {
      sub._fail(new RubrisError("client is closed", ErrorCode.CLOSED));
      return sub;
    }
    const params = encodeJson(opts.params);
    const key = `${name}\u0000${opts.params === undefined ? "" : JSON.stringify(opts.params)}`;
    let wire = this._wires.get(key);
    if (!wire) {
      wire = new WireSubscription(key, name, params);
      this._wires.set(key, wire);
      this._prepareParams(wire);
      if (this._welcomed) this._sendSubscribe(wire);
    } else if (wire.closing) {
      wire.closing = false; // the app changed its mind before the server answered
    }
    sub._wire = wire;
    wire.joining.add(sub);
    if (wire.state === "active") {
      // Join behind whatever is already queued, so the new listener starts at a clean point.
      this._enqueue({ t: "fn", fn: () => this._join(wire, sub) });
    }
    return sub;
  }

  /**
   * Call a server method.
   * @param {string} method
   * @param {any} [args] JSON-serialisable arguments (omitted: an empty payload).
   * @returns {Promise<any>} the JSON result; rejects with {@link RubrisError}.
   */
  call(method, args) {
    return this._startCall(method, args, null);
  }

  /**
   * Call a streamed method; `onItem` gets each item in order.
   * @param {string} method
   * @param {any} args
   * @param {(item: any) => void} onItem
   * @returns {Promise<void>} resolves when the stream ends; rejects with {@link RubrisError}.
   */
  stream(method, args, onItem) {
    return this._startCall(method, args, { onItem });
  }

  /**
   * A streamed call as an async iterable: `for await (const item of client.streamIter(m, a))`.
   * Breaking out of the loop stops delivery (the server is not told: the protocol has no cancel).
   * Delivery of everything else waits while the loop lags more than 256 items behind, so that
   * memory stays bounded; consume promptly.
   * @param {string} method
   * @param {any} args
   * @returns {AsyncIterableIterator<any>}
   */
  streamIter(method, args) {
    const buffer = [];
    let finished = false;
    let failure = null;
    let wake = null; // resolves the consumer waiting for an item
    let space = null; // resolves delivery waiting for room in the buffer
    const pulse = () => {
      const w = wake;
      wake = null;
      w?.();
    };
    const freeSpace = () => {
      const s = space;
      space = null;
      s?.();
    };
    const hooks = {
      onItem: (item) => {
        buffer.push(item);
        pulse();
      },
      backpressure: () => (buffer.length >= STREAM_ITER_BUFFER
        ? new Promise((resolve) => { space = resolve; })
        : null),
    };
    const done = this._startCall(method, args, hooks);
    done.then(() => { finished = true; pulse(); }, (err) => { failure = err; pulse(); });
    const iterator = {
      [Symbol.asyncIterator]() {
        return iterator;
      },
      async next() {
        for (;;) {
          if (buffer.length) {
            const value = buffer.shift();
            if (buffer.length < STREAM_ITER_BUFFER) freeSpace();
            return { value, done: false };
          }
          if (failure) {
            const err = failure;
            failure = null;
            finished = true;
            throw err;
          }
          if (finished) return { value: undefined, done: true };
          await new Promise((resolve) => { wake = resolve; });
        }
      },
      return: async () => {
        finished = true;
        buffer.length = 0;
        hooks.cancelled = true;
        freeSpace();
        return { value: undefined, done: true };
      },
    };
    return iterator;
  }

  /**
   * Close for good: ACKs what was delivered, fails pending calls, and stops reconnecting.
   * Subscriptions end without callbacks.
   */
  close() {
    if (this.state === "closed") return;
    this._flushAcks(true);
    this._shutdown(null);
  }

  // ----- connection lifecycle ----------------------------------------------------------------

  _chooseTransport() {
    if (this._opts.transport !== "auto") return this._opts.transport;
    return this._fallback || this._tryLongPoll ? "longpoll" : "websocket";
  }

  _connect() {
    this._reconnectTimer = null;
    if (this.state === "closed") return;
    const kind = this._chooseTransport();
    const conn = kind === "websocket"
      ? new WebSocketConnection(this, this._urls.ws)
      : new LongPollConnection(this, this._urls);
    conn.framesAfterWelcome = 0;
    this._conn = conn;
    this._welcomed = false;
    this.transport = kind;
    if (kind === "websocket") {
      // Counted to WELCOME, not to `open`: a proxy may complete the upgrade and pass nothing.
      conn.openTimer = setTimeout(() => {
        if (this._conn === conn && !this._welcomed) {
          this._dropConn(conn, { reason: `no WELCOME within ${this._opts.wsOpenTimeoutMs} ms` });
        }
      }, this._opts.wsOpenTimeoutMs);
    }
    conn.start(encode.hello(this._resume));
  }

  _dropConn(conn, info) {
    conn.close(info.protocol ? 4001 : 1000, info.reason ?? "");
    this._onConnLost(conn, info);
  }

  _protocolError(conn, message) {
    if (conn !== this._conn) return;
    this._emit("error", { code: ErrorCode.PROTOCOL, message: `protocol error: ${message}` });
    this._dropConn(conn, { protocol: true, reason: message });
  }

  _onConnStalled(conn, stalled) {
    if (conn !== this._conn || !this._welcomed) return;
    this._setState(stalled ? "reconnecting" : "open");
  }

  _onConnLost(conn, info) {
    if (conn !== this._conn) return;
    this._cancelUpgrade();
    clearTimeout(conn.openTimer);
    clearInterval(this._hbTimer);
    this._hbTimer = null;
    const wasWelcomed = this._welcomed;
    this._conn = null;
    this._welcomed = false;
    if (this.state === "closed") return;
    if (info.protocol && info.status) {
      this._emit("error", { code: ErrorCode.PROTOCOL, message: info.reason });
    }
    if (info.fatal) {
      this._shutdown(new RubrisError(info.reason, info.code ?? ErrorCode.NOT_AUTHORISED));
      return;
    }
    if (!this._opts.reconnect) {
      this._shutdown(new RubrisError(`connection lost: ${info.reason}`, ErrorCode.CLOSED));
      return;
    }

    let delay;
    const auto = this._opts.transport === "auto";
    if (auto && conn.kind === "websocket" && !info.goodbye) {
      if (!wasWelcomed) {
        // Never got through: try long-poll at once.
        this._tryLongPoll = true;
        delay = 0;
      } else if (conn.framesAfterWelcome === 0) {
        // Upgraded, welcomed, then cut before a single frame of data: twice in a short while
        // looks like a proxy that kills WebSockets.
        const t = now();
        this._badDrops = this._badDrops.filter((at) => t - at < BAD_DROP_WINDOW_MS);
        this._badDrops.push(t);
        if (this._badDrops.length >= 2) {
          this._tryLongPoll = true;
          this._badDrops = [];
          this._wsWorked = false; // handshakes get through, the connections do not: stay off
          delay = 0;
        }
      }
    } else if (auto && conn.kind === "longpoll" && !wasWelcomed && !this._fallback) {
      // Long-poll failed too, so the server is probably down: go back to trying WebSocket first.
      this._tryLongPoll = false;
    }
    if (info.superseded) {
      // Someone else polls this session. Resuming it would take it back and start a tug of war;
      // a fresh session leaves the other poller alone.
      this._resume = "";
    }
    if (wasWelcomed && now() - conn.welcomedAt > STABLE_MS) {
      this._attempt = 0;
      if (conn.kind === "websocket") this._upgradeAttempt = 0;
    }
    if (delay === undefined) {
      const slow = info.goodbye && (info.goodbye.code === 9 || info.goodbye.code === 7);
      // 1013 try again later, 1012 service restart (uvicorn closes with it on shutdown, before
      // the app could say GOODBYE): give the server a second before knocking again.
      if (slow || info.closeCode === 1013 || info.closeCode === 1012) this._attempt = Math.max(this._attempt, 2);
      delay = backoffDelay(this._attempt++, 250, this._opts.backoffMaxMs);
    }
    this._setState(this._everOpen ? "reconnecting" : "connecting");
    this._reconnectTimer = setTimeout(() => this._connect(), delay);
  }

  _onWelcome(conn, w) {
    clearTimeout(conn.openTimer);
    conn.welcomedAt = now();
    // resumed=1 only means something if we asked to resume.
    const resumed = w.resumed === 1 && this._resume !== "" && this._sessionGen > 0;
    this._welcomed = true;
    this._everOpen = true;
    this._resume = w.resume;
    this.sessionId = w.session;
    this._heartbeatMs = w.heartbeatMs;
    this._maxFrame = w.maxFrame > 0 ? w.maxFrame : DEFAULT_MAX_FRAME;
    this.resumed = resumed;
    // Long-poll got through where a WebSocket did not. If WebSockets never worked here, they are
    // blocked: stay on long-poll. If they did, the server was more likely down (restarting) when
    // the WebSocket failed and back up a moment later: long-poll carries the session for now, and
    // _scheduleUpgrade takes it back to a WebSocket once one opens again.
    if (conn.kind === "longpoll" && this._tryLongPoll && !this._wsWorked) this._fallback = true;
    this._tryLongPoll = false;
    if (resumed) this._resumeSession();
    else this._newSession();
    this._setState("open", true);
    if (this._conn !== conn) return; // a "state" listener closed the client

    // Everything the server does not know about yet, in one batch: SUBSCRIBEs first, then what
    // the app sent while we were away (calls, unsubscribes of a resumed session).
    for (const wire of this._wires.values()) {
      if (wire.state === "unsent") this._sendSubscribe(wire);
    }
    const waiting = this._outbox;
    this._outbox = [];
    for (const entry of waiting) this._write(entry);
    if (resumed) this._flushAcks(false);
    // one PING at once, so the round-trip time is known from the start (stats.rttMs)
    this._sendPing();

    if (conn.kind === "websocket" && this._heartbeatMs > 0) {
      this._lastRx = now();
      const tick = Math.max(50, Math.floor(this._heartbeatMs / 2));
      this._hbTimer = setInterval(() => this._heartbeat(conn), tick);
    }
    if (conn.kind === "longpoll" && this._opts.transport === "auto" && !this._fallback) {
      this._scheduleUpgrade(conn);
    }
  }

  // ----- back from long-poll to WebSocket (auto) ---------------------------------------------

  /**
   * Long-poll stands in for a WebSocket that failed after WebSockets had worked. Now and then
   * (backing off to a minute) open a bare WebSocket, without HELLO, to see whether they get
   * through again; when one opens, the session moves to a WebSocket connection by a resume.
   */
  _scheduleUpgrade(conn) {
    clearTimeout(this._upgradeTimer);
    const delay = backoffDelay(this._upgradeAttempt++, UPGRADE_BASE_MS, UPGRADE_MAX_MS);
    this._upgradeTimer = setTimeout(() => this._probeWebSocket(conn), delay);
  }

  _probeWebSocket(conn) {
    this._upgradeTimer = null;
    if (conn !== this._conn || !this._welcomed) return;
    let ws;
    try {
      ws = new this._opts.WebSocket(this._urls.ws, SUBPROTOCOL);
    } catch {
      this._scheduleUpgrade(conn);
      return;
    }
    const probe = { ws, timer: null };
    const finish = (opened) => {
      if (this._probe !== probe) return;
      this._endProbe();
      if (conn !== this._conn || !this._welcomed) return;
      // Moved between two polls, with no POST in flight: nothing is lost on the way.
      if (opened) conn.handOver(() => this._upgrade(conn));
      else this._scheduleUpgrade(conn);
    };
    this._probe = probe;
    ws.onopen = () => finish(true);
    ws.onerror = () => {};
    ws.onclose = () => finish(false);
    probe.timer = setTimeout(() => finish(false), this._opts.wsOpenTimeoutMs);
  }

  _endProbe() {
    const probe = this._probe;
    if (!probe) return;
    this._probe = null;
    clearTimeout(probe.timer);
    const ws = probe.ws;
    ws.onopen = ws.onclose = ws.onerror = null;
    try {
      ws.close(1000, "probe");
    } catch {
      // already closing
    }
  }

  _cancelUpgrade() {
    clearTimeout(this._upgradeTimer);
    this._upgradeTimer = null;
    this._endProbe();
  }

  /** Called by the long-poll connection when nothing is in flight either way. */
  _upgrade(conn) {
    if (conn !== this._conn || !this._welcomed || this.state === "closed") return;
    conn.close();
    this._conn = null;
    this._welcomed = false;
    this._tryLongPoll = false;
    this._connect(); // auto picks a WebSocket now; HELLO carries the resume token
  }

  /** The server kept our session: only what may have been lost in flight needs repeating. */
  _resumeSession() {
    for (const wire of [...this._wires.values()]) {
      if (wire.state !== "pending") continue;
      if (wire.closing) {
        // Unwanted anyway; a late SUBSCRIBED for its req still triggers the UNSUBSCRIBE.
        wire.state = "closed";
        this._wires.delete(wire.key);
      } else {
        // The SUBSCRIBE may have died with the connection: ask again. If both answers come,
        // the second one is ignored (_onSubscribed).
        wire.state = "unsent";
      }
    }
  }

  /** A new session: nothing the server knew about us survives. */
  _newSession() {
    this._sessionGen++;
    const lost = new RubrisError(
      "the session was lost with the connection; the call may or may not have run",
      ErrorCode.SESSION_EXPIRED,
    );
    for (const rec of [...this._calls.values()]) {
      if (rec.sent) this._failCall(rec, lost);
    }
    this._byTopic.clear();
    this._byReq.clear();
    this._unsubPending.clear();
    this._ackDirty.clear();
    clearTimeout(this._ackTimer);
    this._ackTimer = null;
    for (const wire of [...this._wires.values()]) {
      if (wire.closing) {
        wire.state = "closed";
        this._wires.delete(wire.key);
        continue;
      }
      wire.state = "unsent";
      wire.topic = null;
      wire.reqs.clear();
      // A new session has new private and queue state; ring and snapshot numbering belongs to
      // the topic and survives (that is what epoch + since recover).
      if (wire.mode === Mode.PRIVATE || wire.mode === Mode.QUEUE) wire.resetNumbering();
    }
    this._outbox = this._outbox.filter((e) => e.keep === "always");
  }

  _heartbeat(conn) {
    if (conn !== this._conn) return;
    const t = now();
    if (t - this._lastRx > 2 * this._heartbeatMs) {
      this._dropConn(conn, { reason: `nothing received for ${Math.round(t - this._lastRx)} ms` });
      return;
    }
    if (t - this._lastPing >= this._heartbeatMs * 0.95) this._sendPing();
  }

  /** PING the server: the heartbeat on WebSocket, and the round-trip time on both transports. */
  _sendPing() {
    const t = now();
    this._lastPing = t;
    const token = ++this._pingToken;
    this._pingSent.set(token, t);
    if (this._pingSent.size > 16) this._pingSent.delete(this._pingSent.keys().next().value);
    this._write({ bytes: encode.ping(token), keep: "none" });
  }

  _shutdown(err) {
    this._cancelUpgrade();
    clearTimeout(this._reconnectTimer);
    clearInterval(this._hbTimer);
    clearTimeout(this._ackTimer);
    clearInterval(this._nakTimer);
    this._reconnectTimer = this._hbTimer = this._ackTimer = this._nakTimer = null;
    const conn = this._conn;
    this._conn = null;
    this._welcomed = false;
    if (conn) {
      clearTimeout(conn.openTimer);
      conn.close(1000, "client closed");
    }
    this._removePageHooks();
    this.state = "closed";
    const reason = err ?? new RubrisError("client closed", ErrorCode.CLOSED);
    for (const rec of [...this._calls.values()]) this._failCall(rec, reason);
    this._outbox = [];
    this._tx = [];
    this._inbox = []; // nothing more reaches the app after close
    this._inboxHead = 0;
    for (const wire of this._wires.values()) {
      wire.state = "closed";
      for (const sub of [...wire.joining, ...wire.listeners]) sub._fail(reason);
    }
    this._wires.clear();
    this._byTopic.clear();
    this._byReq.clear();
    if (err) this._emit("error", { code: err.code, message: err.message });
    this._emit("state", { state: "closed", transport: this.transport, resumed: this.resumed });
  }

  _setState(state, always = false) {
    if (this.state === state && !always) return;
    this.state = state;
    this._emit("state", { state, transport: this.transport, resumed: this.resumed });
  }

  _emit(event, detail) {
    const fns = this._events.get(event);
    if (!fns) return;
    for (const fn of [...fns]) safeCall(fn, detail);
  }

  // ----- inbound -----------------------------------------------------------------------------

  _onFrame(conn, bytes, decoded) {
    if (conn !== this._conn) return;
    // Liveness is measured at arrival, not delivery: a backlog in the app is not a dead link.
    this._lastRx = now();
    if (this._welcomed) {
      conn.framesAfterWelcome++;
      if (conn.kind === "websocket") this._wsWorked = true;
    }
    this._counters.frames++;
    this._counters.bytesIn += bytes.length;
    let messages;
    try {
      messages = decoded ?? decodeFrame(bytes);
    } catch (err) {
      this._protocolError(conn, err.message);
      return;
    }
    this._counters.messages += messages.length;
    this._rate.add(messages.length);
    for (const m of messages) {
      if (!this._welcomed && m.kind !== Kind.WELCOME && m.kind !== Kind.GOODBYE) {
        this._protocolError(conn, `kind 0x${m.kind.toString(16)} before WELCOME`);
        return;
      }
      this._handle(conn, m);
      if (conn !== this._conn) return; // the message ended this connection (GOODBYE, error)
    }
  }

  /**
   * Protocol state changes happen here, at arrival, so topic numbers and call ids always mean
   * what they meant when the server sent them; what the app sees goes through the inbound queue
   * in the same order.
   */
  _handle(conn, m) {
    switch (m.kind) {
      case Kind.WELCOME:
        if (this._welcomed) this._protocolError(conn, "second WELCOME on one connection");
        else this._onWelcome(conn, m);
        break;
      case Kind.PUSH:
        this._onPush(m);
        break;
      case Kind.RESULT:
      case Kind.STREAM:
        this._onReply(m);
        break;
      case Kind.SUBSCRIBED:
        this._onSubscribed(m);
        break;
      case Kind.REJECTED:
        this._onRejected(m);
        break;
      case Kind.UNSUBSCRIBED:
        this._onUnsubscribed(m);
        break;
      case Kind.GAP:
        this._onGap(m);
        break;
      case Kind.PONG: {
        const sent = this._pingSent.get(m.token);
        if (sent !== undefined) {
          this._rtt = Math.round(now() - sent);
          this._pingSent.delete(m.token);
        }
        break;
      }
      case Kind.GOODBYE:
        this._onGoodbye(conn, m);
        break;
      case Kind.FLOW:
        this._emit("flow", { fill: m.fill });
        break;
      default:
        break;
    }
  }

  _onGoodbye(conn, m) {
    this._emit("goodbye", { code: m.code, reason: m.reason });
    if (m.code === ErrorCode.SESSION_EXPIRED) this._resume = "";
    const fatal = m.code === ErrorCode.NOT_AUTHORISED || m.code === ErrorCode.UNSUPPORTED_VERSION;
    this._dropConn(conn, {
      goodbye: m, fatal, code: m.code, reason: m.reason || `server said goodbye (code ${m.code})`,
    });
  }

  _onPush(m) {
    const wire = this._byTopic.get(m.topic);
    if (!wire) return; // unsubscribed meanwhile: the server may still have had some in flight
    if (wire.mode === Mode.RING || wire.mode === Mode.PRIVATE) {
      // A resumed session replays what was unacknowledged; we may already hold it.
      if (m.seq <= wire.lastSeq) return;
    }
    if (m.seq > wire.lastSeq) wire.lastSeq = m.seq;
    const inflating = m.compressed ? this._inflate(m.payload) : null;
    if (wire.mode === Mode.SNAPSHOT && wire.queued) {
      // Conflate: a snapshot subscriber wants the latest value, not every value. The waiting
      // item keeps its place in the queue and takes the newer content.
      Object.assign(wire.queued, { seq: m.seq, payload: m.payload, compressed: m.compressed, inflating });
      return;
    }
    const item = {
      t: "push", wire, incarnation: wire.incarnation,
      seq: m.seq, payload: m.payload, compressed: m.compressed, inflating,
    };
    if (wire.mode === Mode.SNAPSHOT) wire.queued = item;
    this._enqueue(item);
  }

  _onReply(m) {
    const rec = this._calls.get(m.call);
    if (!rec) return; // timed out, cancelled, or failed by a new session
    const final = m.kind === Kind.RESULT || m.last === 1;
    if (final) {
      // Settled by the delivery, but no longer "in flight": a new session cannot lose it now.
      this._calls.delete(m.call);
      clearTimeout(rec.timer);
    } else {
      this._armCallTimer(rec);
    }
    const inflating = m.compressed ? this._inflate(m.payload) : null;
    this._enqueue({ t: "reply", rec, m, payload: m.payload, inflating });
  }

  _onSubscribed(m) {
    const wire = this._byReq.get(m.req);
    if (!wire) return;
    this._byReq.delete(m.req);
    wire.reqs.delete(m.req);
    const holder = this._byTopic.get(m.topic);
    if (wire.state === "closed" || wire.closing) {
      // The app let go before the answer came; give the topic back unless another live
      // subscription of ours holds the same number.
      if (!holder) this._unsubscribeTopic(m.topic);
      if (wire.closing) {
        wire.closing = false;
        wire.state = "closed";
        if (this._wires.get(wire.key) === wire) this._wires.delete(wire.key);
      }
      return;
    }
    if (wire.state === "active") {
      // Second answer to a SUBSCRIBE repeated after a resume: already done.
      if (m.topic !== wire.topic && !holder) this._unsubscribeTopic(m.topic);
      return;
    }
    if (wire.epoch !== m.epoch) wire.resetNumbering(); // a new numbering: old seqs mean nothing
    wire.state = "active";
    wire.topic = m.topic;
    wire.mode = m.mode;
    wire.codec = m.codec;
    wire.epoch = m.epoch;
    wire.info = {
      name: wire.name, mode: m.mode, codec: m.codec, epoch: m.epoch, head: m.head,
      recovered: m.recovered === 1,
    };
    this._byTopic.set(m.topic, wire);
    const info = wire.info;
    this._enqueue({
      t: "fn",
      fn: () => {
        for (const sub of [...wire.listeners]) safeCall(sub._opts.onSubscribed, info);
        for (const sub of [...wire.joining]) this._join(wire, sub, info);
      },
    });
  }

  /** Make `sub` a listener of `wire` (runs in delivery order). */
  _join(wire, sub, info = wire.info) {
    if (!wire.joining.delete(sub) || sub.closed) return;
    wire.listeners.add(sub);
    sub.info = info;
    sub._resolve(info);
    safeCall(sub._opts.onSubscribed, info);
    if (wire.mode === Mode.SNAPSHOT && wire.last) {
      // A later listener of a shared snapshot gets the current value, as a new subscriber would.
      safeCall(sub._callback, wire.last.value, wire.last.meta);
    }
  }

  _onRejected(m) {
    const wire = this._byReq.get(m.req);
    if (!wire) return;
    this._byReq.delete(m.req);
    wire.reqs.delete(m.req);
    if (wire.state === "active" || wire.reqs.size > 0) return; // another request got through
    wire.state = "closed";
    if (this._wires.get(wire.key) === wire) this._wires.delete(wire.key);
    const err = new RubrisError(m.reason || `subscription refused (code ${m.code})`, m.code);
    this._enqueue({
      t: "fn",
      fn: () => {
        for (const sub of [...wire.joining, ...wire.listeners]) {
          sub.closed = true;
          sub._fail(err);
          safeCall(sub._opts.onError, { code: m.code, reason: m.reason });
        }
        wire.joining.clear();
        wire.listeners.clear();
      },
    });
  }

  _onUnsubscribed(m) {
    if (m.code === 0 && this._unsubPending.delete(m.topic)) return; // the answer to our request
    const wire = this._byTopic.get(m.topic);
    if (!wire) return;
    this._byTopic.delete(m.topic);
    wire.state = "closed";
    if (this._wires.get(wire.key) === wire) this._wires.delete(wire.key);
    this._enqueue({
      t: "fn",
      fn: () => {
        for (const sub of [...wire.joining, ...wire.listeners]) {
          sub.closed = true;
          sub._fail(new RubrisError(m.reason || `unsubscribed by the server (code ${m.code})`, m.code));
          safeCall(sub._opts.onUnsubscribed, { code: m.code, reason: m.reason });
        }
        wire.joining.clear();
        wire.listeners.clear();
      },
    });
  }

  _onGap(m) {
    const wire = this._byTopic.get(m.topic);
    if (!wire) return;
    const end = m.from + m.count - 1;
    // Lost for good; asking to replay them after a reconnect would only produce the same GAP.
    if (end > wire.lastSeq) wire.lastSeq = end;
    this._counters.gaps++;
    const gap = { from: m.from, count: m.count };
    this._enqueue({
      t: "fn",
      fn: () => {
        this._emit("gap", { name: wire.name, ...gap });
        for (const sub of [...wire.listeners]) safeCall(sub._opts.onGap, gap);
      },
    });
  }

  _inflate(payload) {
    const promise = inflateRaw(payload).then((out) => {
      this._counters.compressed++;
      this._counters.bytesSaved += out.length - payload.length;
      return out;
    });
    // Awaited later, in order; until then a failure must not count as unhandled.
    promise.catch(() => {});
    return promise;
  }

  _enqueue(item) {
    this._inbox.push(item);
    this._updateNak();
    if (!this._draining) {
      this._draining = true;
      // After the current frame is fully parsed: control state is then complete for it.
      queueMicrotask(() => this._drain());
    }
  }

  /**
   * Deliver the inbound queue to the app in arrival order. Inflation is asynchronous, so an
   * item waits for its own inflation before anything behind it is delivered. Work is cut into
   * slices of ~8 ms with a yield in between, so a burst cannot freeze the page; the queue that
   * builds up meanwhile is what the NAK levels measure.
   */
  async _drain() {
    try {
      let sliceStart = now();
      while (this._inboxHead < this._inbox.length) {
        const item = this._inbox[this._inboxHead];
        // From here on newer snapshot values must queue behind, not conflate into this one.
        if (item.t === "push" && item.wire.queued === item) item.wire.queued = null;
        let payload = item.payload;
        let failure = null;
        if (item.inflating) {
          try {
            payload = await item.inflating;
          } catch (err) {
            failure = err;
          }
          if (this.state === "closed") break;
        }
        this._inbox[this._inboxHead++] = undefined;
        if (this._inboxHead > 1024 && this._inboxHead * 2 > this._inbox.length) {
          this._inbox = this._inbox.slice(this._inboxHead);
          this._inboxHead = 0;
        }
        this._updateNak();
        const wait = this._deliver(item, payload, failure);
        if (wait) await wait;
        if (now() - sliceStart >= SLICE_MS) {
          await yieldToEventLoop();
          sliceStart = now();
        }
      }
    } finally {
      this._draining = false;
    }
    // Items may have arrived during the final await; they found _draining set and rely on us.
    if (this._inboxHead < this._inbox.length) {
      this._draining = true;
      queueMicrotask(() => this._drain());
    }
  }

  /** Deliver one item; returns a promise when delivery must wait (streamIter backpressure). */
  _deliver(item, payload, failure) {
    if (item.t === "fn") {
      safeCall(item.fn);
      return null;
    }
    if (item.t === "reply") return this._deliverReply(item.rec, item.m, payload, failure);
    const wire = item.wire;
    if (failure) {
      this._emit("error", { code: ErrorCode.PROTOCOL, message: `${wire.name}: cannot inflate message ${item.seq}: ${failure.message}` });
    } else {
      let value;
      let ok = true;
      try {
        value = decodePayload(wire.codec, payload);
      } catch (err) {
        ok = false;
        this._emit("error", { code: ErrorCode.PROTOCOL, message: `${wire.name}: message ${item.seq} does not decode: ${err.message}` });
      }
      if (ok) {
        const meta = { name: wire.name, seq: item.seq, compressed: item.compressed };
        if (wire.mode === Mode.SNAPSHOT) wire.last = { value, meta };
        if (wire.mode === Mode.QUEUE) {
          this._deliverQueueItem(wire, item, value, meta);
          return null;
        }
        for (const sub of wire.listeners.size === 1 ? wire.listeners : [...wire.listeners]) {
          if (!sub.closed) safeCall(sub._callback, value, meta);
        }
      }
    }
    if (wire.mode === Mode.PRIVATE) this._noteDelivered(wire, item);
    return null;
  }

  _deliverReply(rec, m, payload, failure) {
    if (rec.done) return null;
    if (failure) {
      this._failCall(rec, new RubrisError(`cannot inflate the reply: ${failure.message}`, ErrorCode.PROTOCOL));
      return null;
    }
    let value;
    try {
      value = decodeJson(payload);
    } catch (err) {
      this._failCall(rec, new RubrisError(`reply is not JSON: ${err.message}`, ErrorCode.PROTOCOL));
      return null;
    }
    if (m.kind === Kind.RESULT) {
      if (m.status === 0) this._settleCall(rec, value);
      else this._failCall(rec, errorFromPayload(value));
      return null;
    }
    // STREAM: an item, and/or the end. A non-empty payload on last=1 is a final item.
    if (payload.length && rec.stream && !rec.stream.cancelled) {
      try {
        rec.stream.onItem(value);
      } catch (err) {
        this._failCall(rec, err);
        return null;
      }
    }
    if (m.last === 1) {
      this._settleCall(rec, undefined);
      return null;
    }
    return rec.stream?.backpressure?.() ?? null;
  }

  _deliverQueueItem(wire, item, value, meta) {
    const incarnation = item.incarnation;
    const done = (ok) => {
      if (wire.incarnation !== incarnation || wire.state !== "active") return; // item is gone
      if (ok) {
        wire.queueDone.push(item.seq);
        this._noteAckable(wire, wire.queueDone.length);
      } else {
        this._write({ bytes: encode.nack(wire.topic, item.seq, true), keep: "session" });
      }
    };
    const results = [];
    let threw = false;
    for (const sub of [...wire.listeners]) {
      if (sub.closed) continue;
      try {
        results.push(sub._callback(value, meta));
      } catch (err) {
        threw = true;
        reportAppError(err);
      }
    }
    if (threw) {
      done(false);
    } else if (results.some((r) => r && typeof r.then === "function")) {
      Promise.all(results).then(() => done(true), (err) => {
        reportAppError(err);
        done(false);
      });
    } else {
      done(true);
    }
  }

  // ----- flow control ------------------------------------------------------------------------

  /**
   * NAK (§8): tell the server when the inbound queue crosses 50/75/87/100 % of inboundLimit going
   * up, and repeat the strongest level at most every 100 ms while it stays up. Nothing is sent
   * while the app keeps up.
   */
  _updateNak() {
    const level = nakLevel(this._inbox.length - this._inboxHead, this._opts.inboundLimit);
    const rising = level > this._nakLevel;
    this._nakLevel = level;
    if (level > this._nakPeak) this._nakPeak = level;
    if (rising && (level > this._nakSentLevel || now() - this._nakSentAt >= NAK_REPEAT_MS)) {
      this._sendNak(level);
    }
    if (this._nakPeak > 0 && !this._nakTimer) {
      this._nakTimer = setInterval(() => this._nakTick(), NAK_REPEAT_MS);
    }
  }

  _nakTick() {
    // Only while the queue is still above a threshold: once drained, a NAK would be stale.
    // The level reported is the strongest seen since the last NAK.
    if (this._nakLevel > 0 && now() - this._nakSentAt >= NAK_REPEAT_MS * 0.9) {
      this._sendNak(Math.max(this._nakPeak, this._nakLevel));
    }
    this._nakPeak = this._nakLevel;
    if (this._nakLevel === 0) {
      clearInterval(this._nakTimer);
      this._nakTimer = null;
      this._nakSentLevel = 0;
    }
  }

  _sendNak(level) {
    this._nakSentAt = now();
    this._nakSentLevel = level;
    this._nakPeak = this._nakLevel;
    this._counters.naks++;
    if (this._welcomed) this._write({ bytes: encode.nak(level), keep: "none" });
  }

  /**
   * Private topics are ACKed by what the app has been given, not by what arrived: the server
   * keeps unacknowledged messages against the topic's queue capacity, so a slow page pushes back
   * on the publisher instead of piling up here.
   */
  _noteDelivered(wire, item) {
    if (item.incarnation !== wire.incarnation) return; // from a session that no longer exists
    if (item.seq > wire.delivered) wire.delivered = item.seq;
    wire.unacked++;
    this._noteAckable(wire, wire.unacked);
  }

  _noteAckable(wire, count) {
    this._ackDirty.add(wire);
    if (count >= this._opts.ackEvery) {
      this._sendAck(wire);
    } else if (!this._ackTimer) {
      this._ackTimer = setTimeout(() => {
        this._ackTimer = null;
        this._flushAcks(false);
      }, this._opts.ackMs);
    }
  }

  _ackMessages(wire) {
    const out = [];
    if (wire.state !== "active") return out;
    if (wire.mode === Mode.PRIVATE && wire.delivered > wire.acked) {
      out.push(encode.ackPrivate(wire.topic, wire.delivered));
      wire.acked = wire.delivered;
      wire.unacked = 0;
    } else if (wire.mode === Mode.QUEUE && wire.queueDone.length) {
      out.push(encode.ackQueue(wire.topic, wire.queueDone));
      wire.queueDone = [];
    }
    return out;
  }

  _sendAck(wire) {
    if (!this._welcomed) return; // stays dirty; sent after a resume, dropped by a new session
    this._ackDirty.delete(wire);
    for (const bytes of this._ackMessages(wire)) this._write({ bytes, keep: "none" });
  }

  /** Send every pending ACK; `urgent` bypasses batching because the page may be going away. */
  _flushAcks(urgent) {
    if (!this._welcomed || !this._conn) return;
    const dirty = [...this._ackDirty];
    this._ackDirty.clear();
    if (!urgent) {
      for (const wire of dirty) this._sendAck(wire);
      return;
    }
    const parts = [];
    for (const wire of dirty) parts.push(...this._ackMessages(wire));
    if (parts.length) this._conn.sendUrgent(joinFrames(parts));
  }

  _installPageHooks() {
    if (typeof addEventListener !== "function") return;
    this._onPageHide = () => this._flushAcks(true);
    this._onVisibility = () => {
      if (typeof document !== "undefined" && document.visibilityState === "hidden") this._flushAcks(true);
    };
    this._onOnline = () => {
      // The network is back: no reason to sit out the rest of a backoff.
      if (this._reconnectTimer) {
        clearTimeout(this._reconnectTimer);
        this._connect();
      }
    };
    addEventListener("pagehide", this._onPageHide);
    addEventListener("online", this._onOnline);
    if (typeof document !== "undefined") document.addEventListener("visibilitychange", this._onVisibility);
  }

  _removePageHooks() {
    if (!this._onPageHide || typeof removeEventListener !== "function") return;
    removeEventListener("pagehide", this._onPageHide);
    removeEventListener("online", this._onOnline);
    if (typeof document !== "undefined") document.removeEventListener("visibilitychange", this._onVisibility);
  }

  // ----- outbound ----------------------------------------------------------------------------

  /**
   * Queue one encoded message. Connected: written at the end of the current task, batched into as
   * few frames as max_frame allows. Disconnected: `keep` decides: "always" (calls) waits for any
   * session, "session" (UNSUBSCRIBE, NACK) only for a resumed one, "none" (ACK, NAK, PING,
   * SUBSCRIBE: regenerated from state when needed) is dropped.
   */
  _write(entry) {
    if (entry.call?.done) return;
    if (this._welcomed && this._conn) {
      this._tx.push(entry);
      if (!this._txScheduled) {
        this._txScheduled = true;
        queueMicrotask(() => this._flushTx());
      }
      return;
    }
    if (entry.keep === "none") return;
    this._outbox.push(entry);
  }

  _flushTx() {
    this._txScheduled = false;
    const entries = this._tx;
    this._tx = [];
    if (!entries.length) return;
    const conn = this._conn;
    if (!this._welcomed || !conn) {
      for (const e of entries) this._write(e); // the connection went away meanwhile
      return;
    }
    const max = this._maxFrame;
    let parts = [];
    let size = 0;
    const emit = () => {
      if (!parts.length) return;
      conn.send(joinFrames(parts), parts.length);
      parts = [];
      size = 0;
    };
    for (const e of entries) {
      if (e.call?.done) continue; // timed out while waiting: must not run after all
      if (e.bytes.length > max) {
        const err = new RubrisError(`message of ${e.bytes.length} bytes exceeds the server's max_frame of ${max}`, ErrorCode.TOO_LARGE);
        if (e.call) this._failCall(e.call, err);
        else this._emit("error", { code: err.code, message: err.message });
        continue;
      }
      if (size + e.bytes.length > max) emit();
      parts.push(e.bytes);
      size += e.bytes.length;
      if (e.call) {
        e.call.sent = true;
        e.call.gen = this._sessionGen;
      }
    }
    emit();
  }

  _unsubscribeTopic(topic) {
    this._unsubPending.add(topic);
    this._write({ bytes: encode.unsubscribe(topic), keep: "session" });
  }

  _prepareParams(wire) {
    if (!this._opts.compressSubscribe || wire.params.length < COMPRESS_MIN
      || typeof CompressionStream !== "function") return;
    wire.paramsReady = deflateRaw(wire.params).then((packed) => {
      // The server's own rule (§ compression): keep it only if it saves at least half.
      if (packed.length * 2 <= wire.params.length) {
        wire.wireParams = packed;
        wire.wireCompressed = true;
      }
    }, () => {}).then(() => {
      wire.paramsReady = null;
      if (wire.state === "unsent" && this._wires.get(wire.key) === wire && this._welcomed) {
        this._sendSubscribe(wire);
      }
    });
  }

  _sendSubscribe(wire) {
    if (wire.paramsReady) return; // sent when the params are deflated
    const req = this._nextReq++;
    wire.reqs.add(req);
    this._byReq.set(req, wire);
    wire.state = "pending";
    // Ring topics ask to replay what they missed (§5); the server checks the epoch.
    const recover = wire.mode === Mode.RING && wire.epoch !== null && wire.lastSeq > 0;
    const bytes = encode.subscribe(req, wire.name, recover ? wire.epoch : 0, recover ? wire.lastSeq : 0,
      wire.wireParams, wire.wireCompressed);
    this._write({ bytes, keep: "none" });
  }

  _unsubscribe(sub) {
    if (sub.closed) return;
    sub.closed = true;
    sub._fail(new RubrisError("unsubscribed", ErrorCode.UNSUBSCRIBED));
    const wire = sub._wire;
    if (!wire) return;
    wire.joining.delete(sub);
    wire.listeners.delete(sub);
    if (wire.joining.size || wire.listeners.size) return;
    switch (wire.state) {
      case "unsent":
        wire.state = "closed";
        this._wires.delete(wire.key);
        break;
      case "pending":
        wire.closing = true; // UNSUBSCRIBE needs the topic number from SUBSCRIBED
        break;
      case "active":
        if (wire.mode === Mode.PRIVATE || wire.mode === Mode.QUEUE) this._sendAck(wire);
        wire.state = "closed";
        this._wires.delete(wire.key);
        this._byTopic.delete(wire.topic);
        this._unsubscribeTopic(wire.topic);
        break;
      default:
        break;
    }
  }

  _startCall(method, args, stream) {
    if (this.state === "closed") return Promise.reject(new RubrisError("client is closed", ErrorCode.CLOSED));
    let payload;
    try {
      payload = encodeJson(args);
    } catch (err) {
      return Promise.reject(err);
    }
    const backlog = this._outbox.length + this._tx.length
      + (this._conn?.kind === "longpoll" ? this._conn.backlog : 0);
    if (backlog >= this._opts.maxPending) {
      return Promise.reject(new RubrisError(
        `${backlog} messages are already waiting to be sent (maxPending ${this._opts.maxPending}); not queueing more`,
        ErrorCode.TOO_MANY,
      ));
    }
    if (this._conn?.kind === "websocket" && this._conn.backlog > WS_BUFFER_LIMIT) {
      return Promise.reject(new RubrisError("the WebSocket send buffer is full", ErrorCode.TOO_MANY));
    }
    const id = this._nextCall++;
    const promise = new Promise((resolve, reject) => {
      const rec = { id, method, resolve, reject, stream, sent: false, gen: 0, done: false, timer: null };
      this._calls.set(id, rec);
      this._armCallTimer(rec);
      this._write({ bytes: encode.call(id, method, payload), keep: "always", call: rec });
    });
    return promise;
  }

  _armCallTimer(rec) {
    const ms = this._opts.callTimeoutMs;
    if (!ms) return;
    clearTimeout(rec.timer);
    rec.timer = setTimeout(() => {
      this._failCall(rec, new RubrisError(`${rec.method}: no answer within ${ms} ms`, ErrorCode.TIMEOUT));
    }, ms);
  }

  _settleCall(rec, value) {
    if (rec.done) return;
    rec.done = true;
    clearTimeout(rec.timer);
    this._calls.delete(rec.id);
    rec.resolve(value);
  }

  _failCall(rec, err) {
    if (rec.done) return;
    rec.done = true;
    clearTimeout(rec.timer);
    this._calls.delete(rec.id);
    rec.reject(err);
  }
}

function errorFromPayload(value) {
  if (value && typeof value === "object") {
    return new RubrisError(String(value.message ?? "call failed"), value.code ?? ErrorCode.REJECTED);
  }
  return new RubrisError(value === undefined ? "call failed" : String(value), ErrorCode.REJECTED);
}

// ---------------------------------------------------------------------------------------------
// 4. Public value classes and connect()
// ---------------------------------------------------------------------------------------------

/**
 * An error from the server (a call's `{code, message}`, a REJECTED subscribe, a GOODBYE) or from
 * the client itself. `code` is a number from protocol.md §9 (or an application's own code) for
 * server errors, and one of the strings of {@link ErrorCode} ("closed", "timeout",
 * "unsubscribed") for the client's own.
 */
export class RubrisError extends Error {
  /**
   * @param {string} message
   * @param {number|string} code
   */
  constructor(message, code) {
    super(message);
    this.name = "RubrisError";
    this.code = code;
  }
}

/**
 * The app's handle on one subscription (returned by {@link RubrisClient#subscribe}).
 */
export class Subscription {
  constructor(client, name, callback, opts) {
    /** The topic name. */
    this.name = name;
    /** The latest SUBSCRIBED info ({mode, codec, epoch, head, recovered}), or null. */
    this.info = null;
    /** True once unsubscribed, refused or ended by the server. */
    this.closed = false;
    this._client = client;
    this._callback = callback;
    this._opts = opts;
    this._wire = null;
    this._settled = false;
    /**
     * Resolves with the SUBSCRIBED info; rejects with a {@link RubrisError} when the server
     * refuses (REJECTED) or the subscription ends first.
     * @type {Promise<{name: string, mode: number, codec: number, epoch: number, head: number, recovered: boolean}>}
     */
    this.ready = new Promise((resolve, reject) => {
      this._resolveReady = resolve;
      this._rejectReady = reject;
    });
    // Nobody has to await `ready`; a refusal is also reported to onError.
    this.ready.catch(() => {});
  }

  /** Stop receiving messages; the server is told once no other listener shares the topic. */
  unsubscribe() {
    this._client._unsubscribe(this);
  }

  _resolve(info) {
    if (this._settled) return;
    this._settled = true;
    this._resolveReady(info);
  }

  _fail(err) {
    this.closed = true;
    if (this._settled) return;
    this._settled = true;
    this._rejectReady(err);
  }
}

/**
 * Connect to a rubris server; the client starts connecting at once and keeps reconnecting until
 * {@link RubrisClient#close}.
 * @param {string} [url="/rubris"] Where the plugin is mounted.
 * @param {object} [options] See {@link RubrisClient}.
 * @returns {RubrisClient}
 */
export function connect(url = "/rubris", options = {}) {
  return new RubrisClient(url, options);
}

/** Codec and helpers, exported for tests; not a stable API. */
export const _internal = Object.freeze({
  Writer,
  Reader,
  ProtocolError,
  splitFrame,
  decodeFrame,
  parseServerMessage,
  decodeClientFrame,
  parseClientMessage,
  encode,
  message,
  joinFrames,
  inflateRaw,
  deflateRaw,
  decodePayload,
  nakLevel,
  backoffDelay,
  resolveUrls,
});

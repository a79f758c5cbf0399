// RubrisClient: its constructor, which holds all of its state, and the methods that belong to
// no one concern (on/off/stats/close and event emission), plus connect(). The other methods come
// from the concern modules, each a plain object of methods that installMethods copies onto
// RubrisClient.prototype below, so every method runs with `this` the client as before.

import { batchMethods } from "./batches.js";
import { callMethods } from "./calls.js";
import { flowMethods } from "./flow.js";
import { outboundMethods } from "./outbound.js";
import { queueMethods } from "./queues.js";
import { DEFAULT_MAX_FRAME, sessionMethods } from "./session.js";
import { subscriptionMethods } from "./subscriptions.js";
import { tableMethods } from "./tables.js";
import { RateMeter, resolveUrls, safeCall } from "./util.js";

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
   * @param {object} [options] Each optional; one left out or given as undefined has its default.
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
    const opts = { ...DEFAULTS };
    // An option given as undefined keeps its default, as one left out does.
    for (const [key, value] of Object.entries(options ?? {})) if (value !== undefined) opts[key] = value;
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

    // session.js: the connection, resume, fall-back, heartbeats
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

    // subscriptions.js and calls.js
    this._nextReq = 1;
    this._nextCall = 1;
    this._wires = new Map(); // key → WireSubscription the app holds
    this._byTopic = new Map(); // topic number → WireSubscription (active)
    this._byReq = new Map(); // SUBSCRIBE req → WireSubscription
    this._restating = new Map(); // req → WireSubscription: rings and tables restated by the last resuming HELLO
    this._unsubPending = new Set(); // topics we UNSUBSCRIBEd; their UNSUBSCRIBED(code 0) is expected
    this._calls = new Map(); // call id → call record

    // outbound.js
    this._outbox = []; // entries waiting for a connection
    this._tx = []; // entries to write on this connection at the end of the current task
    this._txScheduled = false;

    // flow.js: the inbound queue…
    this._inbox = []; // inbound items in arrival order, drained into app callbacks in slices
    this._inboxHead = 0;
    this._draining = false;

    // …and NAK
    this._nakLevel = 0; // level of the inbound queue now
    this._nakPeak = 0; // strongest level since the last NAK
    this._nakSentLevel = 0;
    this._nakSentAt = -Infinity;
    this._nakTimer = null;

    // subscriptions.js: ACKs
    this._ackTimer = null;
    this._ackDirty = new Set();

    // queues.js: consumers with ACKs to write at the end of this task
    this._queueAcksDirty = new Set();
    this._queueAckScheduled = false;

    // stats
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
   * Close for good: ACKs what was delivered, fails pending calls, and stops reconnecting.
   * Subscriptions end without callbacks.
   */
  close() {
    if (this.state === "closed") return;
    this._flushAcks(true);
    this._shutdown(null);
  }

  // ----- events ------------------------------------------------------------------------------

  _emit(event, detail) {
    const fns = this._events.get(event);
    if (!fns) return;
    for (const fn of [...fns]) safeCall(fn, detail);
  }
}

/**
 * Copy method groups onto a class's prototype as a class body would define them: non-enumerable,
 * getters kept as getters. A name defined twice is a mistake in the split, reported when the
 * module loads rather than by one method silently replacing the other.
 */
function installMethods(cls, ...groups) {
  for (const group of groups) {
    for (const [name, descriptor] of Object.entries(Object.getOwnPropertyDescriptors(group))) {
      if (Object.prototype.hasOwnProperty.call(cls.prototype, name)) {
        throw new Error(`${cls.name}.${name} is defined twice`);
      }
      Object.defineProperty(cls.prototype, name, { ...descriptor, enumerable: false });
    }
  }
}

installMethods(
  RubrisClient, sessionMethods, queueMethods, batchMethods, tableMethods, subscriptionMethods, callMethods,
  flowMethods, outboundMethods,
);

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

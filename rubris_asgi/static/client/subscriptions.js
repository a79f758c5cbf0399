// Subscriptions: subscribe() and unsubscribe, the WireSubscription several app Subscriptions
// share (a queue consumer's and a table's too), the server's answers (SUBSCRIBED, REJECTED,
// UNSUBSCRIBED, GAP), PUSH from arrival to the listeners (snapshot conflation), and the ACKs of
// private topics (a queue topic's items and ACKs are queues.js's, a keyed topic's ENTRYs
// tables.js's). Methods of RubrisClient (installed by rubris-client.js).

import { ErrorCode, Mode, encode, joinFrames } from "./codec.js";
import { decodePayload, deflateRaw, encodeJson } from "./payloads.js";
import { safeCall } from "./util.js";
import { RubrisError, Subscription } from "./values.js";

/** Params shorter than this are not worth deflating. */
const COMPRESS_MIN = 64;

/**
 * One subscription on the wire. Several app Subscriptions to the same name and params share one,
 * because the server gives a topic one number per session (§3) and cannot tell two subscribers of
 * the same topic in one session apart.
 */
class WireSubscription {
  constructor(key, name, params, value) {
    this.key = key;
    this.name = name;
    this.params = params; // JSON bytes, or EMPTY
    this.paramsValue = value; // the app's params, to merge `last` into (a JSON object or undefined)
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
    this.lastSeq = 0; // highest seq received (duplicate filter; `since` for ring, keyed recovery)
    this.delivered = 0; // highest private seq the app has seen (what ACK reports)
    this.acked = 0;
    this.unacked = 0;
    this.consumer = null; // queue topics: the Consumer (consumer.js) its items go to
    this.table = null; // keyed topics: the LiveTable (tables.js) its ENTRYs build
    this.incarnation = 0; // bumps when seq numbering restarts, so stale items cannot ACK
    this.queued = null; // the snapshot item waiting in the inbound queue (conflation target)
    this.last = null; // {value, meta}: the latest snapshot value, for listeners that join later
    this.asked = new Map(); // SUBSCRIBE req → the `last` it asked for (late joiners, §5)
    this.keep = 0; // ring topics: how many delivered messages `history` keeps (largest `last`)
    this.history = []; // {value, meta} of the latest delivered ring messages, oldest first
    this.listeners = new Set();
    this.joining = new Set(); // Subscriptions that have not seen onSubscribed yet
  }

  resetNumbering() {
    this.lastSeq = 0;
    this.history = []; // seqs of another numbering...
    for (const sub of this.listeners) sub._floor = 0; // ...which floors must not hold back
    this.delivered = 0;
    this.acked = 0;
    this.unacked = 0;
    this.incarnation++;
  }
}

/** What SUBSCRIBED says of `wire`'s topic, as onSubscribed gets it. */
function subscribedInfo(wire, m) {
  return {
    name: wire.name, mode: m.mode, codec: m.codec, epoch: m.epoch, head: m.head,
    recovered: m.recovered === 1,
  };
}

/** The listeners already on `wire` take `info` and hear of it (runs in delivery order). */
function tellListeners(wire, info) {
  for (const sub of [...wire.listeners]) {
    sub.info = info;
    safeCall(sub._opts.onSubscribed, info);
  }
}

export const subscriptionMethods = {
  // ----- public API --------------------------------------------------------------------------

  /**
   * Subscribe to a topic. The subscription is kept across reconnects: after a resumed session it
   * continues (ring topics restate their position, epoch and last seq received, in the frame of
   * the resuming HELLO; the server replays what it still holds after it, a GAP first for what it
   * lost); after a new session it is made again (ring topics ask to replay from the last seq
   * received). Either way `onSubscribed` reports whether that replay was complete, and a ring
   * message is never delivered twice nor after a newer one.
   *
   * @param {string} name Topic name, e.g. "prices.AAPL".
   * @param {(value: any, meta: {name: string, seq: number, compressed: boolean}) => any} callback
   *   Called for every message, in order. The value is decoded by the topic's codec: JSON →
   *   parsed value, bytes → Uint8Array, text → string. A queue topic (better: consume()) gives
   *   items one at a time with meta `{name, tag, attempt, compressed}`; each is ACKed when the
   *   callbacks return (or their promises resolve) and given back (NACK) when one throws. A
   *   keyed topic (better: subscribeTable()) gives each change of its table, `{key, op, value,
   *   seq}` as subscribeTable()'s onChange gets it, with meta `{name, seq, compressed}`.
   * @param {object} [opts]
   * @param {any} [opts.params] JSON params for the server's subscribe handler.
   * @param {number} [opts.last] Late joiner (§5): on a ring topic, first the last `last`
   *   messages the server's ring holds (all of them if it holds fewer), oldest first, then the
   *   new ones. Sent as `{"last": n}` merged into `params` (which must then be a plain object)
   *   on the first SUBSCRIBE only; a re-subscribe after a reconnect goes on from the last seq
   *   received instead. Subscriptions to one name and params share one wire subscription: a
   *   listener that joins while the first SUBSCRIBE is still unanswered gets exactly its own
   *   `last` of what the server replays (none without `last`); one that joins an active topic
   *   gets up to `last` of the latest messages this client has delivered on it and still keeps:
   *   the client keeps, per ring topic, as many as the largest `last` any of its subscribe()
   *   calls asked for, counted from when that call was made. A snapshot topic ignores it (its
   *   value comes anyway).
   * @param {number} [opts.maxRate] On a snapshot (or keyed) topic: at most this many messages a
   *   second after the first value, each the latest (§5b; sent as `{"max_rate": r}` merged into
   *   `params`, which must then be a plain object, on every SUBSCRIBE). A ring, private or queue
   *   topic refuses it (code 1).
   * @param {(gap: {from: number, count: number}) => void} [opts.onGap] Messages lost for good.
   * @param {(info: {name: string, mode: number, codec: number, epoch: number, head: number, recovered: boolean}) => void} [opts.onSubscribed]
   *   Called at every SUBSCRIBED: the first, the re-subscribe after a new session, and the
   *   answer to a ring position restated by a resumed session (`recovered`: nothing was lost
   *   while the connection was down).
   * @param {(err: {code: number, reason: string}) => void} [opts.onError] The server refused.
   * @param {(why: {code: number, reason: string}) => void} [opts.onUnsubscribed] The server
   *   ended the subscription (code from §9).
   * @returns {Subscription}
   */
  subscribe(name, callback, opts = {}) {
    if (opts.last !== undefined && opts.last !== null) {
      if (!Number.isSafeInteger(opts.last) || opts.last < 1) {
        throw new TypeError(`last must be an integer of at least 1, got ${String(opts.last)}`);
      }
      checkObjectParams(opts.params, "last", "{last: n}");
    }
    const params = this._rateParams(opts.params, opts.maxRate);
    return this._listen(new Subscription(this, name, callback, opts), params);
  },

  // ----- subscribing and letting go ----------------------------------------------------------

  /**
   * `params` with `{max_rate: r}` merged in (§5b: snapshot and keyed topics), or as they are
   * without a rate. Checked here: the server would refuse a bad one with code 1, far from the
   * call that made it.
   */
  _rateParams(params, maxRate) {
    if (maxRate === undefined || maxRate === null) return params;
    if (typeof maxRate !== "number" || !Number.isFinite(maxRate) || !(maxRate > 0)) {
      throw new RangeError(`maxRate must be a finite number > 0 (messages a second), got ${String(maxRate)}`);
    }
    checkObjectParams(params, "maxRate", "{max_rate: r}");
    return { ...(params ?? {}), max_rate: maxRate };
  },

  /** The wire of `name` with JSON `params`, if this client holds one. */
  _wireFor(name, params) {
    return this._wires.get(wireKey(name, params));
  },

  /**
   * `sub` (a Subscription, or one of its kinds: a table's, presence's) listens to its topic with
   * JSON `params`: on the wire of that name and params if there is one, else on a new one.
   */
  _listen(sub, params) {
    const name = sub.name;
    if (this.state === "closed") {
      sub._fail(new RubrisError("client is closed", ErrorCode.CLOSED));
      return sub;
    }
    for (const other of this._wires.values()) {
      if (other.name === name && other.consumer && !other.consumer._internal) {
        sub._fail(new RubrisError(`${name} is already consumed by this client`, ErrorCode.TOO_MANY));
        return sub;
      }
    }
    let wire = this._wires.get(wireKey(name, params));
    if (!wire) {
      wire = this._openWire(name, params, sub); // joining before SUBSCRIBE: it carries `last`
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
  },

  /**
   * A new WireSubscription for `name` with JSON `params`, subscribed as soon as it can be;
   * `first` (a Subscription) joins it before that SUBSCRIBE is made.
   */
  _openWire(name, params, first = null) {
    const wire = new WireSubscription(wireKey(name, params), name, encodeJson(params), params);
    if (first) wire.joining.add(first);
    this._wires.set(wire.key, wire);
    this._prepareParams(wire);
    if (this._welcomed) this._sendSubscribe(wire);
    return wire;
  },

  /** `sub` lets go (`ready` rejects with `err`, "unsubscribed" by default if still pending). */
  _unsubscribe(sub, err = null) {
    if (sub.closed) return;
    sub.closed = true;
    sub._fail(err ?? new RubrisError("unsubscribed", ErrorCode.UNSUBSCRIBED));
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
        // ACKs first: the server applies them before the UNSUBSCRIBE gives the rest back.
        if (wire.mode === Mode.PRIVATE || wire.mode === Mode.QUEUE) this._sendAck(wire);
        wire.state = "closed";
        this._wires.delete(wire.key);
        this._byTopic.delete(wire.topic);
        this._unsubscribeTopic(wire.topic);
        this._endQueue(wire, new RubrisError("unsubscribed", ErrorCode.UNSUBSCRIBED));
        break;
      default:
        break;
    }
  },

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
  },

  _sendSubscribe(wire) {
    if (wire.paramsReady) return; // sent when the params are deflated
    const req = this._nextReq++;
    wire.reqs.add(req);
    this._byReq.set(req, wire);
    wire.state = "pending";
    // Ring topics ask to replay what they missed (§5), keyed topics for the keys changed since
    // (§5b), from the position they hold (seq 0 of a known epoch included: nothing of it
    // received yet); the server checks the epoch.
    const recover = (wire.mode === Mode.RING || wire.mode === Mode.KEYED) && wire.epoch !== null;
    let params = wire.wireParams;
    let compressed = wire.wireCompressed;
    // Late joiners (§5): `last` only until the first SUBSCRIBED; the largest any listener asked.
    let last = 0;
    if (wire.epoch === null) for (const sub of wire.joining) last = Math.max(last, sub._last ?? 0);
    if (last > 0) {
      // Small and rare: sent as is rather than waiting to deflate the merged params again.
      params = encodeJson({ ...(wire.paramsValue ?? {}), last });
      compressed = false;
      wire.asked.set(req, last);
    }
    const bytes = encode.subscribe(req, wire.name, recover ? wire.epoch : 0, recover ? wire.lastSeq : 0,
      params, compressed);
    this._write({ bytes, keep: "none" });
  },

  _unsubscribeTopic(topic) {
    this._unsubPending.add(topic);
    this._write({ bytes: encode.unsubscribe(topic), keep: "session" });
  },

  // ----- the server's answers ----------------------------------------------------------------

  _onSubscribed(m) {
    const wire = this._byReq.get(m.req);
    if (!wire) return;
    this._byReq.delete(m.req);
    this._restating.delete(m.req);
    wire.reqs.delete(m.req);
    const asked = wire.asked.get(m.req) ?? 0;
    wire.asked.delete(m.req);
    const holder = this._byTopic.get(m.topic);
    if (wire.state === "closed" || wire.closing) {
      // The app let go before the answer came; give the topic back unless another live
      // subscription of ours holds the same number (or its UNSUBSCRIBE is on its way already).
      if (!holder && !this._unsubPending.has(m.topic)) this._unsubscribeTopic(m.topic);
      if (wire.closing) {
        wire.closing = false;
        wire.state = "closed";
        if (this._wires.get(wire.key) === wire) this._wires.delete(wire.key);
      }
      return;
    }
    if (wire.state === "active") {
      this._onRepositioned(wire, m, holder);
      return;
    }
    if (wire.epoch !== m.epoch) {
      wire.resetNumbering(); // a new numbering: old seqs mean nothing
      // The ring starts after head (a late joiner's after the `asked` it replays): what we then
      // hold, so a resume at once states that position.
      if (m.mode === Mode.RING) wire.lastSeq = Math.max(0, m.head - asked);
    }
    wire.state = "active";
    wire.topic = m.topic;
    wire.mode = m.mode;
    wire.codec = m.codec;
    wire.epoch = m.epoch;
    wire.info = subscribedInfo(wire, m);
    if (!this._queueSubscribed(wire, m)) return;
    this._byTopic.set(m.topic, wire);
    const info = wire.info;
    this._enqueue({
      t: "fn",
      fn: () => {
        tellListeners(wire, info);
        for (const sub of [...wire.joining]) this._join(wire, sub, info, asked ? m.head : null);
        // Items wait for this point, so a handler never runs before its onSubscribed.
        if (wire.state === "active") wire.consumer?._start();
      },
    });
  },

  /**
   * SUBSCRIBED for a wire already active: the answer to a ring position restated by a resumed
   * session (§5), or to a SUBSCRIBE sent twice. The same subscription, moved to the position we
   * stated; what follows is its replay, a GAP first for what the server's ring lost. The news
   * (`recovered` above all) goes to the listeners' onSubscribed, as after a new session.
   */
  _onRepositioned(wire, m, holder) {
    if (m.topic !== wire.topic) {
      // Not expected (a session keeps its numbers); the other number is not ours to keep.
      if (!holder) this._unsubscribeTopic(m.topic);
      return;
    }
    if (wire.epoch !== m.epoch) {
      // The topic restarted while we were away: recovered is false; it starts after head.
      wire.resetNumbering();
      if (m.mode === Mode.RING) wire.lastSeq = m.head;
      wire.epoch = m.epoch;
    }
    const info = subscribedInfo(wire, m);
    wire.info = info;
    this._enqueue({ t: "fn", fn: () => tellListeners(wire, info) });
  },

  /**
   * Make `sub` a listener of `wire` (runs in delivery order). `head`: this SUBSCRIBED answered
   * a late joiner's request (§5), whose replay (seqs up to head) follows.
   */
  _join(wire, sub, info = wire.info, head = null) {
    if (!wire.joining.delete(sub) || sub.closed) return;
    if (sub._table && wire.mode !== Mode.KEYED) {
      this._notATable(wire, sub); // tables.js: subscribeTable() of a topic that is not keyed
      return;
    }
    wire.listeners.add(sub);
    sub.info = info;
    sub._resolve(info);
    safeCall(sub._opts.onSubscribed, info);
    if (wire.mode === Mode.SNAPSHOT && wire.last) {
      // A later listener of a shared snapshot gets the current value, as a new subscriber would.
      safeCall(sub._callback, wire.last.value, wire.last.meta);
    }
    if (wire.mode === Mode.KEYED) {
      this._joinTable(wire, sub); // tables.js: the table held so far
      return;
    }
    if (wire.mode !== Mode.RING) return;
    if (head !== null) {
      // The replay carries the largest `last` asked: this listener takes only its own share.
      sub._floor = head - sub._last + 1;
    } else if (sub._last > 0 && wire.history.length) {
      // Joining a topic already flowing: the latest this client delivered, as far as it kept.
      for (const h of wire.history.slice(-sub._last)) safeCall(sub._callback, h.value, h.meta);
    }
    if (sub._last > wire.keep) wire.keep = sub._last;
  },

  _onRejected(m) {
    const wire = this._byReq.get(m.req);
    if (!wire) return;
    this._byReq.delete(m.req);
    wire.reqs.delete(m.req);
    if (wire.state === "active" || wire.reqs.size > 0) return; // another request got through
    wire.state = "closed";
    if (this._wires.get(wire.key) === wire) this._wires.delete(wire.key);
    // names the topic (calls.js): which of several subscriptions was refused is in the message
    const err = this._namedError("subscribe", wire.name, "refused", m.reason, m.code, { topic: wire.name });
    this._endQueue(wire, err);
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
  },

  _onUnsubscribed(m) {
    if (m.code === 0 && this._unsubPending.delete(m.topic)) return; // the answer to our request
    const wire = this._byTopic.get(m.topic);
    if (!wire) return;
    this._byTopic.delete(m.topic);
    if (m.code === ErrorCode.RESTARTED && !wire.consumer && !wire.closing
        && this._wires.get(wire.key) === wire) {
      // The topic's numbering began again (servers sharing it lost it): subscribe again,
      // saying what we hold, to learn the new epoch (recovered: false). It goes on.
      wire.state = "unsent";
      if (this._welcomed) this._sendSubscribe(wire);
      return;
    }
    wire.state = "closed";
    if (this._wires.get(wire.key) === wire) this._wires.delete(wire.key);
    // The server has taken back what the consumer holds: nothing more of it may start.
    this._endQueue(wire, new RubrisError(m.reason || `unsubscribed by the server (code ${m.code})`, m.code));
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
  },

  _onGap(m) {
    const wire = this._byTopic.get(m.topic);
    if (!wire) return;
    const end = m.from + m.count - 1;
    let from = m.from;
    if (wire.mode === Mode.RING && m.count > 0 && from <= wire.lastSeq) {
      // What we received is not lost: "exactly once or inside a GAP" holds for what the app sees.
      if (end <= wire.lastSeq) return;
      from = wire.lastSeq + 1;
    }
    // Lost for good; asking to replay them after a reconnect would only produce the same GAP.
    if (end > wire.lastSeq) wire.lastSeq = end;
    this._counters.gaps++;
    const gap = { from, count: end - from + 1 };
    this._enqueue({
      t: "fn",
      fn: () => {
        this._emit("gap", { name: wire.name, ...gap });
        for (const sub of [...wire.listeners]) safeCall(sub._opts.onGap, gap);
      },
    });
  },

  // ----- messages ----------------------------------------------------------------------------

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
  },

  /** Deliver one PUSH item to the listeners of its topic; called by `_deliver` (flow.js). */
  _deliverPush(item, payload, failure) {
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
        else if (wire.keep > 0 && item.incarnation === wire.incarnation) {
          wire.history.push({ value, meta });
          if (wire.history.length > wire.keep) wire.history.splice(0, wire.history.length - wire.keep);
        }
        for (const sub of wire.listeners.size === 1 ? wire.listeners : [...wire.listeners]) {
          // _floor: a listener that joined a late joiner's replay skips what it did not ask for
          if (!sub.closed && !(item.seq < sub._floor)) safeCall(sub._callback, value, meta);
        }
      }
    }
    if (wire.mode === Mode.PRIVATE) this._noteDelivered(wire, item);
    return null;
  },

  // ----- ACKs of private topics (and a queue consumer's, when it goes) ------------------------

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
  },

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
  },

  _ackMessages(wire) {
    const out = [];
    if (wire.state !== "active") return out;
    if (wire.mode === Mode.PRIVATE && wire.delivered > wire.acked) {
      out.push(encode.ackPrivate(wire.topic, wire.delivered));
      wire.acked = wire.delivered;
      wire.unacked = 0;
    } else if (wire.mode === Mode.QUEUE) {
      const bytes = wire.consumer?._takeAcks();
      if (bytes) out.push(bytes);
    }
    return out;
  },

  _sendAck(wire) {
    if (!this._welcomed) return; // stays dirty; sent after a resume, dropped by a new session
    this._ackDirty.delete(wire);
    for (const bytes of this._ackMessages(wire)) this._write({ bytes, keep: "none" });
  },

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
    parts.push(...this._takeQueueAcks());
    if (parts.length) this._conn.sendUrgent(joinFrames(parts));
  },
};

/** Subscriptions to the same name with the same params share a wire. */
function wireKey(name, params) {
  return `${name}\u0000${params === undefined ? "" : JSON.stringify(params)}`;
}

/** `params` that an option is merged into must be a plain object (or absent). */
function checkObjectParams(params, option, shape) {
  if (params !== undefined && (params === null || typeof params !== "object" || Array.isArray(params))) {
    throw new TypeError(`${option} needs params that are a plain object (merged with ${shape})`);
  }
}

// A queue consumer (§5, mode 4): Consumer, the app's handle on one queue topic, and QueueItem,
// one delivery as its handler gets it. A Consumer keeps the ITEMs the server sends ahead in a
// bounded local buffer, drops those a REVOKE takes back, runs client-side CoDel when an item is
// taken from the buffer (giving back the newest item), hands the items to the handler (or the
// loop of the async-iterator form) one at a time in arrival order, and settles each with an ACK
// or a NACK. It is a Subscription (values.js); the client's side of a queue topic (consume(), a
// queue's SUBSCRIBED, routing ITEM and REVOKE here, writing the ACKs of a task, the reset when a
// connection ends) is queues.js. A consumer reaches its client only through `this._client`.
//
// Why the buffer is reset with the connection: the server takes a session's outstanding items back
// to the head of the queue as soon as its connection is lost, and a resumed session starts with
// none outstanding (§5). Anything still buffered here has been handed to someone else by then;
// starting it would only duplicate work, and ACKing or NACKing it on the next connection would
// name tags the server no longer counts. Each consumer therefore has a generation, bumped at
// every reset; an item remembers its generation, and an ACK or NACK of an older one is not sent.

import { ErrorCode, encode } from "./codec.js";
import { CoDel } from "./codel.js";
import { decodePayload } from "./payloads.js";
import { now, reportAppError, yieldToEventLoop } from "./util.js";
import { Subscription } from "./values.js";

/** Weight of a new sample in the moving mean of the handler's time per item. */
const SERVICE_GAIN = 0.25;

const CONSUMER_DEFAULTS = Object.freeze({
  codelTarget: 20,
  codelInterval: 100,
  maxBuffer: 10_000,
});

/**
 * One delivery of a queue item (§3 ITEM), as the handler of {@link RubrisClient#consume} gets it.
 * It is ACKed when the handler returns (or its promise resolves) and given back (NACK with
 * requeue) when the handler throws (or its promise rejects), unless the handler settled it first
 * with {@link QueueItem#ack} or {@link QueueItem#nack}. Only the first settlement counts.
 */
export class QueueItem {
  constructor(consumer, entry, value) {
    /** The queue topic's name. */
    this.topic = consumer.name;
    /** The value, decoded by the topic's codec (JSON → value, text → string, bytes → Uint8Array). */
    this.value = value;
    /** This delivery's tag (§5): increases per topic and session. */
    this.tag = entry.tag;
    /** 1 on the first delivery of the item, counting up on each redelivery. */
    this.attempt = entry.attempt;
    /** Whether the payload came deflated. */
    this.compressed = entry.compressed;
    this._consumer = consumer;
    this._entry = entry;
    /** @type {null|"ack"|"nack"|"left"} How it was settled ("left": given back unsettled). */
    this.settled = null;
  }

  /**
   * Done: ACKed at the end of the current task, together with the other ACKs of that task.
   * @returns {boolean} false, sending nothing, when the item was settled already, its consumer
   *   is closed, or it came on an earlier connection (the server has taken it back).
   */
  ack() {
    return this._consumer._settle(this, true, true);
  }

  /**
   * Give the item back (NACK, §4).
   * @param {boolean} [requeue=true] true: back to the head of the queue, for any consumer;
   *   false: dropped, or dead-lettered where the channel has a dead-letter topic.
   * @returns {boolean} false, sending nothing, in the cases {@link QueueItem#ack} does.
   */
  nack(requeue = true) {
    return this._consumer._settle(this, false, requeue);
  }
}

/**
 * The app's handle on one queue consumer (returned by {@link RubrisClient#consume}). With a
 * handler it calls the handler for each item; without one it is an async iterable of
 * {@link QueueItem}s. Either way items are taken one at a time, in the order they arrived.
 */
export class Consumer extends Subscription {
  constructor(client, name, handler, opts, internal = false) {
    super(client, name, handler, opts);
    this._internal = internal; // the consumer of subscribe() listeners on a queue topic
    this._codel = opts.codelTarget === null
      ? null
      : new CoDel(opts.codelTarget ?? CONSUMER_DEFAULTS.codelTarget,
        opts.codelInterval ?? CONSUMER_DEFAULTS.codelInterval);
    this._codelKnobs = this._codel ? [this._codel.target, this._codel.interval] : [0, 0];
    this._maxBuffer = opts.maxBuffer ?? CONSUMER_DEFAULTS.maxBuffer;
    this._buffer = []; // entries in arrival order; revoked ones stay, marked gone, until reached
    this._head = 0;
    this._byTag = new Map(); // tag → entry not yet handed to the handler
    /** The handler's time per item, ms: a moving mean of the intervals between takes while
     * items were waiting (0 until measured). */
    this.service = 0;
    this._takenAt = 0;
    this._busy = false;
    this._gen = 0;
    this._live = false; // SUBSCRIBED was delivered: items may go to the handler
    this._pumping = false;
    this._active = null; // the QueueItem the handler has now
    this._acks = []; // tags done in this task, not yet written
    this._closing = false;
    this._ended = false;
    this._closeDone = null; // resolves close()'s promise
    this._closePromise = null;
    // the async-iterator form
    this._iter = null; // {ready: QueueItem|null, current: QueueItem|null, release, wake, error}
    this._counts = {
      received: 0, taken: 0, acked: 0, nacked: 0, codelReturned: 0, overflowed: 0, revoked: 0,
      cleared: 0, stale: 0,
    };
  }

  /**
   * Counters since the consumer was created, and two gauges.
   * - `received`: ITEMs that came; `taken`: items handed to the handler (or the loop).
   * - `acked`, `nacked`: ACKs and NACKs sent (a throwing handler NACKs; so does an item whose
   *   payload does not decode, without requeue).
   * - `codelReturned`: given back (NACK, requeue) by CoDel instead of handed over: it had waited
   *   too long here. `overflowed`: given back at once because `maxBuffer` items were waiting.
   * - `revoked`: taken back by the server (REVOKE) before they were handed over.
   * - `cleared`: dropped unstarted because the connection ended (the server takes them back) or
   *   the consumer closed (its UNSUBSCRIBE gives them back); also an item the loop of the
   *   iterator form left without settling it.
   * - `stale`: settled after the connection it came on had ended: nothing sent, the server
   *   delivers it again.
   * - `buffered`: waiting here now; `active`: 1 while the handler has an item.
   * @returns {{received: number, taken: number, acked: number, nacked: number,
   *   codelReturned: number, overflowed: number, revoked: number, cleared: number,
   *   stale: number, buffered: number, active: number}}
   */
  get stats() {
    return { ...this._counts, buffered: this._byTag.size, active: this._active ? 1 : 0 };
  }

  /**
   * Stop consuming. Items not started are left to the server (UNSUBSCRIBE gives them back to
   * the queue, without counting towards the delivery limit); an item the handler is working on
   * is waited for, so that its ACK or NACK goes out before the UNSUBSCRIBE.
   * @returns {Promise<void>} resolves once the UNSUBSCRIBE is written (or the consumer ended).
   */
  close() {
    if (this._closePromise) return this._closePromise;
    this._closePromise = new Promise((resolve) => { this._closeDone = resolve; });
    if (this._ended) {
      this._closeDone();
      return this._closePromise;
    }
    this._closing = true;
    this._drop();
    if (!this._active) this._finishClose();
    return this._closePromise;
  }

  /** Same as {@link Consumer#close} (the Subscription interface). */
  unsubscribe() {
    return this.close();
  }

  /** Only the handler-less form is iterable: `for await (const item of client.consume(name))`. */
  [Symbol.asyncIterator]() {
    if (!this._iter) throw new TypeError("a consumer with a handler is not iterable");
    return {
      [Symbol.asyncIterator]() {
        return this;
      },
      next: () => this._iterNext(),
      return: () => this._iterReturn(),
    };
  }

  // ----- called by the client ----------------------------------------------------------------

  /** An ITEM for this consumer, at arrival; `inflating` is the inflation of a deflated payload. */
  _receive(m, inflating) {
    const c = this._counts;
    c.received++;
    if (this._closing || this._ended) {
      c.cleared++; // the UNSUBSCRIBE under way gives it back
      return;
    }
    if (this._byTag.size >= this._maxBuffer) {
      c.overflowed++;
      this._sendNack(m.tag, true);
      return;
    }
    const entry = {
      tag: m.tag, attempt: m.attempt, payload: m.payload, compressed: m.compressed, inflating,
      failure: null, receivedAt: now(), gen: this._gen, gone: false,
    };
    this._buffer.push(entry);
    this._byTag.set(m.tag, entry);
    this._schedulePump();
  }

  /** REVOKE (§5): drop those of `tags` that have not been started. */
  _revoke(tags) {
    for (const tag of tags) {
      const entry = this._byTag.get(tag);
      if (!entry) continue; // started, done, or never ours: the server ignores it too
      entry.gone = true;
      this._byTag.delete(tag);
      this._counts.revoked++;
    }
  }

  /** SUBSCRIBED has reached the app (its onSubscribed ran): items may go to the handler now. */
  _start() {
    this._live = true;
    this._schedulePump();
  }

  /** The connection ended: the server took back everything outstanding. */
  _reset() {
    this._gen++;
    this._drop();
    // ACKs made but not yet written never will be: those items are stale after all.
    this._counts.acked -= this._acks.length;
    this._counts.stale += this._acks.length;
    this._acks = [];
    this._codel?.reset();
  }

  /** The encoded ACK of the tags done so far, or null; called when writing ACKs. */
  _takeAcks() {
    if (!this._acks.length) return null;
    const tags = this._acks;
    this._acks = [];
    const wire = this._wire;
    if (!wire || wire.state !== "active" || wire.topic === null) return null;
    return encode.ackQueue(wire.topic, tags);
  }

  /** The subscription is over (unsubscribed, refused, ended by the server, client closed). */
  _fail(err) {
    super._fail(err);
    this._end(err);
  }

  _end(err) {
    if (this._ended) return;
    this._ended = true;
    this._gen++; // what the handler has now can no longer be ACKed
    this._drop();
    // Pending ACKs stay: an unsubscribe writes them just before its UNSUBSCRIBE (_takeAcks
    // refuses once the subscription is gone).
    const it = this._iter;
    if (it) {
      const quiet = err.code === ErrorCode.UNSUBSCRIBED || err.code === ErrorCode.CLOSED;
      if (!quiet) it.error = err;
      this._iterDiscardReady();
      it.wake?.();
    }
    this._closeDone?.();
  }

  // ----- the buffer and the handler ----------------------------------------------------------

  /** Forget every entry not yet handed over (counted as cleared). */
  _drop() {
    this._counts.cleared += this._byTag.size;
    for (const entry of this._byTag.values()) entry.gone = true;
    this._byTag.clear();
    this._buffer = [];
    this._head = 0;
  }

  _schedulePump() {
    if (this._pumping || !this._live || this._ended || this._head >= this._buffer.length) return;
    this._pumping = true;
    queueMicrotask(() => this._pump());
  }

  /** The next entry not revoked, left at the head of the buffer; null when there is none. */
  _peek() {
    while (this._head < this._buffer.length) {
      const entry = this._buffer[this._head];
      if (!entry.gone) return entry;
      this._buffer[this._head++] = undefined;
    }
    this._buffer = [];
    this._head = 0;
    return null;
  }

  /** The newest entry not revoked (the tail of the buffer); null when there is none. */
  _newest() {
    for (let i = this._buffer.length - 1; i >= this._head; i--) {
      const entry = this._buffer[i];
      if (entry && !entry.gone) return entry;
    }
    return null;
  }

  _shift(entry) {
    this._buffer[this._head++] = undefined;
    this._byTag.delete(entry.tag);
    if (this._head > 1024 && this._head * 2 > this._buffer.length) {
      this._buffer = this._buffer.slice(this._head);
      this._head = 0;
    }
  }

  /**
   * Hand the buffered items to the handler, one at a time, in arrival order. An item is taken
   * once its payload is inflated; CoDel then looks at how long it waited here and, when it
   * waited too long behind a slow handler, gives back the newest item of the buffer (NACK with
   * requeue: another consumer may be free) and hands this one over. After each item the pump yields to the event loop, so that item's
   * ACK goes out before the next one starts: the server measures a consumer's processing time
   * from the spacing of its ACKs.
   */
  async _pump() {
    try {
      while (this._live && !this._ended && !this._closing) {
        const entry = this._peek();
        if (!entry) break;
        if (entry.inflating) {
          try {
            entry.payload = await entry.inflating;
          } catch (err) {
            entry.failure = err;
          }
          entry.inflating = null;
          if (entry.gone) continue; // revoked, reset or closed meanwhile
        }
        this._shift(entry);
        const t = now();
        if (this._busy && this._takenAt) {
          const sample = t - this._takenAt;
          this.service = this.service ? this.service + SERVICE_GAIN * (sample - this.service) : sample;
        }
        if (this._codel && this.service) {
          // floors in items, as on the server: for items that take 300 ms, 20 ms of waiting
          // is jitter, not a standing queue
          this._codel.target = Math.max(this._codelKnobs[0], this.service);
          this._codel.interval = Math.max(this._codelKnobs[1], 2 * this.service);
        }
        const more = this._byTag.size > 0;
        // The standing queue is what waited beyond one item's handling (a right-sized prefetch
        // has each item arrive while the one before is handled); the last item in the buffer is
        // no queue at all (RFC 8289). As the Python client does.
        const excess = more ? t - entry.receivedAt - this.service : 0;
        this._takenAt = t;
        this._busy = more;
        if (this._codel?.shouldDrop(excess, t)) {
          // The newest goes back, not this one: it would wait longest here, and the server
          // (whose REVOKE takes the newest too) keeps seeing this consumer start its items in
          // order, so a REVOKE never names one it has started. As the Python client does.
          const back = this._newest();
          if (back) {
            this._counts.codelReturned++;
            back.gone = true;
            this._byTag.delete(back.tag);
            this._sendNack(back.tag, true);
          }
        }
        const value = this._decode(entry);
        if (value === UNDECODABLE) continue;
        const item = new QueueItem(this, entry, value);
        this._counts.taken++;
        this._active = item;
        let ok = true;
        try {
          const result = this._callback(item);
          if (result && typeof result.then === "function") await result;
        } catch (err) {
          ok = false;
          reportAppError(err);
        }
        this._active = null;
        this._settle(item, ok, true);
        if (this._closing) break;
        await yieldToEventLoop();
      }
    } finally {
      this._pumping = false;
    }
    if (this._closing) this._finishClose();
    else this._schedulePump(); // items that came during the last await
  }

  _decode(entry) {
    const wire = this._wire;
    const client = this._client;
    if (entry.failure) {
      // This browser could not inflate it; another consumer may.
      client._emit("error", { code: ErrorCode.PROTOCOL, message: `${this.name}: cannot inflate item ${entry.tag}: ${entry.failure.message}` });
      this._counts.nacked++;
      this._sendNack(entry.tag, true, entry.gen);
      return UNDECODABLE;
    }
    try {
      return decodePayload(wire.codec, entry.payload);
    } catch (err) {
      // The payload itself is bad: no consumer will do better, so it goes to the dead letters.
      client._emit("error", { code: ErrorCode.PROTOCOL, message: `${this.name}: item ${entry.tag} does not decode: ${err.message}` });
      this._counts.nacked++;
      this._sendNack(entry.tag, false, entry.gen);
      return UNDECODABLE;
    }
  }

  /** ACK (`ok`) or NACK an item the handler had; only its first settlement counts. */
  _settle(item, ok, requeue) {
    if (item.settled) return false;
    item.settled = ok ? "ack" : "nack";
    const c = this._counts;
    if (item._entry.gen !== this._gen) {
      c.stale++;
      return false;
    }
    if (!this._wireActive()) return false; // closed: the UNSUBSCRIBE gives it back
    if (ok) {
      c.acked++;
      this._acks.push(item.tag);
      this._client._queueAckLater(this);
    } else {
      c.nacked++;
      this._sendNack(item.tag, requeue);
    }
    return true;
  }

  _sendNack(tag, requeue, gen = this._gen) {
    if (gen !== this._gen || !this._wireActive()) return;
    this._client._write({ bytes: encode.nack(this._wire.topic, tag, requeue), keep: "none" });
  }

  _wireActive() {
    const wire = this._wire;
    return Boolean(wire && wire.state === "active" && wire.topic !== null && this._client._welcomed);
  }

  _finishClose() {
    if (this._ended) {
      this._closeDone?.();
      return;
    }
    if (this._internal) return;
    this._client._unsubscribe(this); // writes the ACKs of this task first, then UNSUBSCRIBE
  }

  // ----- the async-iterator form -------------------------------------------------------------

  _iterHandler(item) {
    const it = this._iter;
    return new Promise((resolve) => {
      it.ready = item;
      it.release = resolve;
      const wake = it.wake;
      it.wake = null;
      wake?.();
    });
  }

  async _iterNext() {
    const it = this._iter;
    if (it.current) {
      // The loop asks for the next item: the body is done with this one.
      it.current = null;
      const release = it.release;
      it.release = null;
      release?.();
    }
    for (;;) {
      if (it.ready) {
        it.current = it.ready;
        it.ready = null;
        return { value: it.current, done: false };
      }
      if (it.error) {
        const err = it.error;
        it.error = null;
        throw err;
      }
      if (this._ended || this._closing) return { value: undefined, done: true };
      await new Promise((resolve) => { it.wake = resolve; });
    }
  }

  async _iterReturn() {
    const it = this._iter;
    // Leaving the loop (break, return, throw) closes the consumer. An item the loop had and did
    // not settle goes back to the queue with the UNSUBSCRIBE, as one not yet started does: the
    // loop cannot tell a break after finishing it from an exception in the middle, so it is
    // neither ACKed nor NACKed (a NACK would count towards the delivery limit).
    const current = it.current;
    it.current = null;
    if (current && !current.settled) {
      current.settled = "left";
      this._counts.cleared++;
    }
    this._iterDiscardReady();
    const release = it.release;
    it.release = null;
    release?.();
    await this.close();
    return { value: undefined, done: true };
  }

  /** An item taken for the loop that the loop will never see: the UNSUBSCRIBE returns it. */
  _iterDiscardReady() {
    const it = this._iter;
    const item = it.ready;
    if (!item) return;
    it.ready = null;
    if (!item.settled) {
      item.settled = "left";
      this._counts.cleared++;
    }
    const release = it.release;
    it.release = null;
    release?.();
  }
}

const UNDECODABLE = Symbol("undecodable");

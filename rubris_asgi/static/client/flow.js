// The inbound queue and flow control (§8): every message for the app waits in one queue, in
// arrival order, and is delivered in slices of ~8 ms with a yield between them (each item after
// its own inflation); how full that queue is decides the NAK levels sent to the server, and how
// often they are repeated. Methods of RubrisClient (installed by rubris-client.js).

import { encode } from "./codec.js";
import { inflateRaw } from "./payloads.js";
import { now, safeCall, yieldToEventLoop } from "./util.js";

/** Work per delivery slice before yielding to the event loop (rendering, input, sockets). */
const SLICE_MS = 8;
/** Minimum spacing of repeated NAKs while the inbound queue stays full (§8). */
const NAK_REPEAT_MS = 100;

/** The NAK level (§8) for an inbound queue of `length` items against `limit`: 0, 50, 75, 87, 100. */
export function nakLevel(length, limit) {
  if (length >= limit) return 100;
  if (length >= limit * 0.87) return 87;
  if (length >= limit * 0.75) return 75;
  if (length >= limit * 0.5) return 50;
  return 0;
}

export const flowMethods = {
  // ----- inbound queue -----------------------------------------------------------------------

  _inflate(payload) {
    const promise = inflateRaw(payload).then((out) => {
      this._counters.compressed++;
      this._counters.bytesSaved += out.length - payload.length;
      return out;
    });
    // Awaited later, in order; until then a failure must not count as unhandled.
    promise.catch(() => {});
    return promise;
  },

  _enqueue(item) {
    this._inbox.push(item);
    this._updateNak();
    if (!this._draining) {
      this._draining = true;
      // After the current frame is fully parsed: control state is then complete for it.
      queueMicrotask(() => this._drain());
    }
  },

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
  },

  /** Deliver one item; returns a promise when delivery must wait (streamIter backpressure). */
  _deliver(item, payload, failure) {
    if (item.t === "fn") {
      safeCall(item.fn);
      return null;
    }
    if (item.t === "reply") return this._deliverReply(item.rec, item.m, payload, failure);
    if (item.t === "entry") return this._deliverEntry(item, payload, failure);
    return this._deliverPush(item, payload, failure);
  },

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
  },

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
  },

  _sendNak(level) {
    this._nakSentAt = now();
    this._nakSentLevel = level;
    this._nakPeak = this._nakLevel;
    this._counters.naks++;
    if (this._welcomed) this._write({ bytes: encode.nak(level), keep: "none" });
  },
};

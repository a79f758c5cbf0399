// Queue topics (§5, mode 4), the client's side: consume(), a queue topic's SUBSCRIBED (the app's
// Consumer, or one that hands the items to subscribe() listeners), ITEM and REVOKE routed to the
// topic's consumer, the ACKs of one task written as one message per consumer, and the reset when
// a connection ends. Methods of RubrisClient (installed by rubris-client.js); the
// SUBSCRIBE/SUBSCRIBED side of a consumer is an ordinary subscription on the wire
// (subscriptions.js), with the Consumer as its one listener. The Consumer itself (its local
// buffer, CoDel, one item at a time to the handler, NACKs) is consumer.js.

import { ErrorCode, Mode } from "./codec.js";
import { Consumer } from "./consumer.js";
import { safeCall, yieldToEventLoop } from "./util.js";
import { RubrisError } from "./values.js";

export const queueMethods = {
  // ----- public API --------------------------------------------------------------------------

  /**
   * Consume a queue topic (§5, mode 4): the server hands each item to one of its consumers, at
   * most `prefetch` unacknowledged at a time per consumer. Items are taken one at a time in
   * arrival order; each is ACKed when the handler returns (or its promise resolves) and given
   * back (NACK, requeue) when it throws (or rejects), unless the handler called `item.ack()` or
   * `item.nack(requeue)` itself. ACKs made in one task go out as one message at its end, never
   * later (the server measures processing time from their spacing); the consumer yields to the
   * event loop after each item, so each item's ACK leaves before the next item starts.
   * Delivery is at least once: after a reconnect, an item in progress may come again (here or
   * elsewhere), so handlers should be idempotent by the item's own identity.
   *
   *     const jobs = client.consume("jobs.resize", async (item) => {
   *       await resize(item.value);            // returns: ACK; throws: NACK, comes back later
   *     }, { prefetch: 8 });
   *     for await (const item of client.consume("jobs.mail")) await send(item.value);
   *
   * Without a handler the consumer is an async iterable, the loop's body taking the handler's
   * place: an item is ACKed when the loop asks for the next one (unless the body settled it).
   * Leaving the loop (break, return, an exception) closes the consumer; an item the body had not
   * settled goes back to the queue with the UNSUBSCRIBE (call `item.ack()` before a `break` to
   * keep it done). One consumer per topic per client (the server has one subscription per topic
   * and session): a second consume() or subscribe() of the same name fails with code 6.
   *
   * @param {string} name Queue topic name, e.g. "jobs.resize".
   * @param {(item: QueueItem) => any} [handler] Called for each item, one at a time.
   * @param {object} [opts]
   * @param {number} [opts.prefetch] Unacknowledged items the server may send ahead (SUBSCRIBE
   *   params `{"prefetch": n}`); omitted: the server sizes it from round trip and handler time.
   * @param {number|null} [opts.codelTarget=20] CoDel on the local buffer: the wait (ms) items may
   *   keep as a standing queue before some are given back (NACK with requeue) for other
   *   consumers; null turns it off.
   * @param {number} [opts.codelInterval=100] CoDel's interval (ms): roughly the worst normal
   *   handler time of one item.
   * @param {number} [opts.maxBuffer=10000] Items buffered here at most; beyond it NACK at once.
   * @param {(info: {name: string, mode: number, codec: number, epoch: number, head: number,
   *   recovered: boolean}) => void} [opts.onSubscribed] As for subscribe().
   * @param {(err: {code: number, reason: string}) => void} [opts.onError] The server refused.
   * @param {(why: {code: number, reason: string}) => void} [opts.onUnsubscribed] The server
   *   ended the subscription.
   * @returns {Consumer}
   */
  consume(name, handler, opts) {
    if (typeof handler !== "function") {
      if (handler != null) opts = handler; // consume(name, opts)
      handler = null;
    }
    opts = { ...(opts ?? {}) };
    checkConsumerOptions(opts);
    const consumer = new Consumer(this, name, handler, opts);
    if (!handler) {
      consumer._iter = { ready: null, current: null, release: null, wake: null, error: null };
      consumer._callback = (item) => consumer._iterHandler(item);
    }
    if (this.state === "closed") {
      consumer._fail(new RubrisError("client is closed", ErrorCode.CLOSED));
      return consumer;
    }
    for (const wire of this._wires.values()) {
      if (wire.name === name) {
        consumer._fail(new RubrisError(`${name} is already subscribed or consumed by this client`, ErrorCode.TOO_MANY));
        return consumer;
      }
    }
    const params = opts.prefetch === undefined ? undefined : { prefetch: opts.prefetch };
    const wire = this._openWire(name, params);
    wire.consumer = consumer;
    consumer._wire = wire;
    wire.joining.add(consumer);
    return consumer;
  },

  // ----- from subscriptions.js and session.js ------------------------------------------------

  /**
   * SUBSCRIBED for `wire`, at arrival. A queue topic gets its consumer: the app's, or one that
   * hands items to the wire's subscribe() listeners. Returns false when the wire must not go
   * active: consume() of a topic that is not a queue.
   */
  _queueSubscribed(wire, m) {
    if (m.mode !== Mode.QUEUE) {
      if (!wire.consumer) return true;
      const consumer = wire.consumer;
      if (consumer._internal) {
        // subscribe() listeners of a topic that was a queue in an earlier session: plain now.
        wire.consumer = null;
        consumer._end(new RubrisError("not a queue topic any more", ErrorCode.UNSUBSCRIBED));
        return true;
      }
      wire.state = "closed";
      if (this._wires.get(wire.key) === wire) this._wires.delete(wire.key);
      if (!this._byTopic.has(m.topic)) this._unsubscribeTopic(m.topic);
      const reason = `${wire.name} is not a queue topic (mode ${m.mode})`;
      this._enqueue({
        t: "fn",
        fn: () => {
          wire.joining.clear();
          consumer.closed = true;
          consumer._fail(new RubrisError(reason, ErrorCode.UNKNOWN));
          safeCall(consumer._opts.onError, { code: ErrorCode.UNKNOWN, reason });
        },
      });
      return false;
    }
    if (!wire.consumer) wire.consumer = this._listenerConsumer(wire);
    return true;
  },

  /** subscribe() on a queue topic: every listener gets `(value, meta)`; one item at a time. */
  _listenerConsumer(wire) {
    const fanOut = (item) => {
      const meta = { name: wire.name, tag: item.tag, attempt: item.attempt, compressed: item.compressed };
      const results = [];
      let error = null;
      for (const sub of [...wire.listeners]) {
        if (sub.closed) continue;
        try {
          results.push(sub._callback(item.value, meta));
        } catch (err) {
          error ??= err;
        }
      }
      if (error) throw error;
      return results.some((r) => r && typeof r.then === "function") ? Promise.all(results) : undefined;
    };
    const consumer = new Consumer(this, wire.name, fanOut, {}, true);
    consumer._wire = wire;
    consumer._resolve(wire.info);
    return consumer;
  },

  _onItem(m) {
    const wire = this._byTopic.get(m.topic);
    // Not ours (any more): the server takes it back with the UNSUBSCRIBE that is under way.
    if (!wire || wire.mode !== Mode.QUEUE || !wire.consumer) return;
    wire.consumer._receive(m, m.compressed ? this._inflate(m.payload) : null);
  },

  _onRevoke(m) {
    const wire = this._byTopic.get(m.topic);
    if (!wire || wire.mode !== Mode.QUEUE || !wire.consumer) return;
    wire.consumer._revoke(m.tags);
  },

  /** The subscription of `wire` is over; its consumer (if any) stops at once. */
  _endQueue(wire, err) {
    wire.consumer?._end(err);
  },

  /** The connection ended (or moves): every consumer's buffer goes, with its pending ACKs. */
  _resetQueues() {
    for (const wire of this._wires.values()) wire.consumer?._reset();
  },

  /** Write the ACKs of this task at its end: one message per consumer, never held longer. */
  _queueAckLater(consumer) {
    this._queueAcksDirty.add(consumer);
    if (this._queueAckScheduled) return;
    this._queueAckScheduled = true;
    yieldToEventLoop().then(() => {
      this._queueAckScheduled = false;
      this._flushQueueAcks();
    });
  },

  _flushQueueAcks() {
    const dirty = [...this._queueAcksDirty];
    this._queueAcksDirty.clear();
    for (const consumer of dirty) {
      const bytes = consumer._takeAcks();
      if (bytes) this._write({ bytes, keep: "none" });
    }
  },

  /** The pending queue ACKs as encoded messages (for an urgent flush: the page is going away). */
  _takeQueueAcks() {
    const out = [];
    for (const consumer of this._queueAcksDirty) {
      const bytes = consumer._takeAcks();
      if (bytes) out.push(bytes);
    }
    this._queueAcksDirty.clear();
    return out;
  },
};

function checkConsumerOptions(opts) {
  const { prefetch, codelTarget, codelInterval, maxBuffer } = opts;
  if (prefetch !== undefined && !(Number.isSafeInteger(prefetch) && prefetch >= 1)) {
    throw new RangeError(`prefetch must be a whole number >= 1, got ${prefetch}`);
  }
  if (codelTarget !== undefined && codelTarget !== null && !(codelTarget > 0)) {
    throw new RangeError(`codelTarget must be > 0 ms or null, got ${codelTarget}`);
  }
  if (codelInterval !== undefined && !(codelInterval > 0)) {
    throw new RangeError(`codelInterval must be > 0 ms, got ${codelInterval}`);
  }
  if (maxBuffer !== undefined && !(Number.isSafeInteger(maxBuffer) && maxBuffer >= 1)) {
    throw new RangeError(`maxBuffer must be a whole number >= 1, got ${maxBuffer}`);
  }
}

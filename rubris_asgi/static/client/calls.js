// Calls and streams: call(), stream() and streamIter(), the call records with their timeouts,
// and the RESULT/STREAM replies (§3), handled at arrival and settled at delivery. Methods of
// RubrisClient (installed by rubris-client.js); replies reach the app through the inbound queue
// (flow.js), whose delivery waits when a streamIter lags.

import { ErrorCode, Kind, encode } from "./codec.js";
import { decodeJson, encodeJson } from "./payloads.js";
import { RubrisError } from "./values.js";

/** Stop accepting calls while the WebSocket's own send buffer holds more than this. */
const WS_BUFFER_LIMIT = 16 * 1024 * 1024;
/** Items a streamIter buffers before delivery waits for its consumer. */
const STREAM_ITER_BUFFER = 256;
/** Characters of a name an error shows at most, as the server does (protocol/naming.py). */
const NAME_SHOWN = 100;

/**
 * `name` as the server quotes it in its reasons (Python's repr, cut after NAME_SHOWN characters
 * with an ellipsis after the quote). Only rare characters are escaped differently; then an error
 * shows the name twice, never not at all.
 */
function quoted(name) {
  const chars = Array.from(String(name));
  const cut = chars.slice(0, NAME_SHOWN);
  const text = cut.join("");
  const q = text.includes("'") && !text.includes('"') ? '"' : "'";
  let out = q;
  for (const ch of cut) {
    const c = ch.codePointAt(0);
    if (ch === "\\" || ch === q) out += `\\${ch}`;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (c < 0x20 || c === 0x7f) out += `\\x${c.toString(16).padStart(2, "0")}`;
    else out += ch;
  }
  return out + q + (chars.length > NAME_SHOWN ? "…" : "");
}

export const callMethods = {
  // ----- public API --------------------------------------------------------------------------

  /**
   * Call a server method.
   * @param {string} method
   * @param {any} [args] JSON-serialisable arguments (omitted: an empty payload).
   * @returns {Promise<any>} the JSON result; rejects with {@link RubrisError}.
   */
  call(method, args) {
    return this._startCall(method, args, null);
  },

  /**
   * Call a streamed method; `onItem` gets each item in order.
   * @param {string} method
   * @param {any} args
   * @param {(item: any) => void} onItem
   * @returns {Promise<void>} resolves when the stream ends; rejects with {@link RubrisError}.
   */
  stream(method, args, onItem) {
    return this._startCall(method, args, { onItem });
  },

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
  },

  // ----- errors that name what was asked ------------------------------------------------------

  /**
   * A refusal of `action` on `name` as an error: its message begins with what was refused
   * (`subscribe 'prices.AAPL' refused: not for you`), the name left out where the server's
   * `reason` shows it already (`subscribe refused: unknown topic 'prics.AAPL'`), so that it
   * appears once whichever server answered. `reason` (the server's own text) and `what` (e.g.
   * `{topic: name}`) are set on the error too. Shared with subscriptions.js through `this`.
   */
  _namedError(action, name, outcome, reason, code, what) {
    const shown = quoted(name);
    const subject = reason.includes(shown) ? action : `${action} ${shown}`;
    const err = new RubrisError(reason ? `${subject} ${outcome}: ${reason}` : `${subject} ${outcome}`, code);
    err.reason = reason;
    return Object.assign(err, what);
  },

  // ----- call records ------------------------------------------------------------------------

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
  },

  _armCallTimer(rec) {
    const ms = this._opts.callTimeoutMs;
    if (!ms) return;
    clearTimeout(rec.timer);
    rec.timer = setTimeout(() => {
      this._failCall(rec, new RubrisError(`${rec.method}: no answer within ${ms} ms`, ErrorCode.TIMEOUT));
    }, ms);
  },

  _settleCall(rec, value) {
    if (rec.done) return;
    rec.done = true;
    clearTimeout(rec.timer);
    this._calls.delete(rec.id);
    rec.resolve(value);
  },

  _failCall(rec, err) {
    if (rec.done) return;
    rec.done = true;
    clearTimeout(rec.timer);
    this._calls.delete(rec.id);
    rec.reject(err);
  },

  // ----- replies -----------------------------------------------------------------------------

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
  },

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
      else this._failCall(rec, this._callError(rec.method, value));
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
  },

  /** The error of a RESULT with status 1 (`{code, message}`) for a call of `method`. */
  _callError(method, value) {
    let message = "";
    let code = ErrorCode.REJECTED;
    if (value && typeof value === "object") {
      message = value.message === undefined ? "" : String(value.message);
      code = value.code ?? ErrorCode.REJECTED;
    } else if (value !== undefined) {
      message = String(value);
    }
    return this._namedError("call", method, "failed", message, code, { method });
  },
};

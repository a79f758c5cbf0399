// The public value classes: RubrisError, for refusals by the server and the client's own failures,
// and Subscription, the app's handle on one subscription (what RubrisClient#subscribe returns).
// They import nothing, so any module can create them; a Subscription talks to its client only
// through `unsubscribe()`, which calls the client's `_unsubscribe` (subscriptions.js).

/**
 * An error from the server (a call's `{code, message}`, a REJECTED subscribe, a GOODBYE) or from
 * the client itself. `code` is a number from protocol.md §9 (or an application's own code) for
 * server errors, and one of the strings of {@link ErrorCode} ("closed", "timeout",
 * "unsubscribed") for the client's own.
 */
export class RubrisError extends Error {
  /**
   * @param {string} message
   * @param {number|"closed"|"timeout"|"unsubscribed"} code
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
    this._last = opts.last ?? 0; // late joiner (§5): how many of the ring's latest it asked for
    this._floor = 0; // ring seqs below this are not for it (the rest of others' late-join replay)
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

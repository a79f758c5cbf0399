// The write path: every client message goes through `_write`, which batches what one task wrote
// into as few frames as the server's max_frame allows, and decides by the entry's `keep` what
// waits for the next connection while there is none. Methods of RubrisClient (installed by
// rubris-client.js).

import { ErrorCode, joinFrames } from "./codec.js";
import { RubrisError } from "./values.js";

export const outboundMethods = {
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
  },

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
  },
};

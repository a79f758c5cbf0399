// Batch completion tracking (protocol.md §8c): watchBatch(), following a batch's state on the
// snapshot topic `batch.{id}` until it is final. A concern module like the others:
// rubris-client.js installs batchMethods on the class.
//
// A state is `{state: "open"|"sealed"|"complete"|"expired", total, done, failed, completed}`; a
// subscriber gets the current one at once and every change after it (seal, item ends, expiry).
// The topic is a snapshot, so states the page had no time to see are skipped, never the latest.

import { ErrorCode } from "./codec.js";
import { reportAppError, safeCall } from "./util.js";
import { RubrisError } from "./values.js";

/** The states after which a batch changes no more. */
const FINAL = new Set(["complete", "expired"]);

export const batchMethods = {
  /**
   * Follow a batch until it completes or expires.
   *
   * @param {string} id The batch's id (what `rubris.batches.open()` or `POST /api/batches` gave).
   * @param {(state: {state: "open"|"sealed"|"complete"|"expired", total: number, done: number,
   *   failed: number, completed: boolean}) => any} [onUpdate] Called with every state received, the first and the
   *   final one included (an error it throws, or a promise it rejects, is reported, not raised).
   * @param {object} [opts]
   * @param {number|null} [opts.timeout] Milliseconds to wait for the final state; none by default.
   * @returns {Promise<{state: "complete"|"expired", total: number, done: number, failed: number,
   *   completed: boolean}>} Resolves with the final state ("complete" or "expired"). Rejects with
   *   a {@link RubrisError}: the server's code when it refuses the subscription (3: unknown
   *   batch, 4: not allowed) or ends it, "timeout" when `timeout` passes first, "closed" when the
   *   client closes first. The subscription is let go however it ends.
   */
  watchBatch(id, onUpdate, { timeout } = {}) {
    return new Promise((resolve, reject) => {
      let over = false;
      let timer = null;
      let sub = null;
      const onState = (e) => {
        if (e.state === "closed") finish(new RubrisError(`batch ${id}: client closed`, ErrorCode.CLOSED));
      };
      const finish = (err, state) => {
        if (over) return;
        over = true;
        clearTimeout(timer);
        this.off("state", onState);
        sub?.unsubscribe();
        if (err) reject(err);
        else resolve(state);
      };
      if (this.state === "closed") {
        finish(new RubrisError("client is closed", ErrorCode.CLOSED));
        return;
      }
      this.on("state", onState);
      sub = this.subscribe(`batch.${id}`, (state) => {
        if (over) return;
        const result = safeCall(onUpdate, state);
        if (typeof result?.then === "function") result.then(null, reportAppError);
        if (FINAL.has(state?.state)) finish(null, state);
      }, {
        onUnsubscribed: ({ code, reason }) => finish(
          new RubrisError(reason || `batch ${id}: unsubscribed by the server (code ${code})`, code),
        ),
      });
      // refused (REJECTED: code 3 for an unknown batch), or ended before SUBSCRIBED
      sub.ready.catch((err) => finish(err));
      if (timeout !== undefined && timeout !== null) {
        timer = setTimeout(() => finish(
          new RubrisError(`batch ${id}: no final state within ${timeout} ms`, ErrorCode.TIMEOUT),
        ), timeout);
      }
    });
  },
};

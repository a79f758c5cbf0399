// CoDel's control law (Nichols and Jacobson, "Controlling Queue Delay", ACM Queue 2012; RFC 8289),
// without I/O or a clock of its own: when the items of a buffer have waited too long, which of them
// to give back. The same state machine as the server's (rubris_asgi/queues/codel.py), in
// milliseconds. A queue consumer (consumer.js) asks it about every item it takes from its local
// buffer; "drop" there means NACK with requeue, so the server hands the item to a consumer that is
// free (the source document on prefetch). Imports nothing.

/**
 * One buffer's CoDel state. Call {@link CoDel#shouldDrop} for each item as it leaves the buffer.
 *
 *     const c = new CoDel(20, 100);
 *     c.shouldDrop(50, 1000); // false: above target, the interval starts
 *     c.shouldDrop(50, 1100); // true: still above a whole interval later
 *     c.shouldDrop(50, 1150); // false: the next drop is due an interval later,
 *     c.shouldDrop(50, 1201); // true
 *     c.shouldDrop(50, 1273); // true: then interval / sqrt(2) after that, and so on
 *     c.shouldDrop(5, 1300);  // false: under target, the standing queue is gone
 */
export class CoDel {
  /**
   * @param {number} target The sojourn (ms) a buffer may hold as a standing queue; > 0.
   * @param {number} interval How long (ms) the sojourn must stay above target before the first
   *   drop; roughly the worst normal processing time of one item; > 0.
   */
  constructor(target, interval) {
    if (!(target > 0) || !(interval > 0)) {
      throw new RangeError(`CoDel target and interval must be > 0, got ${target}, ${interval}`);
    }
    this.target = target;
    this.interval = interval;
    this.reset();
  }

  /** Forget the state (the buffer was emptied from outside, e.g. by a reconnect). */
  reset() {
    /** When the sojourn will have been above target for an interval (null: it is not above). */
    this.firstAbove = null;
    this.dropping = false;
    this.dropNext = 0;
    /** Drops in the current dropping state: the control law's `count`. */
    this.count = 0;
    this.lastCount = 0;
  }

  /** Whether the sojourn has stayed above target for at least an interval. */
  _above(sojourn, now) {
    if (sojourn < this.target) {
      this.firstAbove = null;
      return false;
    }
    if (this.firstAbove === null) {
      this.firstAbove = now + this.interval;
      return false;
    }
    return now >= this.firstAbove;
  }

  /**
   * Whether the item leaving the buffer now, after `sojourn` ms in it, is dropped.
   * @param {number} sojourn ms the item waited in the buffer
   * @param {number} now the clock (ms) the sojourns are measured on
   * @returns {boolean}
   */
  shouldDrop(sojourn, now) {
    const above = this._above(sojourn, now);
    if (this.dropping) {
      if (!above) {
        this.dropping = false;
        return false;
      }
      if (now >= this.dropNext) {
        this.count++;
        // from now when it fell behind (the buffer was not looked at for a while: a stalled
        // page): one drop, not a burst to catch up with the schedule
        const step = this.interval / Math.sqrt(this.count);
        this.dropNext = Math.max(this.dropNext + step, now + step / 2);
        return true;
      }
      return false;
    }
    if (!above) return false;
    this.dropping = true;
    // Re-entering soon after the last dropping state: resume near its rate, as RFC 8289 does.
    const delta = this.count - this.lastCount;
    const recent = now - this.dropNext < 16 * this.interval;
    this.count = delta > 1 && recent ? delta : 1;
    this.lastCount = this.count;
    this.dropNext = now + this.interval / Math.sqrt(this.count);
    return true;
  }
}

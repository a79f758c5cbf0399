// Keyed topics (§5b, mode 5), the client's side: subscribeTable(), presence() and
// presenceCount(); ENTRY from arrival (where the position a resume states is kept) to the table
// (changed at delivery, in order with everything else the app sees), and the handles the app
// holds: TableSubscription, Presence, PresenceCount. Methods of RubrisClient (installed by
// rubris-client.js). The SUBSCRIBE/SUBSCRIBED side of a table is an ordinary subscription on the
// wire (subscriptions.js), restated with its epoch and last seq on a resume as a ring is
// (session.js); the wire holds one LiveTable, which every subscription sharing it reads.

import { EntryOp, ErrorCode, Mode } from "./codec.js";
import { decodePayload, mergePatch } from "./payloads.js";
import { safeCall } from "./util.js";
import { RubrisError, Subscription } from "./values.js";

/** The suffixes of a topic's presence companions, as the server names them (§5b). */
const PRESENCE = "@presence";
const COUNT = "@count";

/** One keyed topic's entries as this client holds them: one per wire, shared by its listeners. */
class LiveTable {
  constructor() {
    this.entries = new Map();
    this.seq = 0; // the last change applied (the wire's lastSeq is the last one received)
    this.synced = false; // whole since the first state (or the last RESET) ended with SYNCED
  }

  /** A detached copy: what a subscription that ended keeps. */
  copy() {
    const t = new LiveTable();
    t.entries = new Map(this.entries);
    t.seq = this.seq;
    t.synced = this.synced;
    return t;
  }
}

/** Promises of "once synced", settled together (whenSynced()). */
class SyncWaiters {
  constructor() {
    this.waiting = [];
  }

  add() {
    return new Promise((resolve, reject) => this.waiting.push({ resolve, reject }));
  }

  resolve() {
    for (const w of this.waiting.splice(0)) w.resolve();
  }

  reject(err) {
    for (const w of this.waiting.splice(0)) w.reject(err);
  }
}

/**
 * The app's handle on a keyed topic (returned by {@link RubrisClient#subscribeTable}): its
 * entries, kept current, and every change to them.
 */
export class TableSubscription extends Subscription {
  constructor(client, name, opts) {
    super(client, name, null, opts);
    this._table = new LiveTable(); // the wire's, once it has one (subscribeTable)
    this._sync = new SyncWaiters();
    this._ended = null; // the RubrisError it ended with
  }

  /**
   * Key → value, kept current: read it at any time (do not change it). The table already holds
   * a change when `onChange` hears of it. After the subscription ends it keeps what it held.
   * @type {Map<string, any>}
   */
  get entries() {
    return this._table.entries;
  }

  /** True once the table is whole: its first state (or the state after a RESET) has come. */
  get synced() {
    return this._table.synced;
  }

  /** The seq of the last change applied (0 before any). */
  get seq() {
    return this._table.seq;
  }

  /**
   * Resolves once {@link TableSubscription#synced} (at once if it is); rejects with the
   * {@link RubrisError} the subscription ended with if it ends first.
   * @returns {Promise<void>}
   */
  whenSynced() {
    if (this._table.synced) return Promise.resolve();
    if (this._ended) return Promise.reject(this._ended);
    return this._sync.add();
  }

  /** A change applied to the table (runs in delivery order). */
  _entry(change) {
    safeCall(this._opts.onChange, change);
    if (change.op === "synced") this._sync.resolve();
  }

  _fail(err) {
    super._fail(err);
    if (this._ended) return; // told once: the first reason is the one
    this._ended = err;
    this._sync.reject(err);
    // From now on it keeps what it held, whoever else on this client still reads the table.
    this._table = this._table.copy();
  }
}

/**
 * Who subscribes to a topic (returned by {@link RubrisClient#presence}): the keyed topic
 * `{topic}@presence`, a member per user, however many tabs or devices it has subscribed with.
 */
export class Presence extends TableSubscription {
  constructor(client, watched, opts) {
    super(client, watched + PRESENCE, opts);
    /** The topic whose subscribers these are. */
    this.watched = watched;
    // The members as of the last whole state while the next whole state comes (the first:
    // nobody; after a RESET: who was there). Its SYNCED tells the callbacks the differences,
    // so a RESET is not everyone leaving and coming back. null while live: each change is told.
    this._before = new Map();
  }

  /**
   * Member (the user's identity as a string; an anonymous session is a member of its own) →
   * `{sessions, info}`, kept current.
   * @type {Map<string, {sessions: number, info: any}>}
   */
  get members() {
    return this._table.entries;
  }

  /** How many members. */
  get count() {
    return this._table.entries.size;
  }

  _entry(change, { had, old, before }) {
    super._entry(change);
    const o = this._opts;
    if (change.op === "reset") {
      this._before ??= before;
      return;
    }
    if (this._before !== null) {
      if (change.op !== "synced") return;
      const was = this._before;
      this._before = null;
      for (const [member, value] of was) {
        if (!this.members.has(member)) safeCall(o.onLeave, member, value);
      }
      for (const [member, value] of [...this.members]) {
        if (!was.has(member)) safeCall(o.onJoin, member, value);
        else if (!sameJson(was.get(member), value)) safeCall(o.onUpdate, member, value);
      }
      return;
    }
    if (change.op === "delete") safeCall(o.onLeave, change.key, change.value);
    else if (change.op === "set" || change.op === "patch") {
      if (!had) safeCall(o.onJoin, change.key, change.value);
      else if (!sameJson(old, change.value)) safeCall(o.onUpdate, change.key, change.value);
    }
  }
}

/**
 * How many subscribe to a topic (returned by {@link RubrisClient#presenceCount}): the snapshot
 * topic `{topic}@count`.
 */
export class PresenceCount extends Subscription {
  constructor(client, watched, onCount, opts) {
    super(client, watched + COUNT, null, opts);
    this._callback = (value) => this._took(value, onCount);
    /** The topic whose subscribers these are. */
    this.watched = watched;
    /** Members (users) subscribed to it: 0 until the first count came. */
    this.members = 0;
    /** Their sessions (tabs, devices). */
    this.sessions = 0;
    this._counted = false;
    this._sync = new SyncWaiters();
    this._ended = null;
  }

  /**
   * Resolves once the first count has come (the server sends it at once); rejects as
   * {@link TableSubscription#whenSynced} does.
   * @returns {Promise<void>}
   */
  whenSynced() {
    if (this._counted) return Promise.resolve();
    if (this._ended) return Promise.reject(this._ended);
    return this._sync.add();
  }

  _took(value, onCount) {
    if (value && Number.isSafeInteger(value.members) && Number.isSafeInteger(value.sessions)) {
      this.members = value.members;
      this.sessions = value.sessions;
    }
    this._counted = true;
    safeCall(onCount, { members: this.members, sessions: this.sessions });
    this._sync.resolve();
  }

  _fail(err) {
    super._fail(err);
    if (this._ended) return;
    this._ended = err;
    this._sync.reject(err);
  }
}

/** Equal as JSON values (key order aside): what tells a member's update from a repeat. */
function sameJson(a, b) {
  if (a === b) return true;
  if (a === null || b === null || typeof a !== "object" || typeof b !== "object") return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a);
  if (ka.length !== Object.keys(b).length) return false;
  return ka.every((k) => Object.prototype.hasOwnProperty.call(b, k) && sameJson(a[k], b[k]));
}

/** An ENTRY's op (EntryOp) → the change's `op`, as the app reads it. */
const OPS = ["", "set", "patch", "delete", "reset", "synced"];
/** The context of a change replayed to a listener that joins a table already held. */
const JOINED = Object.freeze({ had: false, old: undefined, before: null, compressed: false });

export const tableMethods = {
  // ----- public API --------------------------------------------------------------------------

  /**
   * Subscribe to a keyed topic (§5b): a live table of entries under string keys. The current
   * entries come first, then SYNCED (`synced`, `whenSynced()`); after that every change, each
   * key conflated by the server to its latest state when changes come faster than this page
   * takes them. Kept across reconnects as a ring is: a resume states the table's epoch and seq
   * and gets the keys changed since, or (when the server cannot say) a "reset" and the whole
   * table again; either way `entries` ends equal to the server's table.
   *
   *     const book = client.subscribeTable("book.AAPL", {
   *       onChange: ({ key, op, value }) => render(key, op === "delete" ? null : value),
   *     });
   *     await book.whenSynced();
   *     console.log(book.entries.size, "price levels");
   *
   * Subscriptions to one name share one table on this client; one joining a table already
   * held gets a "set" for each entry held (and "synced" if it is), then the changes.
   *
   * @param {string} name Keyed topic name, e.g. "book.AAPL".
   * @param {object} [opts]
   * @param {(change: {key: string, op: "set"|"patch"|"delete"|"reset"|"synced", value: any, seq: number}) => void} [opts.onChange]
   *   Each change, in order, once the table holds it: "set" and "patch" (`value` the entry's
   *   new whole value, a PATCH applied by RFC 7386), "delete" (`value` the one it had),
   *   "reset" (the table was emptied: the whole of it follows; `key` "" and `value` null) and
   *   "synced" (the table is whole as of `seq`).
   * @param {number} [opts.maxRate] At most this many frames of this topic a second after the
   *   first state, each with every changed key's latest state (SUBSCRIBE params
   *   `{"max_rate": r}`). One rate per table per client: a second subscribeTable() of the name
   *   with another rate fails with code 6.
   * @param {(info: object) => void} [opts.onSubscribed] As for subscribe().
   * @param {(err: {code: number, reason: string}) => void} [opts.onError] The server refused
   *   (or the topic is not keyed: code 3).
   * @param {(why: {code: number, reason: string}) => void} [opts.onUnsubscribed] The server
   *   ended the subscription.
   * @returns {TableSubscription}
   */
  subscribeTable(name, opts = {}) {
    const params = this._rateParams(undefined, opts.maxRate);
    return this._listenTable(new TableSubscription(this, name, opts), params);
  },

  /**
   * Follow who subscribes to the topic `name` (the keyed topic `{name}@presence`, §5b). The
   * server authorises it as a subscription to `name` itself; being a member takes subscribing
   * to `name`, not to its presence. A user with several tabs is one member, its `sessions` their
   * number; a dropped connection that resumes is neither a leave nor a join.
   *
   *     const room = client.presence("room.42", {
   *       onJoin: (member, { info }) => toast(`${info?.name ?? member} joined`),
   *       onLeave: (member) => toast(`${member} left`),
   *     });
   *     await room.whenSynced();
   *     console.log(room.count, [...room.members.keys()]);
   *
   * The callbacks tell whole states: the members of the first state are joins, told when it is
   * complete (SYNCED); after a RESET only the differences are told, once the new state is whole.
   *
   * @param {string} name The watched topic, e.g. "room.42".
   * @param {object} [opts]
   * @param {(member: string, value: {sessions: number, info: any}) => void} [opts.onJoin]
   * @param {(member: string, value: {sessions: number, info: any}) => void} [opts.onLeave]
   *   `value` is the one it had.
   * @param {(member: string, value: {sessions: number, info: any}) => void} [opts.onUpdate]
   *   A member's sessions or info changed.
   * @param {(change: object) => void} [opts.onChange] Every change of the members table, as
   *   subscribeTable()'s onChange gets it (to re-render on any of them).
   * @param {number} [opts.maxRate] As for subscribeTable().
   * @param {(err: {code: number, reason: string}) => void} [opts.onError] The server refused:
   *   code 3, `name`'s channel has no presence; 4, it shows the count alone (presenceCount()).
   * @returns {Presence}
   */
  presence(name, opts = {}) {
    const params = this._rateParams(undefined, opts.maxRate);
    return this._listenTable(new Presence(this, name, opts), params);
  },

  /**
   * Follow how many subscribe to the topic `name` (the snapshot topic `{name}@count`, §5b),
   * offered by channels with `presence=True` and `presence="count"` alike.
   *
   *     client.presenceCount("room.42", ({ members }) => { badge.textContent = members; });
   *
   * @param {string} name The watched topic.
   * @param {(count: {members: number, sessions: number}) => void} [onCount] Each new count,
   *   the first at once.
   * @param {object} [opts]
   * @param {number} [opts.maxRate] As for subscribe().
   * @param {(err: {code: number, reason: string}) => void} [opts.onError] The server refused
   *   (code 3: `name`'s channel has no presence).
   * @returns {PresenceCount}
   */
  presenceCount(name, onCount, opts = {}) {
    const params = this._rateParams(undefined, opts.maxRate);
    return this._listen(new PresenceCount(this, name, onCount, opts), params);
  },

  // ----- from subscriptions.js and session.js ------------------------------------------------

  /** `sub` (a TableSubscription) listens to its topic, on the wire's one table. */
  _listenTable(sub, params) {
    const same = this._wireFor(sub.name, params);
    for (const wire of this._wires.values()) {
      // The server holds one subscription per topic and session: one rate for all of ours.
      if (wire.name === sub.name && wire !== same) {
        const why = `${sub.name} is already subscribed by this client with other params (maxRate)`;
        sub._fail(new RubrisError(why, ErrorCode.TOO_MANY));
        return sub;
      }
    }
    this._listen(sub, params);
    if (sub._wire) sub._table = sub._wire.table ??= new LiveTable();
    return sub;
  },

  /**
   * A listener joins an active keyed topic (in delivery order): what the table holds so far
   * reaches it as a "set" per entry (the table's seq for each: the client keeps no seq per key),
   * then "synced" if it is whole, as a new subscriber would hear it from the server.
   */
  _joinTable(wire, sub) {
    const table = wire.table;
    if (!table) return;
    const seq = table.seq;
    for (const [key, value] of [...table.entries]) {
      this._tell(wire, sub, { key, op: "set", value, seq, bytes: 0 }, JOINED); // held: no wire
    }
    if (table.synced) this._tell(wire, sub, { key: "", op: "synced", value: null, seq, bytes: 0 }, JOINED);
  },

  /** subscribeTable() or presence() of a topic that is not keyed: it fails (code 3). */
  _notATable(wire, sub) {
    const reason = `${wire.name} is not a keyed topic (mode ${wire.mode})`;
    this._unsubscribe(sub, new RubrisError(reason, ErrorCode.UNKNOWN));
    safeCall(sub._opts.onError, { code: ErrorCode.UNKNOWN, reason });
  },

  /**
   * ENTRY at arrival. The position is kept here, at arrival, as a ring's is: a resume states
   * the last seq received (what the inbound queue still holds is applied before anything the
   * replay brings). The table itself changes at delivery, in order.
   */
  _onEntry(m) {
    const wire = this._byTopic.get(m.topic);
    if (!wire || wire.mode !== Mode.KEYED) return;
    switch (m.op) {
      case EntryOp.SET:
      case EntryOp.PATCH:
      case EntryOp.DELETE:
        // Held already: a restated position's replay after what was still in flight. Each key
        // comes as its latest change, so one at or below what we hold is one we received.
        if (m.seq <= wire.lastSeq) return;
        wire.lastSeq = m.seq;
        break;
      case EntryOp.RESET:
        wire.lastSeq = 0; // nothing of the state that follows is held yet (its seqs start low)
        break;
      case EntryOp.SYNCED:
        wire.lastSeq = m.seq; // the whole table as of head: a resume asks for what came after
        break;
      default:
        return; // an op this client does not know: skipped, as §2 skips unknown kinds
    }
    this._enqueue({
      t: "entry", wire, seq: m.seq, op: m.op, key: m.key, payload: m.payload, compressed: m.compressed,
      bytes: m.bytes,
      inflating: m.compressed ? this._inflate(m.payload) : null,
    });
  },

  /** One ENTRY applied to its wire's table, then told to the listeners; called by `_deliver`. */
  _deliverEntry(item, payload, failure) {
    const wire = item.wire;
    const table = (wire.table ??= new LiveTable());
    const { key, seq } = item;
    if (failure) {
      this._emit("error", { code: ErrorCode.PROTOCOL, message: `${wire.name}: cannot inflate entry ${seq}: ${failure.message}` });
      return null;
    }
    let value = null;
    if (item.op === EntryOp.SET || item.op === EntryOp.PATCH) {
      try {
        value = decodePayload(wire.codec, payload);
      } catch (err) {
        this._emit("error", { code: ErrorCode.PROTOCOL, message: `${wire.name}: entry ${seq} does not decode: ${err.message}` });
        return null;
      }
    }
    const entries = table.entries;
    const had = entries.has(key);
    const old = entries.get(key);
    let before = null;
    switch (item.op) {
      case EntryOp.SET:
        entries.set(key, value);
        table.seq = seq;
        break;
      case EntryOp.PATCH:
        value = mergePatch(old, value);
        entries.set(key, value);
        table.seq = seq;
        break;
      case EntryOp.DELETE:
        table.seq = seq;
        if (!had) return null; // a key this table never held (set and deleted while away)
        entries.delete(key);
        value = old;
        break;
      case EntryOp.RESET:
        before = new Map(entries);
        entries.clear();
        table.synced = false;
        table.seq = 0;
        break;
      default: // SYNCED
        table.synced = true;
        table.seq = seq;
        break;
    }
    const change = { key, op: OPS[item.op], value, seq, bytes: item.bytes };
    const ctx = { had, old, before, compressed: item.compressed };
    const listeners = wire.listeners.size === 1 ? wire.listeners : [...wire.listeners];
    for (const sub of listeners) {
      if (!sub.closed) this._tell(wire, sub, change, ctx);
    }
    return null;
  },

  /**
   * `change` to one listener: a table's handle takes it with `ctx` (whether the key was held and
   * its value before, the entries before a RESET: what presence tells joins and leaves by); a
   * plain subscribe() callback gets it as its value.
   */
  _tell(wire, sub, change, ctx) {
    if (typeof sub._entry === "function") sub._entry(change, ctx);
    else safeCall(sub._callback, change, { name: wire.name, seq: change.seq, compressed: ctx.compressed });
  },
};

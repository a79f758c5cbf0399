// TypeScript declarations of the rubris browser client: every name client.js exports, as the
// JSDoc of client/*.js describes it. Written by hand (the client has no build step);
// tests/typescript/check.ts uses every name declared here, compiled with `strict`, against a
// live server (tests/test_typescript.py), so these stay true to the code.
//
// Section numbers (§n) refer to the project's protocol.md, "rubris wire protocol, version 1".

// ----- the protocol's numbers (client/codec.js) ----------------------------------------------

/** Message kinds (§3, §4): the low 7 bits of the kind byte; 0x80 is the COMPRESSED flag. */
export declare const Kind: {
  readonly WELCOME: 0x01;
  readonly PUSH: 0x02;
  readonly RESULT: 0x03;
  readonly STREAM: 0x04;
  readonly SUBSCRIBED: 0x05;
  readonly REJECTED: 0x06;
  readonly UNSUBSCRIBED: 0x07;
  readonly GAP: 0x08;
  readonly PONG: 0x09;
  readonly GOODBYE: 0x0a;
  readonly FLOW: 0x0b;
  readonly ITEM: 0x0c;
  readonly REVOKE: 0x0d;
  readonly ENTRY: 0x0e;
  readonly HELLO: 0x21;
  readonly SUBSCRIBE: 0x22;
  readonly UNSUBSCRIBE: 0x23;
  readonly CALL: 0x24;
  readonly ACK: 0x25;
  readonly NACK: 0x26;
  readonly NAK: 0x27;
  readonly PING: 0x28;
  readonly PUBLISH: 0x29;
};
/** A message kind: one of the values of {@link Kind}. */
export type Kind = (typeof Kind)[keyof typeof Kind];

/** Topic modes announced in SUBSCRIBED (§3). */
export declare const Mode: {
  readonly SNAPSHOT: 1;
  readonly RING: 2;
  readonly PRIVATE: 3;
  readonly QUEUE: 4;
  readonly KEYED: 5;
};
/** A topic mode: one of the values of {@link Mode}. */
export type Mode = (typeof Mode)[keyof typeof Mode];

/**
 * ENTRY's `op` (§5b): SET (the whole value), PATCH (an RFC 7386 merge patch of the value held),
 * DELETE, RESET (drop the table: a full state follows) and SYNCED (the table is whole as of seq).
 */
export declare const EntryOp: {
  readonly SET: 1;
  readonly PATCH: 2;
  readonly DELETE: 3;
  readonly RESET: 4;
  readonly SYNCED: 5;
};
/** An ENTRY op: one of the values of {@link EntryOp}. */
export type EntryOp = (typeof EntryOp)[keyof typeof EntryOp];

/** Payload codecs announced in SUBSCRIBED (§2). */
export declare const Codec: {
  readonly JSON: 0;
  readonly BYTES: 1;
  readonly TEXT: 2;
};
/** A payload codec: one of the values of {@link Codec}. */
export type Codec = (typeof Codec)[keyof typeof Codec];

/**
 * Error codes: the numbers are the protocol's (§9); the strings are this client's own
 * conditions, which never come from a server.
 */
export declare const ErrorCode: {
  readonly PROTOCOL: 1;
  readonly UNSUPPORTED_VERSION: 2;
  readonly UNKNOWN: 3;
  readonly NOT_AUTHORISED: 4;
  readonly TOO_LARGE: 5;
  readonly TOO_MANY: 6;
  readonly SLOW_CONSUMER: 7;
  readonly SESSION_EXPIRED: 8;
  readonly SHUTTING_DOWN: 9;
  readonly REJECTED: 10;
  readonly RESTARTED: 11;
  readonly CLOSED: "closed";
  readonly TIMEOUT: "timeout";
  readonly UNSUBSCRIBED: "unsubscribed";
};
/** One of the values of {@link ErrorCode}. */
export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];
/** The client's own error conditions (never sent by a server). */
export type ClientErrorCode = "closed" | "timeout" | "unsubscribed";

// ----- the public value classes (client/values.js) --------------------------------------------

/**
 * An error from the server (a call's `{code, message}`, a REJECTED subscribe, a GOODBYE) or from
 * the client itself. `code` is a number from protocol.md §9 (or an application's own code) for
 * server errors, and one of the strings of {@link ErrorCode} ("closed", "timeout",
 * "unsubscribed") for the client's own.
 */
export declare class RubrisError extends Error {
  constructor(message: string, code: number | ClientErrorCode);
  name: "RubrisError";
  /** A §9 number (or the application's own) from the server; a string for the client's own. */
  code: number | ClientErrorCode;
  /**
   * A refused subscribe or a failed call: the server's own text (REJECTED's reason, the RESULT
   * error's `message`). `message` begins with what was refused and names it once:
   * `subscribe 'prices.AAPL' refused: not for you`, `call failed: unknown method 'plce_order'`.
   */
  reason?: string;
  /** A refused subscribe (or consume): the topic it asked for. */
  topic?: string;
  /** A failed call, stream or streamIter: the method called. */
  method?: string;
}

/** What SUBSCRIBED says of a topic (`Subscription#info`, `ready`, `onSubscribed`). */
export interface SubscribedInfo {
  /** The topic name. */
  name: string;
  mode: Mode;
  codec: Codec;
  /** The topic's numbering: seqs of another epoch mean nothing. */
  epoch: number;
  /** The topic's latest seq when the server answered. */
  head: number;
  /** A ring position restated or recovered: nothing was lost while the connection was down. */
  recovered: boolean;
}

/**
 * The app's handle on one subscription (returned by {@link RubrisClient.subscribe}); not
 * constructed by the app.
 */
export declare class Subscription {
  protected constructor();
  /** The topic name. */
  readonly name: string;
  /** The latest SUBSCRIBED info, or null. */
  readonly info: SubscribedInfo | null;
  /** True once unsubscribed, refused or ended by the server. */
  readonly closed: boolean;
  /**
   * Resolves with the SUBSCRIBED info; rejects with a {@link RubrisError} when the server
   * refuses (REJECTED) or the subscription ends first. Nobody has to await it: a refusal is
   * also reported to `onError`.
   */
  readonly ready: Promise<SubscribedInfo>;
  /** Stop receiving messages; the server is told once no other listener shares the topic. */
  unsubscribe(): void;
}

// ----- queue consumers (client/consumer.js) -----------------------------------------------------

/**
 * One delivery of a queue item (§3 ITEM), as the handler of {@link RubrisClient.consume} gets it.
 * It is ACKed when the handler returns (or its promise resolves) and given back (NACK with
 * requeue) when the handler throws (or its promise rejects), unless the handler settled it first
 * with {@link QueueItem.ack} or {@link QueueItem.nack}. Only the first settlement counts.
 */
export declare class QueueItem<T = unknown> {
  private constructor();
  /** The queue topic's name. */
  readonly topic: string;
  /** The value, decoded by the topic's codec (JSON → value, text → string, bytes → Uint8Array). */
  readonly value: T;
  /** This delivery's tag (§5): increases per topic and session. */
  readonly tag: number;
  /** 1 on the first delivery of the item, counting up on each redelivery. */
  readonly attempt: number;
  /** Whether the payload came deflated. */
  readonly compressed: boolean;
  /** How it was settled, null while it is not ("left": given back unsettled). */
  readonly settled: null | "ack" | "nack" | "left";
  /**
   * Done: ACKed at the end of the current task, together with the other ACKs of that task.
   * @returns false, sending nothing, when the item was settled already, its consumer is
   *   closed, or it came on an earlier connection (the server has taken it back).
   */
  ack(): boolean;
  /**
   * Give the item back (NACK, §4).
   * @param requeue true (the default): back to the head of the queue, for any consumer;
   *   false: dropped, or dead-lettered where the channel has a dead-letter topic.
   * @returns false, sending nothing, in the cases {@link QueueItem.ack} does.
   */
  nack(requeue?: boolean): boolean;
}

/** A queue consumer's counters since it was created, and two gauges ({@link Consumer.stats}). */
export interface ConsumerStats {
  /** ITEMs that came. */
  received: number;
  /** Items handed to the handler (or the loop). */
  taken: number;
  /** ACKs sent. */
  acked: number;
  /** NACKs sent (a throwing handler NACKs; so does an item whose payload does not decode). */
  nacked: number;
  /** Given back (NACK, requeue) by CoDel instead of handed over: it waited too long here. */
  codelReturned: number;
  /** Given back at once because `maxBuffer` items were waiting. */
  overflowed: number;
  /** Taken back by the server (REVOKE) before they were handed over. */
  revoked: number;
  /**
   * Dropped unstarted because the connection ended or the consumer closed (the server takes
   * them back); also an item the loop of the iterator form left without settling it.
   */
  cleared: number;
  /** Settled after the connection it came on had ended: nothing sent, it comes again. */
  stale: number;
  /** Waiting here now. */
  buffered: number;
  /** 1 while the handler has an item, else 0. */
  active: number;
}

/**
 * The app's handle on one queue consumer (returned by {@link RubrisClient.consume}). With a
 * handler it calls the handler for each item; without one it is an async iterable of
 * {@link QueueItem}s. Either way items are taken one at a time, in the order they arrived.
 */
export declare class Consumer<T = unknown> extends Subscription {
  private constructor();
  /**
   * The handler's time per item, ms: a moving mean of the intervals between takes while items
   * were waiting (0 until measured).
   */
  readonly service: number;
  /** Counters since the consumer was created, and two gauges. */
  get stats(): ConsumerStats;
  /**
   * Stop consuming. Items not started are left to the server (UNSUBSCRIBE gives them back to
   * the queue, without counting towards the delivery limit); an item the handler is working on
   * is waited for, so that its ACK or NACK goes out before the UNSUBSCRIBE.
   * @returns resolves once the UNSUBSCRIBE is written (or the consumer ended).
   */
  close(): Promise<void>;
  /** Same as {@link Consumer.close} (the Subscription interface). */
  unsubscribe(): Promise<void>;
  /**
   * Only the handler-less form is iterable (a consumer with a handler throws a TypeError):
   * `for await (const item of client.consume(name))`. An item is ACKed when the loop asks for
   * the next one, unless the body settled it; leaving the loop closes the consumer, and an item
   * the body had not settled goes back to the queue with the UNSUBSCRIBE.
   */
  [Symbol.asyncIterator](): AsyncIterableIterator<QueueItem<T>>;
}

// ----- RubrisClient (client/rubris-client.js and the concern modules) --------------------------

/** The client's connection state ({@link RubrisClient.state}). */
export type ClientState = "connecting" | "open" | "reconnecting" | "closed";
/** A transport: WebSocket, or HTTP long-poll (§7). */
export type Transport = "websocket" | "longpoll";

/**
 * What the client uses of a WebSocket. The browser's `WebSocket`, Node 22's global one and the
 * `ws` package's (Node 18 and 20) all fit.
 */
export interface WebSocketLike {
  binaryType: string;
  readonly bufferedAmount: number;
  readonly readyState: number;
  onopen: ((event: never) => void) | null;
  onmessage: ((event: never) => void) | null;
  onerror: ((event: never) => void) | null;
  onclose: ((event: never) => void) | null;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
}

/** A WebSocket constructor, called as `new WebSocket(url, "rubris.v1")`. */
export type WebSocketConstructor = new (
  url: string,
  protocols?: string | string[],
) => WebSocketLike;

/**
 * Options of {@link connect} and the {@link RubrisClient} constructor; each optional, and one
 * left out or given as undefined has its default.
 */
export interface ClientOptions {
  /**
   * "auto" (the default) tries WebSocket and falls back to long-poll when WebSockets do not get
   * through: for good if no WebSocket has worked on this page yet; otherwise until a WebSocket
   * opens again (probed with backoff). Without a WebSocket constructor, "auto" is long-poll.
   */
  transport?: "auto" | Transport;
  /** Reconnect (and resume) after a drop. Default true. */
  reconnect?: boolean;
  /** Time (ms) for a WebSocket to reach WELCOME. Default 4000. */
  wsOpenTimeoutMs?: number;
  /** ACK a private topic after this many messages… Default 32. */
  ackEvery?: number;
  /** …or this long (ms) after the first unacknowledged one. Default 200. */
  ackMs?: number;
  /** Inbound queue size that NAK percentages refer to. Default 2048. */
  inboundLimit?: number;
  /** Deflate large SUBSCRIBE params. Default false. */
  compressSubscribe?: boolean;
  /**
   * Reject a call with no answer (or, for a stream, no item) for this long (ms); 0 waits
   * forever. Default 30000.
   */
  callTimeoutMs?: number;
  /** Messages kept while disconnected; beyond it calls reject with code 6. Default 1000. */
  maxPending?: number;
  /** Cap (ms) of the reconnect backoff. Default 5000. */
  backoffMaxMs?: number;
  /** WebSocket constructor (default: the global one). */
  WebSocket?: WebSocketConstructor;
  /** fetch implementation, for long-poll (default: the global one). */
  fetch?: typeof globalThis.fetch;
}

/** `"state"`: whenever {@link RubrisClient.state} changes (and at every WELCOME). */
export interface StateDetail {
  state: ClientState;
  transport: Transport;
  /** Whether the last WELCOME resumed the previous session (subscriptions intact). */
  resumed: boolean;
}

/** `"gap"`: messages of a ring topic that will never arrive. */
export interface GapDetail {
  /** The topic name. */
  name: string;
  /** The first lost seq. */
  from: number;
  count: number;
}

/** `"error"`: protocol trouble, refused frames, a fatal stop. */
export interface ErrorDetail {
  code: number | ClientErrorCode;
  message: string;
}

/** `"goodbye"`: the server is closing the session (§3 GOODBYE). */
export interface GoodbyeDetail {
  /** A §9 code (9: shutting down; the client reconnects unless it is fatal, 2 or 4). */
  code: number;
  reason: string;
}

/** `"flow"`: the server's ingest fill (only relevant to publishing clients). */
export interface FlowDetail {
  /** Percent: 0, 50, 75, 87 or 100. */
  fill: number;
}

/** The events of {@link RubrisClient.on} and the detail each listener gets. */
export interface RubrisClientEvents {
  state: StateDetail;
  gap: GapDetail;
  error: ErrorDetail;
  goodbye: GoodbyeDetail;
  flow: FlowDetail;
}

/** Counters since the client was created ({@link RubrisClient.stats}). */
export interface ClientStats {
  /** Frames received. */
  frames: number;
  /** Protocol messages received. */
  messages: number;
  /** Bytes received. */
  bytesIn: number;
  /** Messages that came deflated. */
  compressed: number;
  /** Inflated minus compressed bytes. */
  bytesSaved: number;
  /** Over the last ~2 s. */
  messagesPerSecond: number;
  gaps: number;
  /** NAKs sent (§8). */
  naks: number;
  /** The inbound queue not yet delivered to the app. */
  inbound: number;
  /** Messages waiting for a connection. */
  pending: number;
  /** The last PING's round trip, null until one came back. */
  rttMs: number | null;
}

/** `meta` of a PUSH (snapshot, ring and private topics), and of a keyed topic's change. */
export interface PushMeta {
  name: string;
  seq: number;
  compressed: boolean;
}

/** `meta` of a queue topic's item, when a queue topic is subscribed rather than consumed. */
export interface ItemMeta {
  name: string;
  tag: number;
  attempt: number;
  compressed: boolean;
}

/** What a subscriber gets with a value: {@link PushMeta}, or {@link ItemMeta} on a queue topic. */
export type MessageMeta = PushMeta | ItemMeta;

/** The server's refusal (REJECTED), as `onError` gets it. */
export interface Refusal {
  /** §9 (10: the handler's Reject, 3: unknown, 4: not authorised). */
  code: number;
  reason: string;
}

/** The server ended a subscription (UNSUBSCRIBED), as `onUnsubscribed` gets it. */
export interface Ending {
  /** §9. */
  code: number;
  reason: string;
}

/** Options of {@link RubrisClient.subscribe}. */
export interface SubscribeOptions {
  /** JSON params for the server's subscribe handler. */
  params?: unknown;
  /**
   * Late joiner (§5): on a ring topic, first the last `last` messages (an integer ≥ 1) the
   * server's ring holds, oldest first, then the new ones. Sent as `{"last": n}` merged into
   * `params`, which must then be a plain object; on the first SUBSCRIBE only. A listener
   * joining a topic already flowing gets up to `last` of the latest messages this client has
   * delivered on it and kept. A snapshot topic ignores it.
   */
  last?: number;
  /**
   * On a snapshot (or keyed) topic: at most this many messages a second (a finite number > 0)
   * after the first value, each the latest (§5b). Sent as `{"max_rate": r}` merged into
   * `params`, which must then be a plain object, on every SUBSCRIBE. A ring, private or queue
   * topic refuses it (code 1).
   */
  maxRate?: number;
  /** Messages lost for good. */
  onGap?: (gap: { from: number; count: number }) => void;
  /**
   * Called at every SUBSCRIBED: the first, the re-subscribe after a new session, and the
   * answer to a ring position restated by a resumed session.
   */
  onSubscribed?: (info: SubscribedInfo) => void;
  /** The server refused. */
  onError?: (err: Refusal) => void;
  /** The server ended the subscription. */
  onUnsubscribed?: (why: Ending) => void;
}

// ----- keyed topics and presence (client/tables.js) --------------------------------------------

/**
 * One change of a keyed topic's table (§5b), as `onChange` gets it; the table already holds it.
 * "set" and "patch": `value` is the entry's new whole value (a PATCH applied by RFC 7386);
 * "delete": the value it had; "reset": the table was emptied, the whole of it follows;
 * "synced": the table is whole as of `seq`.
 */
export type TableChange<V = unknown> =
  | { key: string; op: "set" | "patch" | "delete"; value: V; seq: number; bytes: number }
  | { key: ""; op: "reset" | "synced"; value: null; seq: number; bytes: number };
// `bytes`: the ENTRY message's size on the wire as it came (deflated when it was): what the
// change cost, to show what a table's deltas save

/** Options of {@link RubrisClient.subscribeTable}. */
export interface TableOptions<V = unknown> {
  /** Each change, in order, once the table holds it. */
  onChange?: (change: TableChange<V>) => void;
  /**
   * At most this many frames of this topic a second (a finite number > 0) after the first
   * state, each with every changed key's latest state (SUBSCRIBE params `{"max_rate": r}`).
   * One rate per table per client: another rate for a table already subscribed fails (code 6).
   */
  maxRate?: number;
  /** As for subscribe(): every SUBSCRIBED (`recovered`: a resume got only what changed). */
  onSubscribed?: (info: SubscribedInfo) => void;
  /** The server refused (or the topic is not keyed: code 3). */
  onError?: (err: Refusal) => void;
  /** The server ended the subscription. */
  onUnsubscribed?: (why: Ending) => void;
}

/**
 * A keyed topic, subscribed (returned by {@link RubrisClient.subscribeTable}): its entries, kept
 * current across reconnects, and every change to them. `V` is the caller's word for a value.
 */
export declare class TableSubscription<V = unknown> extends Subscription {
  protected constructor();
  /**
   * Key → value, kept current (read it at any time; do not change it). After the subscription
   * ends it keeps what it held.
   */
  get entries(): ReadonlyMap<string, V>;
  /** True once the table is whole: its first state (or the state after a RESET) has come. */
  get synced(): boolean;
  /** The seq of the last change applied (0 before any). */
  get seq(): number;
  /**
   * Resolves once {@link TableSubscription.synced} (at once if it is); rejects with the
   * {@link RubrisError} the subscription ended with if it ends first.
   */
  whenSynced(): Promise<void>;
}

/** A member's entry in `{topic}@presence`: its sessions (tabs, devices) and the server's info. */
export interface PresenceMember<I = unknown> {
  sessions: number;
  /** What the channel's `presence_info` says of the member; null by default. */
  info: I;
}

/** Options of {@link RubrisClient.presence}. */
export interface PresenceOptions<I = unknown> extends TableOptions<PresenceMember<I>> {
  /** A member joined (the members of the first state too, once it is whole). */
  onJoin?: (member: string, value: PresenceMember<I>) => void;
  /** A member left; `value` is the one it had. */
  onLeave?: (member: string, value: PresenceMember<I>) => void;
  /** A member's sessions or info changed. */
  onUpdate?: (member: string, value: PresenceMember<I>) => void;
}

/**
 * Who subscribes to a topic (returned by {@link RubrisClient.presence}): the keyed topic
 * `{topic}@presence`, one member per user however many tabs it has.
 */
export declare class Presence<I = unknown> extends TableSubscription<PresenceMember<I>> {
  protected constructor();
  /** The topic whose subscribers these are. */
  readonly watched: string;
  /**
   * Member (the user's identity as a string; an anonymous session is a member of its own) →
   * its entry, kept current.
   */
  get members(): ReadonlyMap<string, PresenceMember<I>>;
  /** How many members. */
  get count(): number;
}

/** `{topic}@count`'s value: members (users) and their sessions subscribed to the topic. */
export interface PresenceCountDetail {
  members: number;
  sessions: number;
}

/** Options of {@link RubrisClient.presenceCount}. */
export interface PresenceCountOptions {
  /** As for subscribe(). */
  maxRate?: number;
  onSubscribed?: (info: SubscribedInfo) => void;
  /** The server refused (code 3: the channel has no presence). */
  onError?: (err: Refusal) => void;
  onUnsubscribed?: (why: Ending) => void;
}

/** How many subscribe to a topic (returned by {@link RubrisClient.presenceCount}). */
export declare class PresenceCount extends Subscription {
  private constructor();
  /** The topic whose subscribers these are. */
  readonly watched: string;
  /** Members (users) subscribed: 0 until the first count came. */
  readonly members: number;
  /** Their sessions. */
  readonly sessions: number;
  /** Resolves once the first count has come; rejects if the subscription ends first. */
  whenSynced(): Promise<void>;
}

/** Options of {@link RubrisClient.consume}. */
export interface ConsumeOptions {
  /**
   * Unacknowledged items the server may send ahead (an integer ≥ 1; SUBSCRIBE params
   * `{"prefetch": n}`); omitted: the server sizes it from round trip and handler time.
   */
  prefetch?: number;
  /**
   * CoDel on the local buffer: the wait (ms, > 0) items may keep as a standing queue before
   * some are given back (NACK with requeue) for other consumers; null turns it off. Default 20.
   */
  codelTarget?: number | null;
  /** CoDel's interval (ms, > 0): roughly the worst normal handler time of one item. Default 100. */
  codelInterval?: number;
  /** Items buffered here at most (an integer ≥ 1); beyond it NACK at once. Default 10000. */
  maxBuffer?: number;
  /** As for subscribe(). */
  onSubscribed?: (info: SubscribedInfo) => void;
  /** The server refused (or the topic is not a queue: code 3). */
  onError?: (err: Refusal) => void;
  /** The server ended the subscription. */
  onUnsubscribed?: (why: Ending) => void;
}

/** A batch's state (§8c), as `batch.{id}` carries it. */
export interface BatchState {
  state: "open" | "sealed" | "complete" | "expired";
  /** Items added. */
  total: number;
  done: number;
  failed: number;
  /** True in the state that completed the batch. */
  completed: boolean;
}

/** The state a watched batch ends in. */
export interface FinalBatchState extends BatchState {
  state: "complete" | "expired";
}

/** Options of {@link RubrisClient.watchBatch}. */
export interface WatchBatchOptions {
  /** Milliseconds to wait for the final state; none by default. */
  timeout?: number | null;
}

/**
 * A connection to a rubris server that survives network trouble: it picks a transport, resumes
 * or re-creates its session after a drop, and keeps subscriptions, ACKs and flow control going.
 * Events: see {@link RubrisClientEvents}.
 */
export declare class RubrisClient {
  /**
   * Starts connecting at once; usually created through {@link connect}.
   * @param url Where the plugin is mounted (default "/rubris"); relative to the page, or
   *   absolute (http(s):// or ws(s)://; outside a page it must be absolute). A query string is
   *   sent to every endpoint.
   * @throws TypeError for an unknown `transport` or a URL that does not resolve.
   */
  constructor(url?: string, options?: ClientOptions);

  readonly state: ClientState;
  /** The transport of the current (or last) connection. */
  readonly transport: Transport | null;
  /** Whether the last WELCOME resumed the previous session (subscriptions intact). */
  readonly resumed: boolean;
  /** The session's id, from the last WELCOME; null before it. */
  readonly sessionId: string | null;

  /** Listen to a client event; returns this, for chaining. */
  on<E extends keyof RubrisClientEvents>(
    event: E,
    fn: (detail: RubrisClientEvents[E]) => void,
  ): this;
  /** Remove a listener added with {@link RubrisClient.on}. */
  off<E extends keyof RubrisClientEvents>(
    event: E,
    fn: (detail: RubrisClientEvents[E]) => void,
  ): this;

  /** Counters since the client was created (a new object at each read). */
  get stats(): ClientStats;

  /**
   * Close for good: ACKs what was delivered, fails pending calls (code "closed"), and stops
   * reconnecting. Subscriptions end without callbacks.
   */
  close(): void;

  /**
   * Subscribe to a topic; kept across reconnects (resumed, or made again after a new session).
   * A ring message is never delivered twice nor after a newer one.
   * @param name Topic name, e.g. "prices.AAPL".
   * @param callback Called for every message, in order, with the value decoded by the topic's
   *   codec (JSON → parsed value, bytes → Uint8Array, text → string): `T` is the caller's word
   *   for it. A queue topic (better: consume()) gives items one at a time with {@link ItemMeta};
   *   each is ACKed when the callbacks return (or their promises resolve) and given back (NACK)
   *   when one throws.
   *   A keyed topic (better: subscribeTable()) gives each change, a {@link TableChange}.
   * @throws TypeError for a bad `last` (or `last` or `maxRate` with params that are not a plain
   *   object); RangeError for a bad `maxRate`.
   */
  subscribe<T = unknown>(
    name: string,
    callback: (value: T, meta: MessageMeta) => unknown,
    opts?: SubscribeOptions,
  ): Subscription;

  /**
   * Consume a queue topic (§5, mode 4): the server hands each item to one of its consumers, at
   * most `prefetch` unacknowledged at a time per consumer. Items are taken one at a time in
   * arrival order; each is ACKed when the handler returns (or its promise resolves) and given
   * back (NACK, requeue) when it throws (or rejects), unless the handler settled it itself.
   * Delivery is at least once. One consumer per topic per client: a second consume() or
   * subscribe() of the same name fails with code 6 (`ready` rejects).
   * @param handler Called for each item, one at a time; without one the consumer is an async
   *   iterable of items.
   * @throws RangeError for a bad option.
   */
  consume<T = unknown>(
    name: string,
    handler: ((item: QueueItem<T>) => unknown) | null | undefined,
    opts?: ConsumeOptions,
  ): Consumer<T>;
  consume<T = unknown>(name: string, opts?: ConsumeOptions): Consumer<T>;

  /**
   * Subscribe to a keyed topic (§5b), a live table: the current entries, then SYNCED, then every
   * change, each key conflated to its latest state when changes come faster than the page takes
   * them. Kept across reconnects: a resume states the table's epoch and seq and gets the keys
   * changed since (or a "reset" and the whole table). Subscriptions to one name share one table
   * on this client; one joining a table already held gets a "set" per entry (and "synced").
   * @throws RangeError for a bad `maxRate`.
   */
  subscribeTable<V = unknown>(name: string, opts?: TableOptions<V>): TableSubscription<V>;

  /**
   * Follow who subscribes to the topic `name` (`{name}@presence`): `members`, `count`, and
   * onJoin/onLeave/onUpdate, told whole states (the first state's members join at its SYNCED; a
   * RESET tells only the differences). `ready` rejects with code 3 when the channel has no
   * presence, 4 when it shows the count alone.
   * @throws RangeError for a bad `maxRate`.
   */
  presence<I = unknown>(name: string, opts?: PresenceOptions<I>): Presence<I>;

  /**
   * Follow how many subscribe to the topic `name` (`{name}@count`); `onCount` gets each count,
   * the first at once.
   * @throws RangeError for a bad `maxRate`.
   */
  presenceCount(
    name: string,
    onCount?: (count: PresenceCountDetail) => void,
    opts?: PresenceCountOptions,
  ): PresenceCount;

  /**
   * Call a server method.
   * @param args JSON-serialisable arguments (omitted: an empty payload).
   * @returns the JSON result (`R`: the caller's word for it); rejects with a
   *   {@link RubrisError}: the server's code, "timeout" (`callTimeoutMs`), "closed", 6 when
   *   `maxPending` messages already wait, 8 when the session was lost with the call in flight.
   */
  call<R = unknown>(method: string, args?: unknown): Promise<R>;

  /**
   * Call a streamed method; `onItem` gets each item in order (an exception it throws fails
   * the call).
   * @returns resolves when the stream ends; rejects with a {@link RubrisError}.
   */
  stream<I = unknown>(method: string, args: unknown, onItem: (item: I) => void): Promise<void>;

  /**
   * A streamed call as an async iterable: `for await (const item of client.streamIter(m, a))`.
   * Breaking out of the loop stops delivery (the server is not told: the protocol has no
   * cancel). Delivery of everything else waits while the loop lags more than 256 items behind;
   * consume promptly. The loop throws the call's {@link RubrisError}.
   */
  streamIter<I = unknown>(method: string, args?: unknown): AsyncIterableIterator<I>;

  /**
   * Follow a batch until it completes or expires.
   * @param id The batch's id (what `rubris.batches.open()` or `POST /api/batches` gave).
   * @param onUpdate Called with every state received, the first and the final one included (an
   *   error it throws, or a promise it rejects, is reported, not raised).
   * @returns Resolves with the final state ("complete" or "expired"). Rejects with a
   *   {@link RubrisError}: the server's code when it refuses the subscription (3: unknown batch,
   *   4: not allowed) or ends it, "timeout" when `timeout` passes first, "closed" when the
   *   client closes first. The subscription is let go however it ends.
   */
  watchBatch(
    id: string,
    onUpdate?: (state: BatchState) => unknown,
    opts?: WatchBatchOptions,
  ): Promise<FinalBatchState>;
}

/**
 * Connect to a rubris server; the client starts connecting at once and keeps reconnecting until
 * {@link RubrisClient.close}.
 * @param url Where the plugin is mounted (default "/rubris").
 */
export declare function connect(url?: string, options?: ClientOptions): RubrisClient;

// ----- _internal: the codec and helpers, for the project's tests ------------------------------

/** Growable byte buffer for encoding (client/codec.js). */
declare class Writer {
  constructor(size?: number);
  buf: Uint8Array;
  len: number;
  u8(v: number): this;
  /** Unsigned LEB128; throws RangeError outside 0..2^53-1. */
  uv(v: number): this;
  bytes(b: Uint8Array): this;
  str(s: string): this;
  /** The bytes written, a view of the buffer. */
  view(): Uint8Array;
  /** The bytes written, a copy. */
  finish(): Uint8Array;
}

/** Cursor over one message body (or a whole frame); every read checks the bounds. */
declare class Reader {
  constructor(bytes: Uint8Array, start?: number, end?: number);
  buf: Uint8Array;
  pos: number;
  end: number;
  get remaining(): number;
  u8(): number;
  uv(): number;
  bytes(n: number): Uint8Array;
  str(): string;
  rest(): Uint8Array;
}

/** Raised by the codec on malformed input; the client turns it into a reconnect. */
declare class ProtocolError extends Error {
  constructor(message: string);
  name: "ProtocolError";
  code: 1;
}

/** One buffer's CoDel state (RFC 8289), in milliseconds (client/codel.js). */
declare class CoDel {
  /** @throws RangeError unless both are > 0. */
  constructor(target: number, interval: number);
  target: number;
  interval: number;
  firstAbove: number | null;
  dropping: boolean;
  dropNext: number;
  count: number;
  lastCount: number;
  reset(): void;
  /** Whether the item leaving the buffer at `now`, after `sojourn` ms in it, is dropped. */
  shouldDrop(sojourn: number, now: number): boolean;
}

/** A message of a frame, not yet interpreted. */
interface RawMessage {
  kind: number;
  compressed: boolean;
  body: Uint8Array;
}

/** A parsed server→client message (§3); `payload` is still deflated when `compressed`. */
type ServerMessage = { compressed: boolean } & (
  | {
      kind: 0x01;
      session: string;
      resume: string;
      heartbeatMs: number;
      maxFrame: number;
      resumed: number;
    }
  | { kind: 0x02; topic: number; seq: number; payload: Uint8Array }
  | { kind: 0x03; call: number; status: number; payload: Uint8Array }
  | { kind: 0x04; call: number; last: number; payload: Uint8Array }
  | {
      kind: 0x05;
      req: number;
      topic: number;
      mode: number;
      codec: number;
      epoch: number;
      head: number;
      recovered: number;
      name: string;
    }
  | { kind: 0x06; req: number; code: number; reason: string }
  | { kind: 0x07; topic: number; code: number; reason: string }
  | { kind: 0x08; topic: number; from: number; count: number }
  | { kind: 0x09; token: number }
  | { kind: 0x0a; code: number; reason: string }
  | { kind: 0x0b; fill: number }
  | { kind: 0x0c; topic: number; tag: number; attempt: number; payload: Uint8Array }
  | { kind: 0x0d; topic: number; tags: number[] }
  | { kind: 0x0e; topic: number; seq: number; op: number; key: string; payload: Uint8Array }
);

/** A parsed client→server message (§4). ACK's numbers: `upto`, or a queue's `n tag×n`. */
type ClientMessage =
  | { kind: 0x21; version: number; resume: string }
  | {
      kind: 0x22;
      compressed: boolean;
      req: number;
      name: string;
      epoch: number;
      since: number;
      params: Uint8Array;
    }
  | { kind: 0x23; topic: number }
  | { kind: 0x24; compressed: boolean; call: number; method: string; payload: Uint8Array }
  | { kind: 0x25; topic: number; numbers: number[] }
  | { kind: 0x26; topic: number; tag: number; requeue: number }
  | { kind: 0x27; fill: number }
  | { kind: 0x28; token: number }
  | { kind: 0x29; compressed: boolean; req: number; name: string; payload: Uint8Array };

/** Codec and helpers, exported for the project's tests; not a stable API. */
export declare const _internal: Readonly<{
  Writer: typeof Writer;
  Reader: typeof Reader;
  ProtocolError: typeof ProtocolError;
  /** Split a frame into its messages (§2) without interpreting bodies. */
  splitFrame(frame: Uint8Array): RawMessage[];
  /** Decode a server frame; unknown kinds are skipped, anything malformed throws ProtocolError. */
  decodeFrame(frame: Uint8Array): ServerMessage[];
  parseServerMessage(kind: number, compressed: boolean, body: Uint8Array): ServerMessage;
  decodeClientFrame(frame: Uint8Array): ClientMessage[];
  parseClientMessage(kind: number, compressed: boolean, body: Uint8Array): ClientMessage;
  /** Encoders of the client→server messages (§4); each returns one encoded message. */
  encode: Readonly<{
    hello(resume?: string): Uint8Array;
    subscribe(
      req: number,
      name: string,
      epoch: number,
      since: number,
      params?: Uint8Array,
      compressed?: boolean,
    ): Uint8Array;
    unsubscribe(topic: number): Uint8Array;
    call(call: number, method: string, payload?: Uint8Array): Uint8Array;
    ackPrivate(topic: number, upto: number): Uint8Array;
    ackQueue(topic: number, tags: readonly number[]): Uint8Array;
    nack(topic: number, tag: number, requeue?: boolean): Uint8Array;
    nak(fill: number): Uint8Array;
    ping(token: number): Uint8Array;
  }>;
  /** `kind:u8 len:uv body` around a body built by `fill(writer)`. */
  message(kind: number, fill: (w: Writer) => void): Uint8Array;
  /** Concatenate encoded messages (or frames) into one frame. */
  joinFrames(parts: readonly Uint8Array[]): Uint8Array;
  /** Raw DEFLATE (RFC 1951) as the COMPRESSED flag means it, through DecompressionStream. */
  inflateRaw(bytes: Uint8Array): Promise<Uint8Array>;
  deflateRaw(bytes: Uint8Array): Promise<Uint8Array>;
  /** Decode a topic payload by the codec SUBSCRIBED announced. */
  decodePayload(codec: number, bytes: Uint8Array): unknown;
  /** `patch` applied to `target` by RFC 7386 (JSON merge patch); `target` is not changed. */
  mergePatch(target: unknown, patch: unknown): unknown;
  /** The NAK level (§8) for an inbound queue of `length` items against `limit`. */
  nakLevel(length: number, limit: number): 0 | 50 | 75 | 87 | 100;
  CoDel: typeof CoDel;
  /** Exponential backoff with jitter, capped. */
  backoffDelay(attempt: number, baseMs?: number, capMs?: number, random?: () => number): number;
  /** Where the endpoints live; throws TypeError for a URL that does not resolve. */
  resolveUrls(url: string): {
    ws: string;
    lpOpen: string;
    lpSession(session: string): string;
    query: string;
  };
}>;

// Only the names exported above are the module's (no implicit export of the helper types).
export {};

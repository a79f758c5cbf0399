// The rubris-client package as a strict TypeScript project uses it, against a live server
// (tests/ts_app.py, served by tests/test_typescript.py):
//
//     node dist/check.js http://127.0.0.1:PORT/rubris [websocket] [longpoll]
//
// It imports every public name of "rubris-client" (the types included) and runs the client's
// public API once per transport: connect, state events, a snapshot topic, a ring topic (late
// joiner), a private topic, a queue topic subscribed, RPC (call, stream, streamIter), a work
// queue consumed by a handler (ack, nack, redelivery) and by a loop, a batch watched to
// completion, a keyed topic's table (set, patch, delete: the Map equals the server's table),
// presence and its count, the error paths (each a RubrisError with its code), stats, on/off,
// close. It
// prints one JSON line, {"ok": true, ...} and exits 0, or {"ok": false, "error": ...} and exits 1.
//
// WebSocket: the global one where there is one (browsers, Node 22 and later), else the `ws`
// package's, passed as the `WebSocket` option (Node 18 has no global WebSocket, Node 20 only
// with --experimental-websocket). Long-poll uses the global fetch (Node 18 and later).

import {
  Codec,
  Consumer,
  EntryOp,
  ErrorCode,
  Kind,
  Mode,
  Presence,
  PresenceCount,
  QueueItem,
  RubrisClient,
  RubrisError,
  Subscription,
  TableSubscription,
  _internal,
  connect,
  type BatchState,
  type ClientErrorCode,
  type ClientOptions,
  type ClientState,
  type ClientStats,
  type ConsumeOptions,
  type ConsumerStats,
  type Ending,
  type ErrorDetail,
  type FinalBatchState,
  type FlowDetail,
  type GapDetail,
  type GoodbyeDetail,
  type ItemMeta,
  type MessageMeta,
  type PresenceCountDetail,
  type PresenceCountOptions,
  type PresenceMember,
  type PresenceOptions,
  type PushMeta,
  type Refusal,
  type RubrisClientEvents,
  type StateDetail,
  type SubscribeOptions,
  type SubscribedInfo,
  type TableChange,
  type TableOptions,
  type Transport,
  type WatchBatchOptions,
  type WebSocketConstructor,
  type WebSocketLike,
} from "rubris-client";
import NodeWebSocket from "ws";

const WAIT_MS = 10_000; // bound of one wait
const DEADLINE_MS = 25_000; // bound of the whole check

interface Price {
  symbol: string;
  px: number;
}
interface Trade {
  symbol: string;
  n: number;
}
interface Fill {
  i: number;
}
interface Job {
  n: number;
}
interface Big {
  text: string;
}
interface Order {
  symbol: string;
  side: "buy" | "sell";
  qty: number;
}
interface Level {
  px: number;
  qty: number;
  note?: string;
  flags?: { hot: boolean };
}
/** What the server's `table` method answers: its head and its whole table. */
interface ServerTable {
  seq: number;
  entries: Record<string, Level>;
}

class CheckFailed extends Error {}

function assert(cond: unknown, what: string): asserts cond {
  if (!cond) throw new CheckFailed(what);
}

function same(a: unknown, b: unknown): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** `promise`, or a CheckFailed naming `what` after WAIT_MS. */
async function within<T>(promise: Promise<T>, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new CheckFailed(`timed out: ${what}`)), WAIT_MS);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Waits until `cond()` holds, polling. */
async function until(cond: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + WAIT_MS;
  while (!cond()) {
    if (Date.now() > deadline) throw new CheckFailed(`timed out: ${what}`);
    await sleep(5);
  }
}

/** The RubrisError `promise` rejects with (anything else fails the check). */
async function refusal(promise: Promise<unknown>, what: string): Promise<RubrisError> {
  try {
    await within(promise, what);
  } catch (err) {
    if (err instanceof CheckFailed) throw err;
    assert(err instanceof RubrisError, `${what}: not a RubrisError: ${String(err)}`);
    assert(err.name === "RubrisError" && err instanceof Error, `${what}: name ${err.name}`);
    return err;
  }
  throw new CheckFailed(`${what}: resolved instead of rejecting`);
}

/** JSON with every object's keys sorted: equal tables compare equal whatever their order. */
function canonical(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) =>
    v !== null && typeof v === "object" && !Array.isArray(v)
      ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)))
      : v,
  );
}

/** The code of an error, as a RubrisError carries it: a §9 number or the client's own string. */
function codeOf(err: RubrisError): ErrorCode | number {
  return err.code;
}

/**
 * The WebSocket constructor: the global one where it exists (its DOM type must fit the option),
 * else the ws package's. Wrapped so the check sees the sockets the client opens.
 */
function recordingWebSocket(sockets: WebSocketLike[]): WebSocketConstructor {
  const globalWebSocket: WebSocketConstructor | undefined =
    typeof WebSocket === "function" ? WebSocket : undefined;
  const base: WebSocketConstructor = globalWebSocket ?? NodeWebSocket;
  return class extends base {
    constructor(url: string, protocols?: string | string[]) {
      super(url, protocols);
      sockets.push(this);
    }
  };
}

/** Everything one transport's run saw; the JSON summary's `runs[transport]`. */
interface RunSummary {
  transport: Transport;
  sessionId: string;
  states: ClientState[];
  sockets: number;
  snapshot: { info: SubscribedInfo; values: Price[]; seq: number[] };
  ring: { info: SubscribedInfo; values: number[]; seq: number[]; gaps: GapDetail[] };
  private: { mode: Mode; values: number[] };
  queueSubscribed: { value: Job; meta: ItemMeta };
  compressed: boolean | "unsupported";
  call: Order;
  stream: number[];
  streamIter: number[];
  errors: Record<string, ErrorCode | number>;
  refusal: Refusal | null;
  batch: { id: string; final: FinalBatchState; updates: BatchState[] };
  consumer: { stats: ConsumerStats; attempts: number[]; service: number; settled: string[] };
  loop: { values: number[] };
  table: TablesSummary;
  stats: ClientStats;
  events: { error: ErrorDetail[]; goodbye: GoodbyeDetail[]; flow: FlowDetail[] };
  afterClose: { state: ClientState; call: ErrorCode | number; subscribe: ErrorCode | number };
}

async function run(url: string, transport: Transport): Promise<RunSummary> {
  const tag = transport === "websocket" ? "WS" : "LP"; // topics of their own per run
  const sockets: WebSocketLike[] = [];
  const options: ClientOptions = {
    transport,
    WebSocket: recordingWebSocket(sockets),
    callTimeoutMs: WAIT_MS,
    backoffMaxMs: 1000,
  };
  if (transport === "longpoll") options.fetch = globalThis.fetch;
  // both ways in: connect() and the constructor
  const client: RubrisClient =
    transport === "websocket" ? connect(url, options) : new RubrisClient(url, options);
  assert(client instanceof RubrisClient, "connect() gives a RubrisClient");

  const states: ClientState[] = [];
  const onState = (s: StateDetail): void => {
    states.push(s.state);
    assert(s.transport === transport, `state event on ${s.transport}`);
  };
  const errorEvents: ErrorDetail[] = [];
  const onError = (e: RubrisClientEvents["error"]): void => {
    errorEvents.push(e);
  };
  const gaps: GapDetail[] = [];
  const goodbyes: GoodbyeDetail[] = [];
  const flows: FlowDetail[] = [];
  client
    .on("state", onState)
    .on("error", onError)
    .on("gap", (g) => gaps.push(g))
    .on("goodbye", (g) => goodbyes.push(g))
    .on("flow", (f) => flows.push(f));
  await until(() => client.state === "open", `${transport}: the client opens`);
  assert(client.transport === transport, `transport ${client.transport}`);
  assert(typeof client.sessionId === "string" && client.sessionId.length > 0, "a session id");
  assert(client.resumed === false, "a new session");
  if (transport === "websocket") {
    assert(sockets.length >= 1, "the client opened a socket with the WebSocket option");
    assert(
      sockets.every((s) => s.binaryType === "arraybuffer"),
      "binary frames as ArrayBuffer",
    );
    // options from a config that may lack some: undefined means the default ("auto" here)
    const config: { transport?: "auto" | Transport; backoffMaxMs?: number } = {};
    const configured = connect(url, {
      transport: config.transport,
      backoffMaxMs: config.backoffMaxMs,
      WebSocket: options.WebSocket,
    });
    await until(() => configured.state === "open", "a client with options given as undefined");
    assert(configured.transport === "websocket", "transport undefined: auto, WebSocket first");
    configured.close();
  }

  // ----- a snapshot topic: the current value at once, then the newer one
  const prices: Price[] = [];
  const priceSeq: number[] = [];
  const subscribed: SubscribedInfo[] = [];
  const snapOpts: SubscribeOptions = { onSubscribed: (info) => subscribed.push(info) };
  const snap: Subscription = client.subscribe<Price>(
    `prices.${tag}`,
    (price, meta: MessageMeta) => {
      prices.push(price);
      assert("seq" in meta, "a PUSH's meta");
      const push: PushMeta = meta;
      assert(push.name === `prices.${tag}` && !push.compressed, "meta of a snapshot");
      priceSeq.push(push.seq);
    },
    snapOpts,
  );
  assert(snap instanceof Subscription && snap.name === `prices.${tag}`, "a Subscription");
  const snapInfo = await within(snap.ready, "SUBSCRIBED of the snapshot topic");
  const snapMode: Mode = snapInfo.mode;
  const snapCodec: Codec = snapInfo.codec;
  assert(
    snapMode === Mode.SNAPSHOT && snapCodec === Codec.JSON,
    `snapshot info ${JSON.stringify(snapInfo)}`,
  );
  assert(snap.info !== null && snap.info.epoch === snapInfo.epoch, "info kept on the subscription");
  await until(() => prices.length >= 1, "the current price");
  await client.call<number>("set_price", { symbol: tag, px: 101.5 });
  await until(() => prices.some((p) => p.px === 101.5), "the new price");
  assert(subscribed.length === 1 && subscribed[0]?.name === `prices.${tag}`, "onSubscribed once");
  snap.unsubscribe();
  assert(snap.closed, "closed after unsubscribe()");

  // ----- a ring topic: the late joiner's last 2 of 3, then the new ones, in order
  await client.call<number>("trade", { symbol: tag, count: 3 });
  const trades: number[] = [];
  const tradeSeq: number[] = [];
  const ringGaps: { from: number; count: number }[] = [];
  const ring = client.subscribe<Trade>(
    `trades.${tag}`,
    (trade, meta) => {
      trades.push(trade.n);
      if ("seq" in meta) tradeSeq.push(meta.seq);
    },
    { last: 2, onGap: (gap) => ringGaps.push(gap) },
  );
  const ringInfo = await within(ring.ready, "SUBSCRIBED of the ring topic");
  assert(
    ringInfo.mode === Mode.RING && ringInfo.head === 3,
    `ring info ${JSON.stringify(ringInfo)}`,
  );
  const last = await client.call<number>("trade", { symbol: tag, count: 2 });
  assert(last === 5, `5 trades published, not ${last}`);
  await until(() => trades.length >= 4, "the ring's replay and new messages");
  assert(same(trades, [2, 3, 4, 5]), `ring values ${JSON.stringify(trades)}`);
  assert(same(tradeSeq, [2, 3, 4, 5]), `ring seqs ${JSON.stringify(tradeSeq)}`);
  assert(ringGaps.length === 0 && gaps.length === 0, "no gap");
  ring.unsubscribe();

  // ----- a private topic: the session's own, ACKed as the app sees it
  const fills: number[] = [];
  const inbox = client.subscribe<Fill>("fills", (fill) => fills.push(fill.i));
  const inboxInfo = await within(inbox.ready, "SUBSCRIBED of the private topic");
  assert(inboxInfo.mode === Mode.PRIVATE, "a private topic");
  assert((await client.call<number>("fill", 3)) === 3, "3 fills sent");
  await until(() => fills.length >= 3, "the private messages");
  assert(same(fills, [0, 1, 2]), `fills ${JSON.stringify(fills)}`);

  // ----- a queue topic subscribed (not consumed): items with their tag and attempt
  const queued: { value: Job; meta: ItemMeta }[] = [];
  const jobsSub = client.subscribe<Job>(`jobs.${tag}sub`, (value, meta) => {
    assert("tag" in meta, "an item's meta");
    queued.push({ value, meta });
  });
  assert((await within(jobsSub.ready, "SUBSCRIBED of a queue topic")).mode === Mode.QUEUE, "queue");
  await client.call("enqueue", { kind: `${tag}sub`, count: 1 });
  await until(() => queued.length === 1, "an item of the subscribed queue topic");
  const queuedItem = queued[0]!;
  assert(queuedItem.meta.attempt === 1 && queuedItem.value.n === 0, "the first delivery of item 0");
  jobsSub.unsubscribe();

  // ----- a compressed value, where this Node can inflate raw DEFLATE (Node 22, recent 20; not 18)
  let compressed: boolean | "unsupported" = "unsupported";
  if (canInflateRaw()) {
    const bigs: { value: Big; compressed: boolean }[] = [];
    const bigSub = client.subscribe<Big>("big", (value, meta) => {
      bigs.push({ value, compressed: meta.compressed });
    });
    await until(() => bigs.length === 1, "the compressed value");
    const got = bigs[0]!;
    assert(got.value.text.startsWith("rubris ") && got.value.text.length === 2100, "inflated");
    compressed = got.compressed;
    bigSub.unsubscribe();
  }

  // ----- RPC: a call, a stream, a stream as an async iterable
  const order: Order = { symbol: tag, side: "buy", qty: 10 };
  const echoed = await client.call<Order>("echo", order);
  assert(same(echoed, order), `echo ${JSON.stringify(echoed)}`);
  const streamed: number[] = [];
  const streamDone: Promise<void> = client.stream<number>("count", 3, (i) => streamed.push(i));
  await within(streamDone, "the stream's end");
  assert(same(streamed, [0, 1, 2]), `stream ${JSON.stringify(streamed)}`);
  const iterated: number[] = [];
  for await (const i of client.streamIter<number>("count", 4)) iterated.push(i);
  assert(same(iterated, [0, 1, 2, 3]), `streamIter ${JSON.stringify(iterated)}`);

  // ----- errors: each a RubrisError with its code
  const errors: Record<string, ErrorCode | number> = {};
  const failed = await refusal(
    client.call("fail", { why: "testing" }),
    "a call the server rejects",
  );
  // the message names the method once; the server's own text is `reason`
  assert(failed.message === "call 'fail' failed: no such thing", `message ${failed.message}`);
  assert(failed.reason === "no such thing" && failed.method === "fail", `reason ${failed.reason}`);
  errors.call = codeOf(failed);
  const unknown = await refusal(client.call("no_such_method"), "an unknown method");
  const unknownText = "call failed: unknown method 'no_such_method'";
  assert(unknown.message === unknownText, `message ${unknown.message}`);
  assert(unknown.method === "no_such_method", `method ${unknown.method}`);
  errors.unknownMethod = codeOf(unknown);
  const refused: Refusal[] = [];
  const nope = client.subscribe<Price>("prices.NOPE", () => undefined, {
    onError: (err) => refused.push(err),
  });
  const rejected = await refusal(nope.ready, "a refused subscription");
  const rejectedText = "subscribe 'prices.NOPE' refused: unknown symbol";
  assert(rejected.message === rejectedText, `message ${rejected.message}`);
  assert(rejected.topic === "prices.NOPE" && rejected.reason === "unknown symbol", "topic");
  errors.subscribe = codeOf(rejected);
  await until(() => refused.length === 1, "onError of the refused subscription");
  assert(nope.closed, "a refused subscription is closed");
  const streamFailure = await refusal(
    (async () => {
      for await (const i of client.streamIter<number>("count", -1)) void i;
    })(),
    "a stream the server fails",
  );
  const streamText = "call 'count' failed: cannot count to a negative number";
  assert(streamFailure.message === streamText, streamFailure.message);
  errors.streamIter = codeOf(streamFailure);
  errors.unknownBatch = codeOf(await refusal(client.watchBatch("nosuchbatch"), "unknown batch"));
  const openBatch = await client.call<string>("open_batch", {
    kind: `${tag}open`,
    count: 0,
    seal: false,
  });
  const timeoutOpts: WatchBatchOptions = { timeout: 50 };
  const timedOut = await refusal(client.watchBatch(openBatch, undefined, timeoutOpts), "timeout");
  const timeoutCode: ClientErrorCode = ErrorCode.TIMEOUT;
  assert(timedOut.code === timeoutCode, `timeout code ${timedOut.code}`);
  errors.watchBatchTimeout = codeOf(timedOut);
  const notQueue: Refusal[] = [];
  const wrong = client.consume<Job>(`prices.${tag}`, () => undefined, {
    onError: (e) => notQueue.push(e),
  });
  errors.consumeNotAQueue = codeOf(await refusal(wrong.ready, "consume() of a snapshot topic"));
  await until(() => notQueue.length === 1, "onError of consume() of a snapshot topic");
  const made = new RubrisError("made here", ErrorCode.UNSUBSCRIBED);
  assert(made.code === "unsubscribed" && made.message === "made here", "new RubrisError()");

  // ----- a work queue consumed by a handler, its items in a batch watched to completion
  const batch = await client.call<string>("open_batch", { kind: tag, count: 4 });
  const updates: BatchState[] = [];
  const watched: Promise<FinalBatchState> = client.watchBatch(batch, (s) => updates.push(s), {
    timeout: WAIT_MS,
  });
  const attempts: number[] = [];
  const settled: string[] = [];
  const ended: Ending[] = [];
  const consumeOpts: ConsumeOptions = {
    prefetch: 2,
    codelTarget: null,
    maxBuffer: 100,
    onSubscribed: (info) => assert(info.mode === Mode.QUEUE, "consume() of a queue topic"),
    onUnsubscribed: (why) => ended.push(why),
  };
  const consumer: Consumer<Job> = client.consume<Job>(
    `jobs.${tag}`,
    async (item: QueueItem<Job>) => {
      assert(item instanceof QueueItem && item.topic === `jobs.${tag}`, "a QueueItem");
      attempts.push(item.attempt);
      if (item.value.n === 0 && item.attempt === 1) {
        assert(item.nack(true), "the first NACK is sent"); // comes back: attempt 2
        assert(!item.ack(), "only the first settlement counts");
      } else if (item.value.n === 1) {
        assert(item.ack(), "an explicit ACK");
      } else {
        await sleep(1); // ACKed when the handler's promise resolves
      }
      settled.push(`${item.value.n}:${item.settled ?? "open"}`);
    },
    consumeOpts,
  );
  assert(consumer instanceof Consumer && consumer instanceof Subscription, "a Consumer");
  await within(consumer.ready, "SUBSCRIBED of the consumer");
  const final = await within(watched, "the batch's final state");
  assert(final.state === "complete" && final.completed && final.done === 4, JSON.stringify(final));
  assert(updates.length >= 1 && same(updates.at(-1), final), "onUpdate got the final state");
  await until(() => consumer.stats.acked === 4, "4 ACKs");
  const consumerStats: ConsumerStats = consumer.stats;
  assert(consumerStats.nacked === 1 && consumerStats.taken === 5, JSON.stringify(consumerStats));
  assert(attempts.filter((a) => a === 2).length === 1, `attempts ${JSON.stringify(attempts)}`);
  await within(consumer.close(), "the consumer's close()");
  assert(consumer.closed && ended.length === 0, "closed by the app, not the server");

  // ----- a work queue consumed by a loop: ACKed when the loop asks for the next one
  await client.call("enqueue", { kind: `${tag}loop`, count: 2 });
  const looped: number[] = [];
  const loop = client.consume<Job>(`jobs.${tag}loop`, { prefetch: 1 });
  for await (const item of loop) {
    looped.push(item.value.n);
    if (looped.length === 2) {
      item.ack(); // done before the break: an unsettled item would go back to the queue
      break;
    }
  }
  assert(same(looped, [0, 1]), `loop ${JSON.stringify(looped)}`);
  assert(loop.closed && loop.stats.acked === 2, `loop stats ${JSON.stringify(loop.stats)}`);

  // ----- a keyed topic's table, presence and its count
  const table = await tables(client, tag);

  // ----- the codec, for the project's tests
  const ping = _internal.encode.ping(7);
  const [parsed] = _internal.decodeClientFrame(ping);
  const pingKind: Kind = Kind.PING;
  assert(parsed?.kind === pingKind && parsed.token === 7, "PING through the codec");
  assert(_internal.resolveUrls(url).ws.endsWith("/rubris/ws"), "the WebSocket endpoint");
  assert(_internal.nakLevel(1024, 2048) === 50, "NAK level");

  // ----- stats, off, close
  await sleep(20); // the PONG of the WELCOME's PING came long ago; ACKs written
  const stats: ClientStats = client.stats;
  assert(stats.messages > 0 && stats.frames > 0 && stats.bytesIn > 0, JSON.stringify(stats));
  assert(typeof stats.rttMs === "number" && stats.inbound === 0, JSON.stringify(stats));
  const laterStates: ClientState[] = [];
  const later = (s: StateDetail): void => {
    laterStates.push(s.state);
  };
  client.on("state", later).off("state", later).off("error", onError);
  client.close();
  const closedState: ClientState = client.state;
  assert(
    closedState === "closed" && states.at(-1) === "closed",
    `states ${JSON.stringify(states)}`,
  );
  assert(laterStates.length === 0, "a listener removed with off() hears nothing");
  const afterClose = {
    state: closedState,
    call: codeOf(await refusal(client.call("echo", 1), "a call after close()")),
    subscribe: codeOf(
      await refusal(client.subscribe("fills", () => undefined).ready, "subscribe after close()"),
    ),
  };
  assert(
    afterClose.call === ErrorCode.CLOSED && afterClose.subscribe === ErrorCode.CLOSED,
    "closed",
  );

  return {
    transport,
    sessionId: client.sessionId ?? "",
    states,
    sockets: sockets.length,
    snapshot: { info: snapInfo, values: prices, seq: priceSeq },
    ring: { info: ringInfo, values: trades, seq: tradeSeq, gaps },
    private: { mode: inboxInfo.mode, values: fills },
    queueSubscribed: queuedItem,
    compressed,
    call: echoed,
    stream: streamed,
    streamIter: iterated,
    errors,
    refusal: refused[0] ?? null,
    batch: { id: batch, final, updates },
    consumer: { stats: consumerStats, attempts, service: consumer.service, settled },
    loop: { values: looped },
    table,
    stats,
    events: { error: errorEvents, goodbye: goodbyes, flow: flows },
    afterClose,
  };
}

/** What the keyed topic and presence part of a run saw; `runs[transport].table`. */
interface TablesSummary {
  info: SubscribedInfo;
  equal: boolean[];
  ops: Record<string, number>;
  seq: number;
  keys: string[];
  rated: number;
  presence: { joined: number; left: number; count: number; member: PresenceMember | null };
  counts: PresenceCountDetail[];
}

/**
 * subscribeTable(): the first table, then sets, a patch and a delete made by the server; after
 * each, the Map equals the server's table. presence() and presenceCount() of a topic this client
 * subscribes to (it is the one member, anonymous).
 */
async function tables(client: RubrisClient, tag: string): Promise<TablesSummary> {
  const name = `book.${tag}`;
  const changes: TableChange<Level>[] = [];
  const tableOpts: TableOptions<Level> = {
    onChange: (change) => {
      changes.push(change);
      if (change.op === "set" || change.op === "patch") {
        const value: Level = change.value; // the entry's new whole value
        assert(book.entries.get(change.key) === value, "the table holds a change when told");
      } else if (change.op === "reset" || change.op === "synced") {
        const none: null = change.value;
        assert(none === null && change.key === "", "reset and synced name no key");
      }
    },
    maxRate: 1000,
  };
  const book: TableSubscription<Level> = client.subscribeTable<Level>(name, tableOpts);
  assert(book instanceof TableSubscription && book instanceof Subscription, "a TableSubscription");
  await within(book.whenSynced(), "the first table");
  const info = await within(book.ready, "SUBSCRIBED of the keyed topic");
  assert(info.mode === Mode.KEYED && book.synced, `table info ${JSON.stringify(info)}`);

  const equal: boolean[] = [];
  const change = async (args: Record<string, unknown>): Promise<void> => {
    const server = await client.call<ServerTable>("table", { name, ...args });
    await until(() => book.seq >= server.seq, `the table at seq ${server.seq}`);
    const entries: ReadonlyMap<string, Level> = book.entries;
    equal.push(canonical(Object.fromEntries(entries)) === canonical(server.entries));
  };
  await change({ op: "read" });
  await change({ op: "set", key: "101", value: { px: 101, qty: 2, note: "n".repeat(100) } });
  await change({ op: "patch", key: "101", value: { qty: 3, flags: { hot: true } } });
  await change({ op: "patch", key: "100", value: { note: null } });
  await change({ op: "delete", key: "100" });
  await change({ op: "set", key: "102", value: { px: 102, qty: 1 } });
  const patched = book.entries.get("101");
  assert(patched?.qty === 3 && patched.flags?.hot === true && patched.note?.length === 100, "patch");
  const ops: Record<string, number> = {};
  for (const c of changes) ops[c.op] = (ops[c.op] ?? 0) + 1;
  const merged = _internal.mergePatch({ a: 1, b: { c: 2, d: 3 } }, { a: null, b: { c: null } });
  assert(same(merged, { b: { d: 3 } }), `mergePatch ${JSON.stringify(merged)}`);
  const patchOp: EntryOp = EntryOp.PATCH;
  assert(patchOp === 2 && Kind.ENTRY === 0x0e, "EntryOp and Kind.ENTRY");
  book.unsubscribe();
  assert(book.closed && book.entries.size === 2, "an ended table keeps what it held");

  // maxRate on a snapshot topic: SUBSCRIBE params {"max_rate": r}
  const rated: Price[] = [];
  const ratedSub = client.subscribe<Price>(`prices.${tag}rated`, (p) => rated.push(p), {
    maxRate: 20,
  });
  await until(() => rated.length === 1, "a rated snapshot's first value");
  ratedSub.unsubscribe();

  // presence: this client subscribes to the room; it is its only member
  const room = client.subscribe(`room.${tag}`, () => undefined);
  await within(room.ready, "SUBSCRIBED of the room");
  let joined = 0;
  let left = 0;
  const presenceOpts: PresenceOptions<null> = {
    onJoin: (_member, value) => {
      joined += value.sessions;
    },
    onLeave: () => {
      left++;
    },
  };
  const who: Presence<null> = client.presence<null>(`room.${tag}`, presenceOpts);
  assert(who instanceof Presence && who.watched === `room.${tag}`, "a Presence");
  await within(who.whenSynced(), "the members");
  const member: PresenceMember | null = [...who.members.values()][0] ?? null;
  const counts: PresenceCountDetail[] = [];
  const countOpts: PresenceCountOptions = { maxRate: 50 };
  const count: PresenceCount = client.presenceCount(
    `room.${tag}`,
    (c) => counts.push(c),
    countOpts,
  );
  assert(count instanceof PresenceCount && count instanceof Subscription, "a PresenceCount");
  await within(count.whenSynced(), "the first count");
  const presence = { joined, left: 0, count: who.count, member };
  room.unsubscribe(); // the member leaves
  await until(() => left === 1 && count.members === 0, "the leave");
  presence.left = left;
  who.unsubscribe();
  count.unsubscribe();
  return {
    info,
    equal,
    ops,
    seq: book.seq,
    keys: [...book.entries.keys()].sort(),
    rated: rated.length,
    presence,
    counts,
  };
}

function canInflateRaw(): boolean {
  try {
    new DecompressionStream("deflate-raw");
    return true;
  } catch {
    return false;
  }
}

async function main(): Promise<void> {
  const [url, ...asked] = process.argv.slice(2);
  if (!url)
    throw new CheckFailed("usage: node dist/check.js <url of the rubris mount> [transport...]");
  const transports: Transport[] = [];
  for (const t of asked.length ? asked : ["websocket", "longpoll"]) {
    assert(t === "websocket" || t === "longpoll", `unknown transport ${t}`);
    transports.push(t);
  }
  const runs: Partial<Record<Transport, RunSummary>> = {};
  for (const transport of transports) runs[transport] = await run(url, transport);
  const summary = {
    ok: true,
    node: process.version,
    webSocket: typeof WebSocket === "function" ? "global" : "ws",
    runs,
  };
  process.stdout.write(`${JSON.stringify(summary)}\n`);
}

const watchdog = setTimeout(() => {
  process.stdout.write(
    `${JSON.stringify({ ok: false, error: `no result within ${DEADLINE_MS} ms` })}\n`,
  );
  process.exit(2);
}, DEADLINE_MS);

main().then(
  () => {
    clearTimeout(watchdog);
    // Every client is closed: nothing should keep Node alive. If something does, do not hang.
    setTimeout(() => process.exit(0), 2000).unref();
  },
  (err: unknown) => {
    clearTimeout(watchdog);
    const error = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
    const stack = err instanceof Error ? err.stack : undefined;
    process.stdout.write(`${JSON.stringify({ ok: false, error, stack })}\n`);
    process.exit(1);
  },
);

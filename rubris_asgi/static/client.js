// rubris browser client: ES modules, no build step, no dependencies.
//
// Served by the plugin at `{mount}/client.js`, and the modules it imports at `{mount}/client/*.js`:
//
//     import { connect } from "/rubris/client.js";
//     const client = connect("/rubris");
//     client.subscribe("prices.AAPL", (price) => render(price));
//     const result = await client.call("place_order", { symbol: "AAPL", side: "buy", qty: 10 });
//     client.consume("jobs.resize", async (item) => resize(item.value), { prefetch: 8 });
//     const book = client.subscribeTable("book.AAPL", { onChange: (c) => draw(c.key, c.value) });
//
// The wire contract is the project's protocol.md ("rubris wire protocol, version 1"); section
// numbers quoted in the modules (§n) refer to it. This file is only the public entry: it
// re-exports the public names. The code lives in client/, one concern per module, listed here
// from the bottom up: each module imports only modules listed above it.
//
//   1. the codec (pure functions) and small helpers:
//        client/codec.js          varints, strings, Writer/Reader, frames of `kind len body`
//                                 messages, parsers and encoders; Kind, Mode, Codec, EntryOp,
//                                 ErrorCode
//        client/payloads.js       payload bytes to values and back (JSON, text, bytes), raw
//                                 DEFLATE both ways (DecompressionStream), RFC 7386 merge patch
//        client/util.js           clock, sleep, yieldToEventLoop, safeCall, RateMeter,
//                                 backoffDelay, resolveUrls
//        client/codel.js          CoDel: the control law (RFC 8289) that decides which items of
//                                 a consumer's local buffer to give back
//   2. the public value classes:
//        client/values.js         Subscription, RubrisError
//        client/consumer.js       Consumer and QueueItem: a queue consumer's bounded local buffer
//                                 of ITEMs, REVOKE, CoDel giving back the newest item, one item at
//                                 a time to the handler, its ACKs and NACKs, reset on reconnect
//   3. two transports with one small interface (described in websocket.js):
//        client/websocket.js      WebSocketConnection
//        client/longpoll.js       LongPollConnection (§7) and what an HTTP status means
//   4. RubrisClient: one class, its methods grouped by concern:
//        client/outbound.js       the write path: batching into frames, what waits while
//                                 disconnected
//        client/flow.js           the inbound queue delivered in slices; NAK levels (§8)
//        client/calls.js          call, stream, streamIter, call timeouts, RESULT/STREAM
//        client/subscriptions.js  subscribe/unsubscribe, WireSubscription, SUBSCRIBED, REJECTED,
//                                 UNSUBSCRIBED, GAP, PUSH to listeners, ACKs of private topics
//        client/tables.js         subscribeTable(), presence(), presenceCount(): keyed topics
//                                 (§5b), ENTRY to the table and its change events;
//                                 TableSubscription, Presence, PresenceCount
//        client/queues.js         consume(), a queue topic's SUBSCRIBED, ITEM and REVOKE to its
//                                 Consumer, the ACKs of a task in one message, reset on reconnect
//        client/session.js        connect, WELCOME, new or resumed session, drops, reconnect
//                                 with backoff, fall-back to long-poll and back to WebSocket,
//                                 heartbeats and PING, frame dispatch, page hooks, shutdown
//        client/rubris-client.js  the class itself: constructor (all of the client's state),
//                                 on/off, stats, close, events; installs the groups above;
//                                 connect()
//
// How the class is split: each concern module exports a plain object of methods
// (`outboundMethods`, `flowMethods`, `callMethods`, `subscriptionMethods`, `tableMethods`,
// `queueMethods`, `batchMethods`, `sessionMethods`), and
// rubris-client.js copies them onto RubrisClient.prototype when it loads (`installMethods`:
// non-enumerable like class methods; a name defined twice throws). Every method still runs with
// `this` the client and shares its fields, as when it was one class body; the concern modules
// call each other only through `this` and never import one another or rubris-client.js.
//
// Everything the client keeps is bounded: frames waiting for a connection (`maxPending`),
// the inbound queue (snapshot topics conflate in it, the server slows down on NAK, private topics
// are ACKed only once the app has seen them so the server's queue capacity bounds them), the
// buffer of a `streamIter` (its producer waits for the consumer), a queue consumer's local
// buffer (the server's prefetch bounds it; `maxBuffer` caps it: beyond it items are NACKed), and
// a keyed topic's table (the server's `max_keys` bounds it).

import {
  ProtocolError,
  Reader,
  Writer,
  decodeClientFrame,
  decodeFrame,
  encode,
  joinFrames,
  message,
  parseClientMessage,
  parseServerMessage,
  splitFrame,
} from "./client/codec.js";
import { CoDel } from "./client/codel.js";
import { nakLevel } from "./client/flow.js";
import { decodePayload, deflateRaw, inflateRaw, mergePatch } from "./client/payloads.js";
import { backoffDelay, resolveUrls } from "./client/util.js";
// Every other module is named here too, so that a browser fetches them all in one round trip
// after this file instead of discovering them one import level at a time.
import "./client/batches.js";
import "./client/calls.js";
import "./client/longpoll.js";
import "./client/outbound.js";
import "./client/queues.js";
import "./client/session.js";
import "./client/subscriptions.js";
import "./client/tables.js";
import "./client/websocket.js";

export { Codec, EntryOp, ErrorCode, Kind, Mode } from "./client/codec.js";
export { Consumer, QueueItem } from "./client/consumer.js";
export { RubrisClient, connect } from "./client/rubris-client.js";
export { Presence, PresenceCount, TableSubscription } from "./client/tables.js";
export { RubrisError, Subscription } from "./client/values.js";

/** Codec and helpers, exported for tests; not a stable API. */
export const _internal = Object.freeze({
  Writer,
  Reader,
  ProtocolError,
  splitFrame,
  decodeFrame,
  parseServerMessage,
  decodeClientFrame,
  parseClientMessage,
  encode,
  message,
  joinFrames,
  inflateRaw,
  deflateRaw,
  decodePayload,
  mergePatch,
  nakLevel,
  CoDel,
  backoffDelay,
  resolveUrls,
});

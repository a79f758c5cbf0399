// The wire codec (protocol.md §1–§4): varints, strings, Writer/Reader, frames of `kind len body`
// messages, the parsers of server and client messages and the encoders of client messages, and
// the protocol's numbers (Kind, Mode, Codec, EntryOp, ErrorCode). Pure functions without I/O:
// the bottom layer, which imports nothing; tests and fake servers read frames with the code that
// writes them.

const PROTOCOL_VERSION = 1;
export const SUBPROTOCOL = "rubris.v1";

/** Message kinds (§3, §4). The low 7 bits of the kind byte; 0x80 is the COMPRESSED flag. */
export const Kind = Object.freeze({
  WELCOME: 0x01,
  PUSH: 0x02,
  RESULT: 0x03,
  STREAM: 0x04,
  SUBSCRIBED: 0x05,
  REJECTED: 0x06,
  UNSUBSCRIBED: 0x07,
  GAP: 0x08,
  PONG: 0x09,
  GOODBYE: 0x0a,
  FLOW: 0x0b,
  ITEM: 0x0c,
  REVOKE: 0x0d,
  ENTRY: 0x0e,
  HELLO: 0x21,
  SUBSCRIBE: 0x22,
  UNSUBSCRIBE: 0x23,
  CALL: 0x24,
  ACK: 0x25,
  NACK: 0x26,
  NAK: 0x27,
  PING: 0x28,
  PUBLISH: 0x29,
});

const COMPRESSED = 0x80;

/** Topic modes announced in SUBSCRIBED (§3). */
export const Mode = Object.freeze({ SNAPSHOT: 1, RING: 2, PRIVATE: 3, QUEUE: 4, KEYED: 5 });

/**
 * ENTRY's `op` (§5b): SET (the whole value), PATCH (an RFC 7386 merge patch of the value held),
 * DELETE, RESET (drop the table: a full state follows) and SYNCED (the table is whole as of seq).
 */
export const EntryOp = Object.freeze({ SET: 1, PATCH: 2, DELETE: 3, RESET: 4, SYNCED: 5 });

/** Payload codecs announced in SUBSCRIBED (§2). */
export const Codec = Object.freeze({ JSON: 0, BYTES: 1, TEXT: 2 });

/**
 * Error codes: the numbers are the protocol's (§9); the strings are this client's own
 * conditions, which never come from a server.
 */
export const ErrorCode = Object.freeze({
  PROTOCOL: 1,
  UNSUPPORTED_VERSION: 2,
  UNKNOWN: 3,
  NOT_AUTHORISED: 4,
  TOO_LARGE: 5,
  TOO_MANY: 6,
  SLOW_CONSUMER: 7,
  SESSION_EXPIRED: 8,
  SHUTTING_DOWN: 9,
  REJECTED: 10,
  RESTARTED: 11,
  CLOSED: "closed",
  TIMEOUT: "timeout",
  UNSUBSCRIBED: "unsubscribed",
});

const SERVER_KINDS = new Set([
  Kind.WELCOME, Kind.PUSH, Kind.RESULT, Kind.STREAM, Kind.SUBSCRIBED, Kind.REJECTED,
  Kind.UNSUBSCRIBED, Kind.GAP, Kind.PONG, Kind.GOODBYE, Kind.FLOW, Kind.ITEM, Kind.REVOKE,
  Kind.ENTRY,
]);
const SERVER_COMPRESSIBLE = new Set([Kind.PUSH, Kind.RESULT, Kind.STREAM, Kind.ITEM, Kind.ENTRY]);
const CLIENT_KINDS = new Set([
  Kind.HELLO, Kind.SUBSCRIBE, Kind.UNSUBSCRIBE, Kind.CALL, Kind.ACK, Kind.NACK, Kind.NAK,
  Kind.PING, Kind.PUBLISH,
]);
const CLIENT_COMPRESSIBLE = new Set([Kind.SUBSCRIBE, Kind.CALL, Kind.PUBLISH]);

export const EMPTY = new Uint8Array(0);
export const utf8Encoder = new TextEncoder();
// fatal: bad UTF-8 in a str field is a protocol error (§2), not something to paper over.
export const utf8Decoder = new TextDecoder("utf-8", { fatal: true });

/** Raised by the codec on malformed input; the client turns it into a reconnect. */
export class ProtocolError extends Error {
  constructor(message) {
    super(message);
    this.name = "ProtocolError";
    this.code = 1;
  }
}

/**
 * Growable byte buffer for encoding. Varints use arithmetic, not bit operators: JS bit operators
 * work on 32 bits, and sequence numbers, epochs and call ids can be larger.
 */
export class Writer {
  constructor(size = 64) {
    this.buf = new Uint8Array(size);
    this.len = 0;
  }

  _room(n) {
    if (this.len + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.len + n) size *= 2;
    const grown = new Uint8Array(size);
    grown.set(this.buf.subarray(0, this.len));
    this.buf = grown;
  }

  u8(v) {
    this._room(1);
    this.buf[this.len++] = v & 0xff;
    return this;
  }

  uv(v) {
    if (!Number.isSafeInteger(v) || v < 0) {
      throw new RangeError(`uv must be an integer in 0..2^53-1, got ${v}`);
    }
    this._room(10);
    while (v >= 0x80) {
      this.buf[this.len++] = (v % 0x80) | 0x80;
      v = Math.floor(v / 0x80);
    }
    this.buf[this.len++] = v;
    return this;
  }

  bytes(b) {
    this._room(b.length);
    this.buf.set(b, this.len);
    this.len += b.length;
    return this;
  }

  str(s) {
    const b = utf8Encoder.encode(s);
    return this.uv(b.length).bytes(b);
  }

  view() {
    return this.buf.subarray(0, this.len);
  }

  finish() {
    return this.buf.slice(0, this.len);
  }
}

/** Cursor over one message body (or a whole frame); every read checks the bounds. */
export class Reader {
  constructor(bytes, start = 0, end = bytes.length) {
    this.buf = bytes;
    this.pos = start;
    this.end = end;
  }

  get remaining() {
    return this.end - this.pos;
  }

  u8() {
    if (this.pos >= this.end) throw new ProtocolError("truncated message: expected a byte");
    return this.buf[this.pos++];
  }

  /**
   * Unsigned LEB128 (§1). The protocol allows values below 2^64; this client works in JS numbers
   * and refuses anything above 2^53-1 rather than silently rounding it.
   */
  uv() {
    let value = 0;
    let scale = 1;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.end) throw new ProtocolError("truncated varint");
      const b = this.buf[this.pos++];
      value += (b & 0x7f) * scale;
      if (b < 0x80) {
        // A final zero group after the first byte adds nothing: an overlong encoding (§1).
        if (b === 0 && i > 0) throw new ProtocolError("overlong varint");
        if (value > Number.MAX_SAFE_INTEGER) {
          throw new ProtocolError("varint above 2^53-1: this client cannot represent it exactly");
        }
        return value;
      }
      scale *= 0x80;
    }
    throw new ProtocolError("varint longer than 10 bytes");
  }

  bytes(n) {
    if (n > this.end - this.pos) {
      throw new ProtocolError(`truncated: ${n} bytes announced, ${this.end - this.pos} left`);
    }
    const b = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return b;
  }

  str() {
    const b = this.bytes(this.uv());
    try {
      return utf8Decoder.decode(b);
    } catch {
      throw new ProtocolError("string is not valid UTF-8");
    }
  }

  rest() {
    const b = this.buf.subarray(this.pos, this.end);
    this.pos = this.end;
    return b;
  }
}

/**
 * Split a frame into its messages (§2) without interpreting bodies.
 * @param {Uint8Array} frame
 * @returns {{kind: number, compressed: boolean, body: Uint8Array}[]}
 */
export function splitFrame(frame) {
  if (frame.length === 0) throw new ProtocolError("empty frame");
  const r = new Reader(frame);
  const out = [];
  while (r.remaining > 0) {
    const kindByte = r.u8();
    const len = r.uv();
    if (len > r.remaining) {
      throw new ProtocolError(`message length ${len} runs past the end of the frame`);
    }
    out.push({ kind: kindByte & 0x7f, compressed: (kindByte & COMPRESSED) !== 0, body: r.bytes(len) });
  }
  return out;
}

/**
 * Parse one server→client message body (§3). Fixed fields come first; `payload` is the `rest`
 * field and stays a view into the frame (still deflated when `compressed`). Trailing bytes after
 * the last fixed field of a non-payload kind are ignored, so a later minor version can append
 * fields.
 */
export function parseServerMessage(kind, compressed, body) {
  if (compressed && !SERVER_COMPRESSIBLE.has(kind)) {
    throw new ProtocolError(`COMPRESSED flag on kind 0x${kind.toString(16)}, which is not compressible`);
  }
  const r = new Reader(body);
  switch (kind) {
    case Kind.WELCOME:
      return {
        kind, compressed,
        session: r.str(), resume: r.str(), heartbeatMs: r.uv(), maxFrame: r.uv(), resumed: r.u8(),
      };
    case Kind.PUSH:
      return { kind, compressed, topic: r.uv(), seq: r.uv(), payload: r.rest() };
    case Kind.RESULT:
      return { kind, compressed, call: r.uv(), status: r.u8(), payload: r.rest() };
    case Kind.STREAM:
      return { kind, compressed, call: r.uv(), last: r.u8(), payload: r.rest() };
    case Kind.SUBSCRIBED:
      return {
        kind, compressed,
        req: r.uv(), topic: r.uv(), mode: r.u8(), codec: r.u8(), epoch: r.uv(), head: r.uv(),
        recovered: r.u8(), name: r.str(),
      };
    case Kind.REJECTED:
      return { kind, compressed, req: r.uv(), code: r.uv(), reason: r.str() };
    case Kind.UNSUBSCRIBED:
      return { kind, compressed, topic: r.uv(), code: r.uv(), reason: r.str() };
    case Kind.GAP:
      return { kind, compressed, topic: r.uv(), from: r.uv(), count: r.uv() };
    case Kind.PONG:
      return { kind, compressed, token: r.uv() };
    case Kind.GOODBYE:
      return { kind, compressed, code: r.uv(), reason: r.str() };
    case Kind.FLOW:
      return { kind, compressed, fill: r.u8() };
    case Kind.ITEM:
      return { kind, compressed, topic: r.uv(), tag: r.uv(), attempt: r.uv(), payload: r.rest() };
    case Kind.REVOKE:
      return { kind, compressed, topic: r.uv(), tags: readTags(r) };
    case Kind.ENTRY:
      // An op this client does not know is parsed all the same; tables.js skips it (§2's rule
      // for unknown kinds, one level down).
      return {
        kind, compressed, topic: r.uv(), seq: r.uv(), op: r.u8(), key: r.str(), payload: r.rest(),
        bytes: 1 + uvLength(body.length) + body.length, // the message's bytes on the wire
      };
    default:
      throw new ProtocolError(`not a server message kind: 0x${kind.toString(16)}`);
  }
}

/** How many bytes the uv of `n` takes (§1: 7 bits a byte). */
function uvLength(n) {
  let bytes = 1;
  while (n >= 0x80) {
    n = Math.floor(n / 0x80);
    bytes++;
  }
  return bytes;
}

/** REVOKE's `n:uv tag:uv×n`; a count the body cannot hold is a truncated message. */
function readTags(r) {
  const n = r.uv();
  // Each tag takes at least a byte: checked before allocating anything for `n`.
  if (n > r.remaining) throw new ProtocolError(`REVOKE announces ${n} tags in ${r.remaining} bytes`);
  const tags = new Array(n);
  for (let i = 0; i < n; i++) tags[i] = r.uv();
  return tags;
}

/**
 * Decode a server frame into parsed messages. Unknown kinds are skipped (their length says how
 * far, §2); anything malformed throws ProtocolError.
 */
export function decodeFrame(frame) {
  const out = [];
  for (const m of splitFrame(frame)) {
    if (!SERVER_KINDS.has(m.kind)) continue;
    out.push(parseServerMessage(m.kind, m.compressed, m.body));
  }
  return out;
}

/**
 * Parse one client→server message body (§4). The client never needs it; it is here so tests and
 * fake servers read client frames with the same code that writes them.
 */
export function parseClientMessage(kind, compressed, body) {
  if (compressed && !CLIENT_COMPRESSIBLE.has(kind)) {
    throw new ProtocolError(`COMPRESSED flag on kind 0x${kind.toString(16)}, which is not compressible`);
  }
  const r = new Reader(body);
  switch (kind) {
    case Kind.HELLO:
      return { kind, version: r.uv(), resume: r.str() };
    case Kind.SUBSCRIBE:
      return {
        kind, compressed, req: r.uv(), name: r.str(), epoch: r.uv(), since: r.uv(), params: r.rest(),
      };
    case Kind.UNSUBSCRIBE:
      return { kind, topic: r.uv() };
    case Kind.CALL:
      return { kind, compressed, call: r.uv(), method: r.str(), payload: r.rest() };
    case Kind.ACK: {
      // Private topics carry `topic upto`, queue topics `topic n tag×n`: the wire alone cannot
      // tell them apart, so return the raw numbers and let the reader who knows the mode decide
      // (for a queue topic: numbers[0] is n, the tags follow).
      const topic = r.uv();
      const rest = [];
      while (r.remaining > 0) rest.push(r.uv());
      return { kind, topic, numbers: rest };
    }
    case Kind.NACK:
      return { kind, topic: r.uv(), tag: r.uv(), requeue: r.u8() };
    case Kind.NAK:
      return { kind, fill: r.u8() };
    case Kind.PING:
      return { kind, token: r.uv() };
    case Kind.PUBLISH:
      return { kind, compressed, req: r.uv(), name: r.str(), payload: r.rest() };
    default:
      throw new ProtocolError(`not a client message kind: 0x${kind.toString(16)}`);
  }
}

export function decodeClientFrame(frame) {
  const out = [];
  for (const m of splitFrame(frame)) {
    if (!CLIENT_KINDS.has(m.kind)) continue;
    out.push(parseClientMessage(m.kind, m.compressed, m.body));
  }
  return out;
}

/** `kind:u8 len:uv body` around a body built by `fill(writer)`. */
export function message(kind, fill) {
  const body = new Writer();
  fill(body);
  const out = new Writer(body.len + 11);
  return out.u8(kind).uv(body.len).bytes(body.view()).finish();
}

/** Concatenate encoded messages (or frames) into one frame. */
export function joinFrames(parts) {
  if (parts.length === 1) return parts[0];
  let size = 0;
  for (const p of parts) size += p.length;
  const out = new Uint8Array(size);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** Encoders of the client→server messages (§4); each returns one encoded message. */
export const encode = Object.freeze({
  hello: (resume = "") => message(Kind.HELLO, (w) => w.uv(PROTOCOL_VERSION).str(resume)),
  subscribe: (req, name, epoch, since, params = EMPTY, compressed = false) =>
    message(Kind.SUBSCRIBE | (compressed ? COMPRESSED : 0),
      (w) => w.uv(req).str(name).uv(epoch).uv(since).bytes(params)),
  unsubscribe: (topic) => message(Kind.UNSUBSCRIBE, (w) => w.uv(topic)),
  call: (call, method, payload = EMPTY) =>
    message(Kind.CALL, (w) => w.uv(call).str(method).bytes(payload)),
  ackPrivate: (topic, upto) => message(Kind.ACK, (w) => w.uv(topic).uv(upto)),
  /** ACK of queue deliveries (§4): `topic n tag×n`. */
  ackQueue: (topic, tags) => message(Kind.ACK, (w) => {
    w.uv(topic).uv(tags.length);
    for (const t of tags) w.uv(t);
  }),
  /** NACK of one queue delivery (§4); `requeue` false drops or dead-letters it. */
  nack: (topic, tag, requeue = true) =>
    message(Kind.NACK, (w) => w.uv(topic).uv(tag).u8(requeue ? 1 : 0)),
  nak: (fill) => message(Kind.NAK, (w) => w.u8(fill)),
  ping: (token) => message(Kind.PING, (w) => w.uv(token)),
});

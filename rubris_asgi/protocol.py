"""The rubris v1 wire codec: bytes in, dataclasses out, and back (sans-IO).

This module is the only place that knows the byte layout of the wire contract, protocol.md
(sections 1-4). It does no I/O, imports nothing async and never inflates or deflates: a
compressed payload is carried as it came, with ``compressed=True`` on its dataclass, and
compression.py does the rest.

Layout::

    frame   = message+                      one WebSocket message or long-poll body, never empty
    message = kind:u8  len:uv  body         body is exactly len bytes
    kind    = low 7 bits name the kind, bit 0x80 (COMPRESSED) marks a deflated payload

    uv   unsigned LEB128, low group first, at most 10 bytes, value < 2**64, minimal encoding only
    str  uv byte length, then UTF-8
    rest the remainder of the body (the payload field of PUSH, RESULT, STREAM, SUBSCRIBE, CALL,
         PUBLISH); only ``rest`` payloads may be compressed

Every kind has one frozen dataclass whose fields are the wire fields in wire order (GAP's
``from`` is called ``start``). :func:`encode` and :func:`encode_frame` build bytes from them;
:func:`push_message` is the fan-out fast path that builds a PUSH without a dataclass.
:func:`iter_messages` and :func:`decode_frame` parse a frame; every malformed input raises
:class:`~rubris_asgi.errors.ProtocolError` with code 1 and a message naming the kind, the field
and the frame offset, and nothing else ever escapes the decoder. Unknown kinds are skipped by
their length so that the protocol can grow; the decoder accepts both directions' kinds and
leaves it to the caller to refuse a kind sent the wrong way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TypeAlias, overload

from rubris_asgi.errors import ErrorCode, ProtocolError

__all__ = [
    "COMPRESSED",
    "COMPRESSIBLE",
    "SUBPROTOCOL",
    "VERSION",
    "Ack",
    "Call",
    "ClientMessage",
    "Codec",
    "Flow",
    "Gap",
    "Goodbye",
    "Hello",
    "Kind",
    "Message",
    "Mode",
    "Nack",
    "Nak",
    "Ping",
    "Pong",
    "Publish",
    "Push",
    "Rejected",
    "Result",
    "ServerMessage",
    "Stream",
    "Subscribe",
    "Subscribed",
    "Unsubscribe",
    "Unsubscribed",
    "Welcome",
    "decode_frame",
    "encode",
    "encode_frame",
    "encode_message",
    "encode_str",
    "encode_uv",
    "iter_messages",
    "push_message",
]

VERSION = 1
SUBPROTOCOL = "rubris.v1"
COMPRESSED = 0x80


class Kind(IntEnum):
    """Message kinds (protocol.md sections 3 and 4): 0x01-0x1F server, 0x21-0x3F client."""

    WELCOME = 0x01
    PUSH = 0x02
    RESULT = 0x03
    STREAM = 0x04
    SUBSCRIBED = 0x05
    REJECTED = 0x06
    UNSUBSCRIBED = 0x07
    GAP = 0x08
    PONG = 0x09
    GOODBYE = 0x0A
    FLOW = 0x0B
    HELLO = 0x21
    SUBSCRIBE = 0x22
    UNSUBSCRIBE = 0x23
    CALL = 0x24
    ACK = 0x25
    NACK = 0x26
    NAK = 0x27
    PING = 0x28
    PUBLISH = 0x29


class Mode(IntEnum):
    """A topic's delivery mode, as announced in SUBSCRIBED."""

    SNAPSHOT = 1
    RING = 2
    PRIVATE = 3
    QUEUE = 4


class Codec(IntEnum):
    """A topic's payload encoding, as announced in SUBSCRIBED."""

    JSON = 0
    BYTES = 1
    TEXT = 2


COMPRESSIBLE: frozenset[int] = frozenset(
    {Kind.PUSH, Kind.RESULT, Kind.STREAM, Kind.SUBSCRIBE, Kind.CALL, Kind.PUBLISH}
)

_UV_LIMIT = 1 << 64
_NAMES: dict[int, str] = {k.value: k.name for k in Kind}


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Welcome:
    session: str
    resume: str
    heartbeat_ms: int
    max_frame: int
    resumed: bool


@dataclass(frozen=True, slots=True)
class Push:
    topic: int
    seq: int
    payload: bytes
    compressed: bool = False


@dataclass(frozen=True, slots=True)
class Result:
    call: int
    status: int
    payload: bytes
    compressed: bool = False


@dataclass(frozen=True, slots=True)
class Stream:
    call: int
    last: bool
    payload: bytes
    compressed: bool = False


@dataclass(frozen=True, slots=True)
class Subscribed:
    req: int
    topic: int
    # Plain ints rather than Mode/Codec: a newer server may announce a value this code lacks.
    mode: int
    codec: int
    epoch: int
    head: int
    recovered: bool
    name: str


@dataclass(frozen=True, slots=True)
class Rejected:
    req: int
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Unsubscribed:
    topic: int
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Gap:
    topic: int
    start: int  # the wire's `from`, a Python keyword
    count: int


@dataclass(frozen=True, slots=True)
class Pong:
    token: int


@dataclass(frozen=True, slots=True)
class Goodbye:
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Flow:
    fill: int


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    resume: str


@dataclass(frozen=True, slots=True)
class Subscribe:
    req: int
    name: str
    epoch: int
    since: int
    params: bytes
    compressed: bool = False


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    topic: int


@dataclass(frozen=True, slots=True)
class Call:
    call: int
    method: str
    payload: bytes
    compressed: bool = False


class _AckItems:
    """``Ack.items(topic, seqs)`` builds a queue ACK; ``ack.items`` reads its seqs back.

    One name for both directions, as with ``Ack.private``/``ack.upto`` but without a second
    name to remember; a descriptor is the only way to give a class and its instances different
    meanings for the same attribute.
    """

    @overload
    def __get__(self, obj: None, owner: type[Ack]) -> Callable[[int, Iterable[int]], Ack]: ...

    @overload
    def __get__(self, obj: Ack, owner: type[Ack] | None = None) -> tuple[int, ...]: ...

    def __get__(
        self, obj: Ack | None, owner: type[Ack] | None = None
    ) -> Callable[[int, Iterable[int]], Ack] | tuple[int, ...]:
        if obj is None:
            return _ack_items
        values = obj.values
        if not values or values[0] != len(values) - 1:
            raise ProtocolError(
                f"ACK: expected a count followed by that many seqs, found {len(values)} values"
                + (f" starting with count {values[0]}" if values else ""),
                ErrorCode.PROTOCOL,
            )
        return values[1:]


@dataclass(frozen=True, slots=True)
class Ack:
    """ACK: ``topic`` then a run of uv ``values`` whose meaning depends on the topic's mode.

    The decoder cannot know the mode, so it keeps the raw values; the session, which does,
    reads them through :attr:`upto` (private topics: one cumulative seq) or :attr:`items`
    (queue topics: ``n`` then ``n`` seqs).
    """

    topic: int
    values: tuple[int, ...]

    items = _AckItems()

    @classmethod
    def private(cls, topic: int, upto: int) -> Ack:
        return cls(topic, (upto,))

    @property
    def upto(self) -> int:
        if not self.values:
            raise ProtocolError("ACK: expected upto after topic, found nothing", ErrorCode.PROTOCOL)
        return self.values[0]


def _ack_items(topic: int, seqs: Iterable[int]) -> Ack:
    seqs = tuple(seqs)
    return Ack(topic, (len(seqs), *seqs))


@dataclass(frozen=True, slots=True)
class Nack:
    topic: int
    seq: int
    requeue: bool


@dataclass(frozen=True, slots=True)
class Nak:
    fill: int


@dataclass(frozen=True, slots=True)
class Ping:
    token: int


@dataclass(frozen=True, slots=True)
class Publish:
    req: int
    name: str
    payload: bytes
    compressed: bool = False


ServerMessage: TypeAlias = (
    Welcome
    | Push
    | Result
    | Stream
    | Subscribed
    | Rejected
    | Unsubscribed
    | Gap
    | Pong
    | Goodbye
    | Flow
)
ClientMessage: TypeAlias = (
    Hello | Subscribe | Unsubscribe | Call | Ack | Nack | Nak | Ping | Publish
)
Message: TypeAlias = ServerMessage | ClientMessage


# --------------------------------------------------------------------------- encoding

# Cached one-byte encodings: most varints (small topics, flags, lengths of short bodies) and
# every u8 are one of these, and indexing a tuple beats building a bytes object.
_BYTE = tuple(bytes((i,)) for i in range(256))


def encode_uv(n: int) -> bytes:
    """Unsigned LEB128 of ``n``; ``ValueError`` unless ``0 <= n < 2**64``."""
    # Unrolled up to three bytes: topics, lengths and the seqs of a long-running topic.
    if n < 0x80:
        if n >= 0:
            return _BYTE[n]
        raise ValueError(f"uv out of range: expected 0 <= n < 2**64, got {n}")
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if n < 0x200000:
        return bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, n >> 14))
    if n >= _UV_LIMIT:
        raise ValueError(f"uv out of range: expected 0 <= n < 2**64, got {n}")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_str(s: str) -> bytes:
    """``uv`` byte length, then the UTF-8 bytes (``ValueError`` for lone surrogates)."""
    data = s.encode()
    return encode_uv(len(data)) + data


def _u8(n: int, what: str) -> bytes:
    if 0 <= n < 0x100:
        return _BYTE[n]
    raise ValueError(f"{what}: expected a u8 (0-255), got {n}")


def encode_message(kind: int, body: bytes, compressed: bool = False) -> bytes:
    """One message: ``kind`` (with COMPRESSED when asked), ``uv`` length, ``body``."""
    if not 0 <= kind < 0x80:
        raise ValueError(f"kind: expected 0x00-0x7F, got {kind:#x}")
    if compressed:
        if kind not in COMPRESSIBLE:
            raise ValueError(f"{_NAMES.get(kind, hex(kind))}: kind is not compressible")
        kind |= COMPRESSED
    return _BYTE[kind] + encode_uv(len(body)) + body


def push_message(topic: int, seq: int, payload: bytes, compressed: bool = False) -> bytes:
    """A whole PUSH message, built once per publish and shared by every subscriber."""
    head = encode_uv(topic) + encode_uv(seq)
    return (
        (b"\x82" if compressed else b"\x02") + encode_uv(len(head) + len(payload)) + head + payload
    )


def _enc_welcome(m: Welcome) -> bytes:
    body = (
        encode_str(m.session)
        + encode_str(m.resume)
        + encode_uv(m.heartbeat_ms)
        + encode_uv(m.max_frame)
        + (b"\x01" if m.resumed else b"\x00")
    )
    return encode_message(Kind.WELCOME, body)


def _enc_push(m: Push) -> bytes:
    return push_message(m.topic, m.seq, m.payload, m.compressed)


def _enc_result(m: Result) -> bytes:
    body = encode_uv(m.call) + _u8(m.status, "RESULT: status") + m.payload
    return encode_message(Kind.RESULT, body, m.compressed)


def _enc_stream(m: Stream) -> bytes:
    body = encode_uv(m.call) + (b"\x01" if m.last else b"\x00") + m.payload
    return encode_message(Kind.STREAM, body, m.compressed)


def _enc_subscribed(m: Subscribed) -> bytes:
    body = (
        encode_uv(m.req)
        + encode_uv(m.topic)
        + _u8(m.mode, "SUBSCRIBED: mode")
        + _u8(m.codec, "SUBSCRIBED: codec")
        + encode_uv(m.epoch)
        + encode_uv(m.head)
        + (b"\x01" if m.recovered else b"\x00")
        + encode_str(m.name)
    )
    return encode_message(Kind.SUBSCRIBED, body)


def _enc_rejected(m: Rejected) -> bytes:
    return encode_message(
        Kind.REJECTED, encode_uv(m.req) + encode_uv(m.code) + encode_str(m.reason)
    )


def _enc_unsubscribed(m: Unsubscribed) -> bytes:
    body = encode_uv(m.topic) + encode_uv(m.code) + encode_str(m.reason)
    return encode_message(Kind.UNSUBSCRIBED, body)


def _enc_gap(m: Gap) -> bytes:
    return encode_message(Kind.GAP, encode_uv(m.topic) + encode_uv(m.start) + encode_uv(m.count))


def _enc_pong(m: Pong) -> bytes:
    return encode_message(Kind.PONG, encode_uv(m.token))


def _enc_goodbye(m: Goodbye) -> bytes:
    return encode_message(Kind.GOODBYE, encode_uv(m.code) + encode_str(m.reason))


def _enc_flow(m: Flow) -> bytes:
    return encode_message(Kind.FLOW, _u8(m.fill, "FLOW: fill"))


def _enc_hello(m: Hello) -> bytes:
    return encode_message(Kind.HELLO, encode_uv(m.version) + encode_str(m.resume))


def _enc_subscribe(m: Subscribe) -> bytes:
    body = (
        encode_uv(m.req) + encode_str(m.name) + encode_uv(m.epoch) + encode_uv(m.since) + m.params
    )
    return encode_message(Kind.SUBSCRIBE, body, m.compressed)


def _enc_unsubscribe(m: Unsubscribe) -> bytes:
    return encode_message(Kind.UNSUBSCRIBE, encode_uv(m.topic))


def _enc_call(m: Call) -> bytes:
    body = encode_uv(m.call) + encode_str(m.method) + m.payload
    return encode_message(Kind.CALL, body, m.compressed)


def _enc_ack(m: Ack) -> bytes:
    body = encode_uv(m.topic) + b"".join([encode_uv(v) for v in m.values])
    return encode_message(Kind.ACK, body)


def _enc_nack(m: Nack) -> bytes:
    body = encode_uv(m.topic) + encode_uv(m.seq) + (b"\x01" if m.requeue else b"\x00")
    return encode_message(Kind.NACK, body)


def _enc_nak(m: Nak) -> bytes:
    return encode_message(Kind.NAK, _u8(m.fill, "NAK: fill"))


def _enc_ping(m: Ping) -> bytes:
    return encode_message(Kind.PING, encode_uv(m.token))


def _enc_publish(m: Publish) -> bytes:
    body = encode_uv(m.req) + encode_str(m.name) + m.payload
    return encode_message(Kind.PUBLISH, body, m.compressed)


_ENCODERS: dict[type[Any], Callable[[Any], bytes]] = {
    Welcome: _enc_welcome,
    Push: _enc_push,
    Result: _enc_result,
    Stream: _enc_stream,
    Subscribed: _enc_subscribed,
    Rejected: _enc_rejected,
    Unsubscribed: _enc_unsubscribed,
    Gap: _enc_gap,
    Pong: _enc_pong,
    Goodbye: _enc_goodbye,
    Flow: _enc_flow,
    Hello: _enc_hello,
    Subscribe: _enc_subscribe,
    Unsubscribe: _enc_unsubscribe,
    Call: _enc_call,
    Ack: _enc_ack,
    Nack: _enc_nack,
    Nak: _enc_nak,
    Ping: _enc_ping,
    Publish: _enc_publish,
}


def encode(msg: Message) -> bytes:
    """One whole message (kind, length, body); ``ValueError`` for out-of-range fields."""
    try:
        encoder = _ENCODERS[type(msg)]
    except KeyError:
        raise TypeError(f"not a protocol message: {type(msg).__name__}") from None
    return encoder(msg)


def encode_frame(msgs: Iterable[Message]) -> bytes:
    """The messages back to back; ``ValueError`` if there are none (a frame is never empty)."""
    frame = b"".join([encode(m) for m in msgs])
    if not frame:
        raise ValueError("a frame holds at least one message")
    return frame


# --------------------------------------------------------------------------- decoding
#
# Parsers work on the whole frame as ``bytes`` with ``pos``/``end`` indices rather than on
# slices or memoryviews: slicing copies, and a memoryview slice would leak into the payload
# fields, which must be ``bytes``. ``end`` is the end of the current message's body, never of
# the frame, so a short field cannot borrow bytes from the next message. Offsets in error
# messages are from the start of the frame.

_Parser: TypeAlias = Callable[[bytes, int, int], Message]


def _perr(message: str) -> ProtocolError:
    return ProtocolError(message, ErrorCode.PROTOCOL)


def _uv_slow(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    start = pos
    result = 0
    shift = 0
    while True:
        if pos >= end:
            if pos == start:
                raise _perr(f"{what}: expected a uv at offset {pos}, found the end of the message")
            raise _perr(f"{what}: uv at offset {start} is cut off by the end of the message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            # A zero last group adds nothing: a shorter encoding of the same value exists, and
            # accepting both would give one value two spellings.
            if b == 0 and shift:
                raise _perr(f"{what}: overlong uv at offset {start} (ends in a zero byte)")
            if result >= _UV_LIMIT:
                raise _perr(f"{what}: uv at offset {start} is 2**64 or more")
            return result, pos
        shift += 7
        if shift >= 70:
            raise _perr(f"{what}: uv at offset {start} is longer than 10 bytes")


def _uv(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    if pos < end:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
    return _uv_slow(buf, pos, end, what)


def _str(buf: bytes, pos: int, end: int, what: str) -> tuple[str, int]:
    n, p = _uv(buf, pos, end, what)
    stop = p + n
    if stop > end:
        raise _perr(
            f"{what}: string of {n} bytes at offset {pos} runs past the end of the message"
            f" ({end - p} bytes left)"
        )
    try:
        return buf[p:stop].decode(), stop
    except UnicodeDecodeError as e:
        raise _perr(f"{what} is not valid UTF-8 at offset {p + e.start}") from None


def _u8_at(buf: bytes, pos: int, end: int, what: str) -> int:
    if pos < end:
        return buf[pos]
    raise _perr(f"{what}: expected a u8 at offset {pos}, found the end of the message")


def _flag(buf: bytes, pos: int, end: int, what: str) -> bool:
    b = _u8_at(buf, pos, end, what)
    if b > 1:
        raise _perr(f"{what}: expected 0 or 1 at offset {pos}, found {b}")
    return b == 1


# Kinds without a `rest` field ignore bytes after their last field: a later protocol version may
# append fields, and an older reader must still understand the ones it knows.


def _p_welcome(buf: bytes, pos: int, end: int) -> Welcome:
    session, pos = _str(buf, pos, end, "WELCOME: session")
    resume, pos = _str(buf, pos, end, "WELCOME: resume")
    heartbeat_ms, pos = _uv(buf, pos, end, "WELCOME: heartbeat_ms")
    max_frame, pos = _uv(buf, pos, end, "WELCOME: max_frame")
    resumed = _flag(buf, pos, end, "WELCOME: resumed")
    return Welcome(session, resume, heartbeat_ms, max_frame, resumed)


def _p_push(compressed: bool) -> _Parser:
    def parse(buf: bytes, pos: int, end: int) -> Push:
        topic, pos = _uv(buf, pos, end, "PUSH: topic")
        seq, pos = _uv(buf, pos, end, "PUSH: seq")
        return Push(topic, seq, buf[pos:end], compressed)

    return parse


def _p_result(compressed: bool) -> _Parser:
    def parse(buf: bytes, pos: int, end: int) -> Result:
        call, pos = _uv(buf, pos, end, "RESULT: call")
        status = _u8_at(buf, pos, end, "RESULT: status")
        return Result(call, status, buf[pos + 1 : end], compressed)

    return parse


def _p_stream(compressed: bool) -> _Parser:
    def parse(buf: bytes, pos: int, end: int) -> Stream:
        call, pos = _uv(buf, pos, end, "STREAM: call")
        last = _flag(buf, pos, end, "STREAM: last")
        return Stream(call, last, buf[pos + 1 : end], compressed)

    return parse


def _p_subscribed(buf: bytes, pos: int, end: int) -> Subscribed:
    req, pos = _uv(buf, pos, end, "SUBSCRIBED: req")
    topic, pos = _uv(buf, pos, end, "SUBSCRIBED: topic")
    mode = _u8_at(buf, pos, end, "SUBSCRIBED: mode")
    codec = _u8_at(buf, pos + 1, end, "SUBSCRIBED: codec")
    epoch, pos = _uv(buf, pos + 2, end, "SUBSCRIBED: epoch")
    head, pos = _uv(buf, pos, end, "SUBSCRIBED: head")
    recovered = _flag(buf, pos, end, "SUBSCRIBED: recovered")
    name, pos = _str(buf, pos + 1, end, "SUBSCRIBED: name")
    return Subscribed(req, topic, mode, codec, epoch, head, recovered, name)


def _p_rejected(buf: bytes, pos: int, end: int) -> Rejected:
    req, pos = _uv(buf, pos, end, "REJECTED: req")
    code, pos = _uv(buf, pos, end, "REJECTED: code")
    reason, pos = _str(buf, pos, end, "REJECTED: reason")
    return Rejected(req, code, reason)


def _p_unsubscribed(buf: bytes, pos: int, end: int) -> Unsubscribed:
    topic, pos = _uv(buf, pos, end, "UNSUBSCRIBED: topic")
    code, pos = _uv(buf, pos, end, "UNSUBSCRIBED: code")
    reason, pos = _str(buf, pos, end, "UNSUBSCRIBED: reason")
    return Unsubscribed(topic, code, reason)


def _p_gap(buf: bytes, pos: int, end: int) -> Gap:
    topic, pos = _uv(buf, pos, end, "GAP: topic")
    start, pos = _uv(buf, pos, end, "GAP: from")
    count, pos = _uv(buf, pos, end, "GAP: count")
    return Gap(topic, start, count)


def _p_pong(buf: bytes, pos: int, end: int) -> Pong:
    return Pong(_uv(buf, pos, end, "PONG: token")[0])


def _p_goodbye(buf: bytes, pos: int, end: int) -> Goodbye:
    code, pos = _uv(buf, pos, end, "GOODBYE: code")
    reason, pos = _str(buf, pos, end, "GOODBYE: reason")
    return Goodbye(code, reason)


def _p_flow(buf: bytes, pos: int, end: int) -> Flow:
    return Flow(_u8_at(buf, pos, end, "FLOW: fill"))


def _p_hello(buf: bytes, pos: int, end: int) -> Hello:
    version, pos = _uv(buf, pos, end, "HELLO: version")
    resume, pos = _str(buf, pos, end, "HELLO: resume")
    return Hello(version, resume)


def _p_subscribe(compressed: bool) -> _Parser:
    def parse(buf: bytes, pos: int, end: int) -> Subscribe:
        req, pos = _uv(buf, pos, end, "SUBSCRIBE: req")
        name, pos = _str(buf, pos, end, "SUBSCRIBE: name")
        epoch, pos = _uv(buf, pos, end, "SUBSCRIBE: epoch")
        since, pos = _uv(buf, pos, end, "SUBSCRIBE: since")
        return Subscribe(req, name, epoch, since, buf[pos:end], compressed)

    return parse


def _p_unsubscribe(buf: bytes, pos: int, end: int) -> Unsubscribe:
    return Unsubscribe(_uv(buf, pos, end, "UNSUBSCRIBE: topic")[0])


def _p_call(compressed: bool) -> _Parser:
    def parse(buf: bytes, pos: int, end: int) -> Call:
        call, pos = _uv(buf, pos, end, "CALL: call")
        method, pos = _str(buf, pos, end, "CALL: method")
        return Call(call, method, buf[pos:end], compressed)

    return parse


def _p_ack(buf: bytes, pos: int, end: int) -> Ack:
    topic, pos = _uv(buf, pos, end, "ACK: topic")
    # Unlike the other fixed-layout kinds, ACK's values run to the end of the body, so it has
    # no room for appended fields: every byte after topic must be a well-formed uv.
    values: list[int] = []
    append = values.append
    while pos < end:
        b = buf[pos]
        if b < 0x80:
            append(b)
            pos += 1
        else:
            v, pos = _uv_slow(buf, pos, end, "ACK: value")
            append(v)
    return Ack(topic, tuple(values))


def _p_nack(buf: bytes, pos: int, end: int) -> Nack:
    topic, pos = _uv(buf, pos, end, "NACK: topic")
    seq, pos = _uv(buf, pos, end, "NACK: seq")
    return Nack(topic, seq, _flag(buf, pos, end, "NACK: requeue"))


def _p_nak(buf: bytes, pos: int, end: int) -> Nak:
    return Nak(_u8_at(buf, pos, end, "NAK: fill"))


def _p_ping(buf: bytes, pos: int, end: int) -> Ping:
    return Ping(_uv(buf, pos, end, "PING: token")[0])


def _p_publish(compressed: bool) -> _Parser:
    def parse(buf: bytes, pos: int, end: int) -> Publish:
        req, pos = _uv(buf, pos, end, "PUBLISH: req")
        name, pos = _str(buf, pos, end, "PUBLISH: name")
        return Publish(req, name, buf[pos:end], compressed)

    return parse


def _refuse_compressed(kind: Kind) -> _Parser:
    def parse(buf: bytes, pos: int, end: int) -> Message:
        raise _perr(f"{kind.name}: COMPRESSED bit set on a kind that is not compressible")

    return parse


def _build_parsers() -> list[_Parser | None]:
    """One slot per kind byte, COMPRESSED variants included, so dispatch is a single index."""
    table: list[_Parser | None] = [None] * 256
    plain: dict[Kind, _Parser] = {
        Kind.WELCOME: _p_welcome,
        Kind.SUBSCRIBED: _p_subscribed,
        Kind.REJECTED: _p_rejected,
        Kind.UNSUBSCRIBED: _p_unsubscribed,
        Kind.GAP: _p_gap,
        Kind.PONG: _p_pong,
        Kind.GOODBYE: _p_goodbye,
        Kind.FLOW: _p_flow,
        Kind.HELLO: _p_hello,
        Kind.UNSUBSCRIBE: _p_unsubscribe,
        Kind.ACK: _p_ack,
        Kind.NACK: _p_nack,
        Kind.NAK: _p_nak,
        Kind.PING: _p_ping,
    }
    with_payload: dict[Kind, Callable[[bool], _Parser]] = {
        Kind.PUSH: _p_push,
        Kind.RESULT: _p_result,
        Kind.STREAM: _p_stream,
        Kind.SUBSCRIBE: _p_subscribe,
        Kind.CALL: _p_call,
        Kind.PUBLISH: _p_publish,
    }
    assert set(with_payload) == COMPRESSIBLE and not set(plain) & COMPRESSIBLE
    assert set(plain) | set(with_payload) == set(Kind)
    for kind, parser in plain.items():
        table[kind] = parser
        table[kind | COMPRESSED] = _refuse_compressed(kind)
    for kind, factory in with_payload.items():
        table[kind] = factory(False)
        table[kind | COMPRESSED] = factory(True)
    return table


_PARSERS = _build_parsers()


def _kind_name(k: int) -> str:
    name = _NAMES.get(k & 0x7F)
    return name if name is not None else f"kind {k:#04x}"


def _messages(buf: bytes) -> Iterator[Message]:
    parsers = _PARSERS
    n = len(buf)
    pos = 0
    while pos < n:
        start = pos
        k = buf[pos]
        pos += 1
        if pos < n and buf[pos] < 0x80:
            length = buf[pos]
            pos += 1
        elif pos >= n:
            raise _perr(
                f"{_kind_name(k)}: message at offset {start} is cut off after its kind byte"
                " (expected a uv length, found the end of the frame)"
            )
        else:
            length, pos = _uv_slow(buf, pos, n, f"{_kind_name(k)}: length")
        end = pos + length
        if end > n:
            raise _perr(
                f"{_kind_name(k)}: message at offset {start} declares {length} body bytes,"
                f" the frame has {n - pos} left"
            )
        parser = parsers[k]
        if parser is not None:
            yield parser(buf, pos, end)
        pos = end


def iter_messages(frame: bytes | bytearray | memoryview) -> Iterator[Message]:
    """Parse ``frame`` lazily, message by message, skipping unknown kinds.

    A malformed message raises :class:`ProtocolError` when the iteration reaches it, after the
    messages before it have been yielded. An empty frame is refused at once.
    """
    if isinstance(frame, bytes):
        buf = frame
    elif isinstance(frame, (bytearray, memoryview)):
        # One copy up front, so every slice taken for a payload is already `bytes`.
        buf = bytes(frame)
    else:
        raise TypeError(f"frame: expected bytes, bytearray or memoryview, got {type(frame)}")
    if not buf:
        raise _perr("frame: expected at least one message, found an empty frame")
    return _messages(buf)


def decode_frame(frame: bytes | bytearray | memoryview) -> list[Message]:
    """Every known message of ``frame``; :class:`ProtocolError` if any part is malformed."""
    return list(iter_messages(frame))

"""What the wire carries: the kinds, modes and codecs, and one frozen dataclass per kind.

A dataclass's fields are the wire fields in wire order, and each field's annotation names its
wire type (:data:`Uv`, :data:`U8`, :data:`Flag`, :data:`Str`, :data:`Rest`, :data:`Uvs`): the
codec (codec.py) builds every kind's encoder and parser from these declarations, so adding a
kind or a field is a change here and nowhere else. ``compressed`` is not a wire field; it is
the COMPRESSED bit of the kind byte, and only kinds with a :data:`Rest` payload have it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import Field, dataclass, field
from enum import IntEnum
from typing import Any, ClassVar, TypeAlias, overload

from ..errors import ErrorCode, ProtocolError

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
    ITEM = 0x0C
    REVOKE = 0x0D
    ENTRY = 0x0E
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
    KEYED = 5


class EntryOp(IntEnum):
    """What one ENTRY of a keyed topic says (protocol.md section 5b)."""

    SET = 1
    """The entry's whole value."""
    PATCH = 2
    """An RFC 7386 merge patch to the value the client holds (it holds the previous change)."""
    DELETE = 3
    """The key is gone."""
    RESET = 4
    """Drop every entry held for the topic: the whole table follows."""
    SYNCED = 5
    """Everything sent since SUBSCRIBED or RESET is now the whole table as of ``seq``."""


class Codec(IntEnum):
    """A topic's payload encoding, as announced in SUBSCRIBED."""

    JSON = 0
    BYTES = 1
    TEXT = 2


COMPRESSIBLE: frozenset[int] = frozenset(
    {
        Kind.PUSH,
        Kind.RESULT,
        Kind.STREAM,
        Kind.ITEM,
        Kind.ENTRY,
        Kind.SUBSCRIBE,
        Kind.CALL,
        Kind.PUBLISH,
    }
)

# Wire types. To the type checker they are the Python types; to the codec, the annotation's
# name says how the field is laid out (protocol.md section 2).
Uv: TypeAlias = int
"""Unsigned LEB128, at most 10 bytes, below 2**64."""
U8: TypeAlias = int
"""One byte."""
Flag: TypeAlias = bool
"""One byte, 0 or 1."""
Str: TypeAlias = str
"""A uv byte length, then UTF-8."""
Rest: TypeAlias = bytes
"""The remainder of the body: the payload, which may be compressed."""
Uvs: TypeAlias = tuple[int, ...]
"""uvs to the end of the body (ACK's and REVOKE's values)."""


class _Message:
    """``==``, ``hash()`` and ``repr()`` of every message, as ``@dataclass`` would write them.

    ``@dataclass`` writes and compiles these three for each class, and that is about 40 % of
    what importing this module costs (22 classes). So the message classes say ``eq=False,
    repr=False`` and inherit these, written once: they read the fields from
    ``__dataclass_fields__`` and answer as the generated ones do (the fields in order, equal
    only to the same class, hashed as the tuple of the fields, ``Push(topic=1, ...)``). Each
    class has a docstring for the same reason: without one ``@dataclass`` computes one from
    ``inspect.signature``, another 10 %.
    """

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self.__dataclass_fields__])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            assert isinstance(other, _Message)
            return self._values() == other._values()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__dataclass_fields__)
        return f"{self.__class__.__qualname__}({fields})"


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Welcome(_Message):
    """WELCOME: the session, its resume token, the heartbeat period, the largest client frame."""

    session: Str
    resume: Str
    heartbeat_ms: Uv
    max_frame: Uv
    resumed: Flag


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Push(_Message):
    """PUSH: message ``seq`` of ``topic``."""

    topic: Uv
    seq: Uv
    payload: Rest
    compressed: bool = False


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Result(_Message):
    """RESULT: the answer to ``call`` (``status`` 0 ok, 1 error)."""

    call: Uv
    status: U8
    payload: Rest
    compressed: bool = False


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Stream(_Message):
    """STREAM: one item of ``call``'s streamed reply; ``last`` ends it."""

    call: Uv
    last: Flag
    payload: Rest
    compressed: bool = False


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Subscribed(_Message):
    """SUBSCRIBED: the answer to SUBSCRIBE ``req``: the topic's number, mode, codec, position."""

    req: Uv
    topic: Uv
    # Plain ints rather than Mode/Codec: a newer server may announce a value this code lacks.
    mode: U8
    codec: U8
    epoch: Uv
    head: Uv
    recovered: Flag
    name: Str


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Rejected(_Message):
    """REJECTED: request ``req`` (a SUBSCRIBE or a PUBLISH) refused, with ``code``."""

    req: Uv
    code: Uv
    reason: Str


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Unsubscribed(_Message):
    """UNSUBSCRIBED: the subscription to ``topic`` is over (``code`` 0: as asked)."""

    topic: Uv
    code: Uv
    reason: Str


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Gap(_Message):
    """GAP: messages ``start`` to ``start + count - 1`` of ``topic`` will never arrive."""

    topic: Uv
    start: Uv = field(metadata={"wire": "from"})  # `from` is a Python keyword
    count: Uv


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Pong(_Message):
    """PONG: the answer to PING ``token``."""

    token: Uv


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Goodbye(_Message):
    """GOODBYE: the server is closing the session; the last message it sends."""

    code: Uv
    reason: Str


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Flow(_Message):
    """FLOW: the intake (or the queue) a client PUBLISHes to is ``fill`` % full."""

    fill: U8


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Item(_Message):
    """One work item of a queue topic: ``tag`` numbers this delivery, ``attempt`` counts them."""

    topic: Uv
    tag: Uv
    attempt: Uv
    payload: Rest
    compressed: bool = False


def _counted(kind: str, values: tuple[int, ...]) -> tuple[int, ...]:
    """The tags of a ``n:uv tag:uv × n`` body; ``ProtocolError`` when the count is wrong."""
    if not values or values[0] != len(values) - 1:
        raise ProtocolError(
            f"{kind}: expected a count followed by that many tags, found {len(values)} values"
            + (f" starting with count {values[0]}" if values else ""),
            ErrorCode.PROTOCOL,
        )
    return values[1:]


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Revoke(_Message):
    """REVOKE: ``topic`` then ``n`` and the ``n`` tags the server took back."""

    topic: Uv
    values: Uvs

    @classmethod
    def of(cls, topic: int, tags: Iterable[int]) -> Revoke:
        tags = tuple(tags)
        return cls(topic, (len(tags), *tags))

    @property
    def tags(self) -> tuple[int, ...]:
        return _counted("REVOKE", self.values)


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Entry(_Message):
    """ENTRY: change ``seq`` of a keyed topic: ``op`` (``EntryOp``) on ``key``."""

    topic: Uv
    seq: Uv
    op: U8
    key: Str
    payload: Rest
    compressed: bool = False


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Hello(_Message):
    """HELLO: the first message of a connection; ``resume`` empty for a new session."""

    version: Uv
    resume: Str


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Subscribe(_Message):
    """SUBSCRIBE: ``name``, from the ``epoch`` and ``since`` (last seq) the client holds."""

    req: Uv
    name: Str
    epoch: Uv
    since: Uv
    params: Rest
    compressed: bool = False


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Unsubscribe(_Message):
    """UNSUBSCRIBE: end the subscription to ``topic``."""

    topic: Uv


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Call(_Message):
    """CALL: call ``method``; answered by RESULT or STREAM with the same ``call``."""

    call: Uv
    method: Str
    payload: Rest
    compressed: bool = False


class _AckItems:
    """``Ack.items(topic, tags)`` builds a queue ACK; ``ack.items`` reads its tags back.

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
        return _counted("ACK", obj.values)


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Ack(_Message):
    """ACK: ``topic`` then a run of uv ``values`` whose meaning depends on the topic's mode.

    The decoder cannot know the mode, so it keeps the raw values; the session, which does,
    reads them through :attr:`upto` (private topics: one cumulative seq) or :attr:`items`
    (queue topics: ``n`` then ``n`` delivery tags).
    """

    topic: Uv
    values: Uvs

    items = _AckItems()

    @classmethod
    def private(cls, topic: int, upto: int) -> Ack:
        return cls(topic, (upto,))

    @property
    def upto(self) -> int:
        if not self.values:
            raise ProtocolError("ACK: expected upto after topic, found nothing", ErrorCode.PROTOCOL)
        return self.values[0]


def _ack_items(topic: int, tags: Iterable[int]) -> Ack:
    tags = tuple(tags)
    return Ack(topic, (len(tags), *tags))


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Nack(_Message):
    """NACK: give delivery ``tag`` of a queue topic back (``requeue``) or drop it."""

    topic: Uv
    tag: Uv
    requeue: Flag


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Nak(_Message):
    """NAK: the client's own inbound buffer is ``fill`` % full."""

    fill: U8


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Ping(_Message):
    """PING: answered by PONG with the same ``token``."""

    token: Uv


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Publish(_Message):
    """PUBLISH: to topic ``name``; refused with REJECTED ``req``, else no answer."""

    req: Uv
    name: Str
    payload: Rest
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
    | Item
    | Revoke
    | Entry
)
ClientMessage: TypeAlias = (
    Hello | Subscribe | Unsubscribe | Call | Ack | Nack | Nak | Ping | Publish
)
Message: TypeAlias = ServerMessage | ClientMessage

KINDS: dict[type[Message], Kind] = {
    Welcome: Kind.WELCOME,
    Push: Kind.PUSH,
    Result: Kind.RESULT,
    Stream: Kind.STREAM,
    Subscribed: Kind.SUBSCRIBED,
    Rejected: Kind.REJECTED,
    Unsubscribed: Kind.UNSUBSCRIBED,
    Gap: Kind.GAP,
    Pong: Kind.PONG,
    Goodbye: Kind.GOODBYE,
    Flow: Kind.FLOW,
    Item: Kind.ITEM,
    Revoke: Kind.REVOKE,
    Entry: Kind.ENTRY,
    Hello: Kind.HELLO,
    Subscribe: Kind.SUBSCRIBE,
    Unsubscribe: Kind.UNSUBSCRIBE,
    Call: Kind.CALL,
    Ack: Kind.ACK,
    Nack: Kind.NACK,
    Nak: Kind.NAK,
    Ping: Kind.PING,
    Publish: Kind.PUBLISH,
}
"""Each message class and its kind."""

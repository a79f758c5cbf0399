"""Messages to bytes and back: every kind's encoder and parser, built from its dataclass.

Each message dataclass (messages.py) declares its wire fields in order with their wire types.
At import, this module writes for each kind the straight-line encoder and parser a person would
write by hand, and compiles them (as ``dataclasses`` does for ``__init__``): no loop over
fields and no per-field dispatch at run time, so the table costs nothing on the hot path, and
the twenty kinds cannot drift apart. ``SOURCE[Push]`` shows the code written for PUSH; for
example its parser is::

    def parse(buf, pos, end):
        if pos < end and buf[pos] < 0x80:
            f0 = buf[pos]; pos += 1
        else:
            f0, pos = read_uv_slow(buf, pos, end, 'PUSH: topic')
        ...
        f2 = buf[pos:end]
        m = new(cls); set0(m, f0); set1(m, f1); set2(m, f2); set3(m, True)
        return m

The one-byte uv (most topics, lengths, flags) is read inline. Parsers fill the frozen
dataclass's slots directly: a frozen ``__init__`` goes through ``object.__setattr__`` for each
field, which is most of the cost of decoding a small message.

:func:`push_message` and :func:`item_encoder` (and :func:`item_message`, one ITEM through it)
stay hand-written: they are the fan-out and the queue-delivery paths, built without a
dataclass. Every malformed input raises :class:`~rubris_asgi.errors.ProtocolError` with code 1
and a message naming the kind, the field and the frame offset; nothing else escapes the
decoder. Kinds without a ``Rest`` or ``Uvs`` field ignore bytes after their last field: a later
protocol version may append fields, and an older reader must still understand the ones it
knows. Unknown kinds are skipped by their length. The decoder accepts both directions' kinds
and leaves it to the caller to refuse a kind sent the wrong way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeAlias, cast

from . import wire
from .messages import COMPRESSED, COMPRESSIBLE, KINDS, Kind, Message
from .wire import BYTE, encode_uv, perr, read_uv_slow

_Parser: TypeAlias = Callable[[bytes, int, int], Message]
_Encoder: TypeAlias = Callable[[Any], bytes]

_NAMES: dict[int, str] = {k.value: k.name for k in Kind}

SOURCE: dict[type[Message], str] = {}
"""The generated encoder and parsers of each message class, for reading and debugging."""


# --------------------------------------------------------------------------- code generation


def _wire_fields(cls: type[Message]) -> list[tuple[str, str, str]]:
    """``(attribute, wire type, wire name)`` of each wire field, in wire order."""
    out = []
    for f in dataclasses.fields(cls):
        if f.name == "compressed":
            continue
        out.append((f.name, str(f.type), f.metadata.get("wire", f.name)))
    return out


def _encoder_source(kind: Kind, fields: list[tuple[str, str, str]]) -> str:
    parts = []
    for attr, wtype, wname in fields:
        what = f"{kind.name}: {wname}"
        parts.append(
            {
                "Uv": f"encode_uv(m.{attr})",
                "U8": f"encode_u8(m.{attr}, {what!r})",
                "Flag": f"(b'\\x01' if m.{attr} else b'\\x00')",
                "Str": f"encode_str(m.{attr})",
                "Rest": f"m.{attr}",
                "Uvs": f"b''.join([encode_uv(v) for v in m.{attr}])",
            }[wtype]
        )
    head = "(K_C if m.compressed else K)" if kind in COMPRESSIBLE else "K"
    return (
        "def encode(m):\n"
        f"    body = {' + '.join(parts)}\n"
        f"    return {head} + encode_uv(len(body)) + body\n"
    )


def _parser_source(kind: Kind, fields: list[tuple[str, str, str]], compressed: bool) -> str:
    lines = ["def parse(buf, pos, end):"]
    for i, (_attr, wtype, wname) in enumerate(fields):
        what = repr(f"{kind.name}: {wname}")
        if wtype == "Uv":
            lines += [
                "    if pos < end and buf[pos] < 0x80:",
                f"        f{i} = buf[pos]; pos += 1",
                "    else:",
                f"        f{i}, pos = read_uv_slow(buf, pos, end, {what})",
            ]
        elif wtype == "U8":
            lines.append(f"    f{i} = read_u8(buf, pos, end, {what}); pos += 1")
        elif wtype == "Flag":
            lines.append(f"    f{i} = read_flag(buf, pos, end, {what}); pos += 1")
        elif wtype == "Str":
            lines.append(f"    f{i}, pos = read_str(buf, pos, end, {what})")
        elif wtype == "Rest":
            lines.append(f"    f{i} = buf[pos:end]")
        else:  # Uvs
            lines.append(f"    f{i} = read_uvs(buf, pos, end, {what})")
    sets = [f"set{i}(m, f{i})" for i in range(len(fields))]
    if kind in COMPRESSIBLE:
        sets.append(f"set{len(fields)}(m, {compressed})")
    lines += [f"    m = new(cls); {'; '.join(sets)}", "    return m"]
    return "\n".join(lines) + "\n"


def _compile(source: str, name: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    code = compile(source, f"<rubris_asgi.protocol.codec: {name}>", "exec")
    exec(code, namespace)  # noqa: S102 - our own source, written above from the dataclasses
    fn = namespace.pop(name)
    return cast(Callable[..., Any], fn)


def _build(cls: type[Message]) -> tuple[_Encoder, _Parser, _Parser | None]:
    """The encoder, the parser, and the parser of the COMPRESSED variant (if any) of ``cls``."""
    kind = KINDS[cls]
    fields = _wire_fields(cls)
    rest = [i for i, (_a, t, _n) in enumerate(fields) if t in ("Rest", "Uvs")]
    assert rest in ([], [len(fields) - 1]), f"{cls.__name__}: only the last field may be Rest/Uvs"
    assert (kind in COMPRESSIBLE) == (fields[-1][1] == "Rest"), cls.__name__
    slots = [f.name for f in dataclasses.fields(cls)]
    namespace: dict[str, Any] = {
        "cls": cls,
        "new": object.__new__,
        "K": BYTE[kind],
        "K_C": BYTE[kind | COMPRESSED],
        "encode_uv": encode_uv,
        "encode_u8": wire.encode_u8,
        "encode_str": wire.encode_str,
        "read_uv_slow": read_uv_slow,
        "read_u8": wire.read_u8,
        "read_flag": wire.read_flag,
        "read_str": wire.read_str,
        "read_uvs": wire.read_uvs,
        **{f"set{i}": getattr(cls, name).__set__ for i, name in enumerate(slots)},
    }
    enc_src = _encoder_source(kind, fields)
    plain_src = _parser_source(kind, fields, False)
    sources = [enc_src, plain_src]
    encoder = _compile(enc_src, "encode", namespace)
    parser = _compile(plain_src, "parse", namespace)
    compressed = None
    if kind in COMPRESSIBLE:
        comp_src = _parser_source(kind, fields, True)
        sources.append(comp_src)
        compressed = _compile(comp_src, "parse", namespace)
    SOURCE[cls] = "\n".join(sources)
    return encoder, parser, compressed


def _refuse_compressed(kind: Kind) -> _Parser:
    def parse(buf: bytes, pos: int, end: int) -> Message:
        raise perr(f"{kind.name}: COMPRESSED bit set on a kind that is not compressible")

    return parse


def _build_tables() -> tuple[dict[type[Any], _Encoder], list[_Parser | None]]:
    """Encoders by class; parsers in one slot per kind byte, COMPRESSED variants included, so
    that dispatch is a single index."""
    assert set(KINDS.values()) == set(Kind)
    encoders: dict[type[Any], _Encoder] = {}
    parsers: list[_Parser | None] = [None] * 256
    for cls, kind in KINDS.items():
        encoder, parser, compressed = _build(cls)
        encoders[cls] = encoder
        parsers[kind] = parser
        parsers[kind | COMPRESSED] = compressed or _refuse_compressed(kind)
    return encoders, parsers


_ENCODERS, _PARSERS = _build_tables()


# --------------------------------------------------------------------------- encoding


def encode_message(kind: int, body: bytes, compressed: bool = False) -> bytes:
    """One message: ``kind`` (with COMPRESSED when asked), ``uv`` length, ``body``."""
    if not 0 <= kind < 0x80:
        raise ValueError(f"kind: expected 0x00-0x7F, got {kind:#x}")
    if compressed:
        if kind not in COMPRESSIBLE:
            raise ValueError(f"{_NAMES.get(kind, hex(kind))}: kind is not compressible")
        kind |= COMPRESSED
    return BYTE[kind] + encode_uv(len(body)) + body


def push_message(topic: int, seq: int, payload: bytes, compressed: bool = False) -> bytes:
    """A whole PUSH message, built once per publish and shared by every subscriber."""
    head = encode_uv(topic) + encode_uv(seq)
    return (
        (b"\x82" if compressed else b"\x02") + encode_uv(len(head) + len(payload)) + head + payload
    )


def entry_message(
    topic: int, seq: int, op: int, key: bytes, payload: bytes, compressed: bool = False
) -> bytes:
    """A whole ENTRY message of a keyed topic, built once per change and shared by every
    subscriber (``key`` already UTF-8: a keyed topic keeps its keys encoded)."""
    head = encode_uv(topic) + encode_uv(seq) + BYTE[op] + encode_uv(len(key)) + key
    return (
        (b"\x8e" if compressed else b"\x0e") + encode_uv(len(head) + len(payload)) + head + payload
    )


ItemEncoder: TypeAlias = Callable[[int, int, bytes, bool], bytes]
"""``(tag, attempt, payload, compressed)`` to a whole ITEM message of one queue topic."""


def item_encoder(topic: int) -> ItemEncoder:
    """The ITEM encoder of queue topic ``topic``: its uv is worked out here, once, instead of for
    each delivery (a queue topic keeps its encoder; the frame builder calls it per item)."""
    topic_uv = encode_uv(topic)

    def encode_item(tag: int, attempt: int, payload: bytes, compressed: bool) -> bytes:
        # an attempt is nearly always 1 or a few: its cached byte, without a call
        head = (
            topic_uv
            + encode_uv(tag)
            + (BYTE[attempt] if 0 <= attempt < 0x80 else encode_uv(attempt))
        )
        return (
            (b"\x8c" if compressed else b"\x0c")
            + encode_uv(len(head) + len(payload))
            + head
            + payload
        )

    return encode_item


def item_message(topic: int, tag: int, attempt: int, payload: bytes, compressed: bool) -> bytes:
    """A whole ITEM message: one delivery of a queue item, built when it is sent."""
    return item_encoder(topic)(tag, attempt, payload, compressed)


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
            raise perr(
                f"{_kind_name(k)}: message at offset {start} is cut off after its kind byte"
                " (expected a uv length, found the end of the frame)"
            )
        else:
            length, pos = read_uv_slow(buf, pos, n, f"{_kind_name(k)}: length")
        end = pos + length
        if end > n:
            raise perr(
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
        raise perr("frame: expected at least one message, found an empty frame")
    return _messages(buf)


def decode_frame(frame: bytes | bytearray | memoryview) -> list[Message]:
    """Every known message of ``frame``; :class:`ProtocolError` if any part is malformed."""
    return list(iter_messages(frame))

"""The wire's primitive types (protocol.md section 2), both ways.

Readers work on the whole frame as ``bytes`` with ``pos``/``end`` indices rather than on slices
or memoryviews: slicing copies, and a memoryview slice would leak into the payload fields,
which must be ``bytes``. ``end`` is the end of the current message's body, never of the frame,
so a short field cannot borrow bytes from the next message. Offsets in error messages are from
the start of the frame; ``what`` names the kind and field (``"PUSH: seq"``).
"""

from __future__ import annotations

from ..errors import ErrorCode, ProtocolError

UV_LIMIT = 1 << 64

# Cached one-byte encodings: most varints (small topics, flags, lengths of short bodies) and
# every u8 are one of these, and indexing a tuple beats building a bytes object.
BYTE = tuple(bytes((i,)) for i in range(256))


# --------------------------------------------------------------------------- writing


def encode_uv(n: int) -> bytes:
    """Unsigned LEB128 of ``n``; ``ValueError`` unless ``0 <= n < 2**64``."""
    # Unrolled up to three bytes: topics, lengths and the seqs of a long-running topic.
    if n < 0x80:
        if n >= 0:
            return BYTE[n]
        raise ValueError(f"uv out of range: expected 0 <= n < 2**64, got {n}")
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if n < 0x200000:
        return bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, n >> 14))
    if n >= UV_LIMIT:
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


def encode_u8(n: int, what: str) -> bytes:
    if 0 <= n < 0x100:
        return BYTE[n]
    raise ValueError(f"{what}: expected a u8 (0-255), got {n}")


# --------------------------------------------------------------------------- reading


def perr(message: str) -> ProtocolError:
    return ProtocolError(message, ErrorCode.PROTOCOL)


def read_uv_slow(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    """A uv of any length, or the error that says what is wrong with it."""
    start = pos
    result = 0
    shift = 0
    while True:
        if pos >= end:
            if pos == start:
                raise perr(f"{what}: expected a uv at offset {pos}, found the end of the message")
            raise perr(f"{what}: uv at offset {start} is cut off by the end of the message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            # A zero last group adds nothing: a shorter encoding of the same value exists, and
            # accepting both would give one value two spellings.
            if b == 0 and shift:
                raise perr(f"{what}: overlong uv at offset {start} (ends in a zero byte)")
            if result >= UV_LIMIT:
                raise perr(f"{what}: uv at offset {start} is 2**64 or more")
            return result, pos
        shift += 7
        if shift >= 70:
            raise perr(f"{what}: uv at offset {start} is longer than 10 bytes")


def read_uv(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    if pos < end:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
    return read_uv_slow(buf, pos, end, what)


def read_str(buf: bytes, pos: int, end: int, what: str) -> tuple[str, int]:
    n, p = read_uv(buf, pos, end, what)
    stop = p + n
    if stop > end:
        raise perr(
            f"{what}: string of {n} bytes at offset {pos} runs past the end of the message"
            f" ({end - p} bytes left)"
        )
    try:
        return buf[p:stop].decode(), stop
    except UnicodeDecodeError as e:
        raise perr(f"{what} is not valid UTF-8 at offset {p + e.start}") from None


def read_u8(buf: bytes, pos: int, end: int, what: str) -> int:
    if pos < end:
        return buf[pos]
    raise perr(f"{what}: expected a u8 at offset {pos}, found the end of the message")


def read_flag(buf: bytes, pos: int, end: int, what: str) -> bool:
    b = read_u8(buf, pos, end, what)
    if b > 1:
        raise perr(f"{what}: expected 0 or 1 at offset {pos}, found {b}")
    return b == 1


def read_uvs(buf: bytes, pos: int, end: int, what: str) -> tuple[int, ...]:
    """uvs to the end of the body. Unlike the fixed-layout fields these leave no room for
    appended fields: every byte must belong to a well-formed uv."""
    values: list[int] = []
    append = values.append
    while pos < end:
        b = buf[pos]
        if b < 0x80:
            append(b)
            pos += 1
        else:
            v, pos = read_uv_slow(buf, pos, end, what)
            append(v)
    return tuple(values)

"""Per-message compression: raw DEFLATE at level 1, kept only when it halves the payload.

Compression is applied to one message's *payload* at a time, never to a whole frame, so a frame
may mix compressed and plain messages and a reader can route a message without inflating it
(protocol.md section 2: the COMPRESSED bit, 0x80 on the kind byte).

Why these choices (source document 001, "Compression for Server messages"):

* **Raw DEFLATE (RFC 1951, ``wbits=-15``)**: no zlib or gzip header, because the wire says so and
  browser clients inflate it with any deflate library.
* **Level 1**: the cheapest level; on redundant text such as JSON the higher levels buy a few
  per cent of space for several times the CPU, on the server and on the client alike.
* **Only at or above ``compress_at``**: small payloads rarely shrink enough to pay for the work,
  so each topic (endpoint) chooses the size from which it is worth trying.
* **The 50 % rule**: a compressed form is kept only when it is at most half the original.
  A smaller gain is not worth the client's inflate cost, so the work is discarded and the
  payload goes out as it was.
* **Pluggable**: any object with ``compress(bytes) -> bytes`` producing raw DEFLATE may replace the
  default (:class:`Compressor`); inbound, any :class:`Decompressor` may replace the inflater.

Inflating what a client sent is the dangerous direction. A deflate bomb of ~100 KB can expand to
100 MB, so :func:`inflate` never asks zlib for more than ``limit + 1`` bytes: it learns that the
output is too large by producing one byte more than allowed, never by producing all of it.
Every failure of the data (corrupt, truncated, trailing garbage, too large) becomes a
:class:`~rubris_asgi.errors.ProtocolError` carrying the code to send back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, cast, runtime_checkable

from zlib_ng import zlib_ng

from rubris_asgi.errors import ErrorCode, ProtocolError

__all__ = [
    "Compression",
    "CompressionStats",
    "Compressor",
    "DeflateCompressor",
    "DeflateDecompressor",
    "Decompressor",
    "inflate",
]

# Raw DEFLATE: negative window bits mean "no zlib or gzip wrapper", 15 = the full 32 KiB window.
RAW_DEFLATE_WBITS = -15

# The stub declares ``error`` as an instance; at runtime it is the exception class.
_ZlibError = cast("type[Exception]", zlib_ng.error)


@runtime_checkable
class Compressor(Protocol):
    """Compresses one payload to raw DEFLATE (the client inflates it as such)."""

    def compress(self, data: bytes) -> bytes: ...


@runtime_checkable
class Decompressor(Protocol):
    """Inflates one payload, never producing more than ``limit`` bytes.

    Must raise ``ProtocolError(..., ErrorCode.TOO_LARGE)`` when the output would exceed ``limit``
    and ``ProtocolError(..., ErrorCode.PROTOCOL)`` when the data is corrupt or truncated. It may be
    called for many sessions, so it should keep no state between calls.
    """

    def decompress(self, data: bytes, limit: int) -> bytes: ...


class DeflateCompressor:
    """The default :class:`Compressor`: zlib-ng raw DEFLATE, level 1 unless told otherwise."""

    __slots__ = ("level",)

    def __init__(self, level: int = 1) -> None:
        # Checked here so that a bad level fails at configuration, not on the first big publish.
        if isinstance(level, bool) or not isinstance(level, int) or not -1 <= level <= 9:
            raise ValueError(f"deflate level must be an int from -1 to 9, got {level!r}")
        self.level = level

    def compress(self, data: bytes) -> bytes:
        # One-shot compress: a message is compressed once, so a long-lived stream would only
        # carry a window across unrelated messages that the client could not share anyway.
        return zlib_ng.compress(data, self.level, RAW_DEFLATE_WBITS)

    def __repr__(self) -> str:
        return f"DeflateCompressor(level={self.level})"


class DeflateDecompressor:
    """The default :class:`Decompressor`: zlib-ng raw DEFLATE with a hard output limit.

    Stateless between calls (a fresh decompress object each time), so one instance serves every
    session.
    """

    __slots__ = ()

    def decompress(self, data: bytes, limit: int) -> bytes:
        if limit < 0:
            # A caller's bug, not the client's: it must not turn into a protocol code.
            raise ValueError(f"limit must be >= 0, got {limit}")
        inflater = zlib_ng.decompressobj(RAW_DEFLATE_WBITS)
        try:
            # max_length bounds what zlib produces (and what the output buffer grows to): asking
            # for one byte past the limit is how we find out the limit is exceeded without
            # inflating a bomb. max_length=0 would mean "unbounded", hence +1 even for limit 0.
            out = inflater.decompress(data, limit + 1)
        except _ZlibError as exc:
            raise ProtocolError(f"corrupt deflate data: {exc}", ErrorCode.PROTOCOL) from None
        if len(out) > limit:
            raise ProtocolError(
                f"inflated payload exceeds the limit of {limit} bytes", ErrorCode.TOO_LARGE
            )
        if inflater.unconsumed_tail:
            # zlib stops early only when max_length is reached, handled above; kept as a guard
            # so that no input is ever silently ignored.
            raise ProtocolError(
                f"inflated payload exceeds the limit of {limit} bytes", ErrorCode.TOO_LARGE
            )
        if not inflater.eof:
            raise ProtocolError(
                "truncated deflate data: the stream does not end", ErrorCode.PROTOCOL
            )
        if inflater.unused_data:
            raise ProtocolError(
                f"{len(inflater.unused_data)} bytes of garbage after the end of the deflate stream",
                ErrorCode.PROTOCOL,
            )
        return out

    def __repr__(self) -> str:
        return "DeflateDecompressor()"


_DEFAULT_DECOMPRESSOR = DeflateDecompressor()


def inflate(data: bytes, limit: int, decompressor: Decompressor | None = None) -> bytes:
    """Inflate a raw DEFLATE payload to at most ``limit`` bytes.

    Raises :class:`ProtocolError` with ``ErrorCode.TOO_LARGE`` when the output would exceed
    ``limit`` and ``ErrorCode.PROTOCOL`` when the data is corrupt, truncated or followed by
    garbage.
    """
    return (decompressor or _DEFAULT_DECOMPRESSOR).decompress(data, limit)


@dataclass
class CompressionStats:
    """What compression did.

    ``attempted`` counts payloads at or above their ``compress_at`` (so compressed), split into
    ``kept`` and ``discarded`` by the 50 % rule. ``bytes_in`` is the size of those payloads and
    ``bytes_out`` what was sent for them (the compressed form when kept, the original when
    discarded), so ``bytes_in - bytes_out`` is exactly what the kept compressions saved.
    """

    attempted: int = 0
    kept: int = 0
    discarded: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    @property
    def saved(self) -> int:
        """Bytes not sent thanks to the compressions that were kept."""
        return self.bytes_in - self.bytes_out


class Compression:
    """Applies the compress-at threshold and the 50 % rule with a pluggable compressor."""

    __slots__ = ("compressor", "stats")

    def __init__(self, compressor: Compressor | None = None) -> None:
        self.compressor: Compressor = compressor if compressor is not None else DeflateCompressor()
        self.stats = CompressionStats()

    def maybe_compress(self, payload: bytes, compress_at: int | None) -> tuple[bytes, bool]:
        """Return ``(bytes to send, compressed flag)`` for one payload.

        ``compress_at`` is the topic's threshold; ``None`` means the topic never compresses.
        """
        size = len(payload)
        if compress_at is None or size < compress_at:
            return payload, False
        compressed = self.compressor.compress(payload)
        stats = self.stats
        stats.attempted += 1
        stats.bytes_in += size
        # Integer form of "compressed is at most half the original": no rounding at odd sizes.
        if 2 * len(compressed) <= size:
            stats.kept += 1
            stats.bytes_out += len(compressed)
            return compressed, True
        stats.discarded += 1
        stats.bytes_out += size
        return payload, False

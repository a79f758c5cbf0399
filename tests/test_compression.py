"""Tests of rubris_asgi.protocol.deflate: raw DEFLATE, the 50 % rule and bomb-proof inflation."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zlib_ng import zlib_ng

from rubris_asgi.errors import ErrorCode, ProtocolError
from rubris_asgi.protocol.deflate import (
    Compression,
    CompressionStats,
    Compressor,
    Decompressor,
    DeflateCompressor,
    DeflateDecompressor,
    inflate,
)

MiB = 1024 * 1024


class FixedSizeCompressor:
    """Returns ``size`` bytes whatever the input, to put the 50 % rule exactly where we want."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls: list[bytes] = []

    def compress(self, data: bytes) -> bytes:
        self.calls.append(data)
        return b"c" * self.size


def raw_deflate(data: bytes, level: int = 1) -> bytes:
    c = zlib_ng.compressobj(level, zlib_ng.DEFLATED, -15)
    return c.compress(data) + c.flush()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    # 100 MiB of zeros compressed chunk by chunk, so the test itself never holds 100 MiB.
    c = zlib_ng.compressobj(9, zlib_ng.DEFLATED, -15)
    chunk = bytes(MiB)
    parts = [c.compress(chunk) for _ in range(100)]
    parts.append(c.flush())
    return b"".join(parts)


# --- compressor / decompressor ---------------------------------------------------------------


@given(st.binary(max_size=4096))
def test_round_trip(data: bytes) -> None:
    compressed = DeflateCompressor().compress(data)
    assert inflate(compressed, len(data)) == data


@given(st.binary(max_size=2048), st.integers(min_value=0, max_value=9))
def test_round_trip_any_level(data: bytes, level: int) -> None:
    assert inflate(DeflateCompressor(level).compress(data), 2048) == data


def test_output_is_raw_deflate_without_header() -> None:
    data = b'{"price": 101.25, "symbol": "ABC"}' * 50
    compressed = DeflateCompressor().compress(data)
    # Raw DEFLATE inflates with wbits=-15 only; a zlib header would make the plain call succeed.
    assert zlib_ng.decompress(compressed, -15) == data
    with pytest.raises(zlib_ng.error):  # type: ignore[call-overload]  # stub types it as an instance
        zlib_ng.decompress(compressed, 15)


def test_level_one_by_default() -> None:
    assert DeflateCompressor().level == 1
    data = b"abcdefgh" * 1000
    assert DeflateCompressor().compress(data) == zlib_ng.compress(data, 1, -15)


@pytest.mark.parametrize("level", [-2, 10, True, 1.0])
def test_bad_level_refused(level: object) -> None:
    with pytest.raises(ValueError, match="level"):
        DeflateCompressor(level)  # type: ignore[arg-type]


def test_protocols_are_runtime_checkable() -> None:
    assert isinstance(DeflateCompressor(), Compressor)
    assert isinstance(DeflateDecompressor(), Decompressor)
    assert isinstance(FixedSizeCompressor(1), Compressor)
    assert not isinstance(object(), Compressor)


# --- limits ----------------------------------------------------------------------------------


def test_exactly_limit_accepted_and_limit_plus_one_refused() -> None:
    data = bytes(range(256)) * 40
    compressed = raw_deflate(data)
    assert inflate(compressed, len(data)) == data
    assert inflate(compressed, len(data) + 1) == data
    with pytest.raises(ProtocolError) as err:
        inflate(compressed, len(data) - 1)
    assert err.value.code is ErrorCode.TOO_LARGE


def test_empty_payload_with_zero_limit() -> None:
    assert inflate(raw_deflate(b""), 0) == b""
    with pytest.raises(ProtocolError) as err:
        inflate(raw_deflate(b"x"), 0)
    assert err.value.code is ErrorCode.TOO_LARGE


def test_negative_limit_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        inflate(raw_deflate(b"x"), -1)


@pytest.mark.parametrize("limit", [0, 64 * 1024, MiB])
def test_deflate_bomb_refused_without_allocating_it(bomb: bytes, limit: int) -> None:
    assert len(bomb) < 200 * 1024  # ~100 KiB that would inflate to 100 MiB
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError) as err:
            inflate(bomb, limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.code is ErrorCode.TOO_LARGE
    # Bounded by the limit (plus zlib's state and bookkeeping), nowhere near 100 MiB.
    assert peak < limit + MiB, f"peak allocation {peak} bytes"


def test_bomb_really_is_a_bomb(bomb: bytes) -> None:
    # Inflated in bounded steps to prove the fixture expands to 100 MiB.
    d = zlib_ng.decompressobj(-15)
    total = 0
    data = bomb
    while not d.eof:
        total += len(d.decompress(data, 8 * MiB))
        data = d.unconsumed_tail
    assert total == 100 * MiB


# --- corrupt data ----------------------------------------------------------------------------


def test_truncated_stream_refused() -> None:
    compressed = raw_deflate(bytes(range(256)) * 40)
    for cut in (1, len(compressed) // 2, len(compressed) - 1):
        with pytest.raises(ProtocolError) as err:
            inflate(compressed[:cut], MiB)
        assert err.value.code is ErrorCode.PROTOCOL


def test_empty_input_is_truncated() -> None:
    with pytest.raises(ProtocolError) as err:
        inflate(b"", MiB)
    assert err.value.code is ErrorCode.PROTOCOL


def test_trailing_garbage_refused() -> None:
    compressed = raw_deflate(b"hello world")
    with pytest.raises(ProtocolError, match="garbage") as err:
        inflate(compressed + b"\x00junk", MiB)
    assert err.value.code is ErrorCode.PROTOCOL


def test_invalid_block_type_refused() -> None:
    # BFINAL=1, BTYPE=11 (reserved): a zlib error, reported as a protocol error.
    with pytest.raises(ProtocolError) as err:
        inflate(b"\x07\x00\x00", MiB)
    assert err.value.code is ErrorCode.PROTOCOL


def test_zlib_wrapped_data_refused() -> None:
    with pytest.raises(ProtocolError) as err:
        inflate(zlib_ng.compress(b"hello world" * 10, 1, 15), MiB)
    assert err.value.code is ErrorCode.PROTOCOL


@settings(max_examples=300)
@given(st.binary(max_size=512), st.integers(min_value=0, max_value=4096))
def test_random_bytes_only_raise_protocol_error(data: bytes, limit: int) -> None:
    try:
        out = inflate(data, limit)
    except ProtocolError as err:
        assert err.code in (ErrorCode.PROTOCOL, ErrorCode.TOO_LARGE)
    else:
        assert len(out) <= limit


@given(st.binary(min_size=1, max_size=1024), st.data())
def test_mutated_streams_only_raise_protocol_error(payload: bytes, data: st.DataObject) -> None:
    compressed = bytearray(raw_deflate(payload))
    i = data.draw(st.integers(min_value=0, max_value=len(compressed) - 1))
    compressed[i] ^= data.draw(st.integers(min_value=1, max_value=255))
    try:
        out = inflate(bytes(compressed), 2048)
    except ProtocolError:
        pass
    else:
        assert len(out) <= 2048


def test_pluggable_decompressor_used() -> None:
    class Upper:
        def decompress(self, data: bytes, limit: int) -> bytes:
            return data.upper()[:limit]

    assert inflate(b"abc", 2, Upper()) == b"AB"


# --- Compression: threshold and the 50 % rule ------------------------------------------------


@pytest.mark.parametrize(
    ("payload_len", "compressed_len", "kept"),
    [
        (100, 50, True),  # exactly half: kept
        (100, 51, False),  # half + 1: discarded
        (101, 50, True),  # 100 <= 101
        (101, 51, False),  # 102 > 101
        (100, 0, True),
        (100, 100, False),
        (100, 150, False),  # compression that grows is discarded too
    ],
)
def test_fifty_percent_rule_boundary(payload_len: int, compressed_len: int, kept: bool) -> None:
    comp = Compression(FixedSizeCompressor(compressed_len))
    payload = b"p" * payload_len
    out, flag = comp.maybe_compress(payload, 1)
    assert flag is kept
    if kept:
        assert out == b"c" * compressed_len
    else:
        assert out is payload


def test_below_compress_at_never_compressed() -> None:
    fake = FixedSizeCompressor(1)
    comp = Compression(fake)
    payload = b"x" * 99
    assert comp.maybe_compress(payload, 100) == (payload, False)
    assert fake.calls == []
    assert comp.stats == CompressionStats()
    # At the threshold it is tried.
    assert comp.maybe_compress(b"x" * 100, 100) == (b"c", True)
    assert fake.calls == [b"x" * 100]


def test_compress_at_none_never_compresses() -> None:
    fake = FixedSizeCompressor(1)
    comp = Compression(fake)
    payload = b"x" * 1_000_000
    out, flag = comp.maybe_compress(payload, None)
    assert out is payload and flag is False
    assert fake.calls == []
    assert comp.stats.attempted == 0


def test_pluggable_compressor_used() -> None:
    fake = FixedSizeCompressor(3)
    comp = Compression(fake)
    assert comp.compressor is fake
    assert comp.maybe_compress(b"hello world", 0) == (b"ccc", True)
    assert fake.calls == [b"hello world"]


def test_default_compressor_is_deflate_level_one() -> None:
    comp = Compression()
    assert isinstance(comp.compressor, DeflateCompressor)
    payload = b'{"symbol": "ABC", "bid": 1.0, "ask": 1.5}' * 100
    out, flag = comp.maybe_compress(payload, 1024)
    assert flag is True
    assert inflate(out, len(payload)) == payload


def test_incompressible_payload_sent_as_is() -> None:
    payload = bytes(range(256))  # no repetition within 256 bytes
    comp = Compression()
    out, flag = comp.maybe_compress(payload, 0)
    assert out is payload and flag is False
    assert comp.stats.discarded == 1


def test_stats_counted() -> None:
    comp = Compression(FixedSizeCompressor(40))
    comp.maybe_compress(b"a" * 100, 50)  # kept: 100 -> 40
    comp.maybe_compress(b"b" * 60, 50)  # discarded: 80 > 60
    comp.maybe_compress(b"c" * 10, 50)  # below threshold: not attempted
    comp.maybe_compress(b"d" * 500, None)  # never
    comp.maybe_compress(b"e" * 80, 50)  # kept: 80 -> 40
    s = comp.stats
    assert (s.attempted, s.kept, s.discarded) == (3, 2, 1)
    assert s.bytes_in == 100 + 60 + 80
    assert s.bytes_out == 40 + 60 + 40
    assert s.saved == (100 - 40) + (80 - 40)

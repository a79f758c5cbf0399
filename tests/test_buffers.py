"""Tests of rubris_asgi.engine.buffers: size classes, bounded leases and their accounting."""

from __future__ import annotations

import pytest

from rubris_asgi.engine.buffers import FrameBuffer, PoolConfig, PoolStats, SizeClass, WriterPool
from rubris_asgi.errors import ErrorCode, MessageTooLarge

KiB = 1024
MiB = 1024 * KiB


def small_pool(**kw: int) -> WriterPool:
    # block 1000, large 4000, max 16000 unless overridden
    args = {"block_size": 1000, "blocks": 2, "large_blocks": 2, "unpooled": 2} | kw
    return WriterPool(PoolConfig(**args))


# --- config ----------------------------------------------------------------------------------


def test_default_config_matches_the_source_document() -> None:
    c = PoolConfig()
    assert c.block_size == 256 * KiB
    assert c.large_size == 1 * MiB
    assert c.max_size == 4 * MiB
    assert (c.blocks, c.large_blocks, c.unpooled) == (4096, 64, 16)


@pytest.mark.parametrize(
    "field", ["block_size", "large_scale", "max_scale", "blocks", "large_blocks", "unpooled"]
)
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "4"])
def test_config_fields_must_be_positive_ints(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"PoolConfig.{field} must be a positive int"):
        PoolConfig(**{field: value})  # type: ignore[arg-type]


def test_config_max_scale_not_below_large_scale() -> None:
    with pytest.raises(ValueError, match="max_scale"):
        PoolConfig(large_scale=4, max_scale=3)
    c = PoolConfig(large_scale=4, max_scale=4)
    assert c.max_size == c.large_size


def test_config_is_frozen() -> None:
    c = PoolConfig()
    with pytest.raises(AttributeError):
        c.blocks = 1  # type: ignore[misc]


# --- size classes ----------------------------------------------------------------------------


def test_default_pool_paths() -> None:
    pool = WriterPool()
    assert pool.config == PoolConfig()
    cases = [
        (0, SizeClass.BLOCK, 256 * KiB),
        (1, SizeClass.BLOCK, 256 * KiB),
        (256 * KiB, SizeClass.BLOCK, 256 * KiB),
        (256 * KiB + 1, SizeClass.LARGE, 1 * MiB),
        (1 * MiB, SizeClass.LARGE, 1 * MiB),
        (1 * MiB + 1, SizeClass.UNPOOLED, 2 * MiB),
        (2 * MiB, SizeClass.UNPOOLED, 2 * MiB),
        (2 * MiB + 1, SizeClass.UNPOOLED, 4 * MiB),
        (4 * MiB, SizeClass.UNPOOLED, 4 * MiB),  # exactly the maximum is accepted
    ]
    for first, size_class, capacity in cases:
        buf = pool.acquire(first)
        assert buf is not None, first
        assert (buf.size_class, buf.capacity) == (size_class, capacity), first
        assert buf.fits(first)
        pool.release(buf)


def test_maximum_plus_one_refused() -> None:
    pool = WriterPool()
    with pytest.raises(MessageTooLarge) as err:
        pool.acquire(4 * MiB + 1)
    assert err.value.code is ErrorCode.TOO_LARGE
    assert pool.stats.refused == 1
    assert pool.stats.unpooled == 0 and pool.stats.in_use_unpooled == 0


def test_unpooled_grows_by_doubling_up_to_the_maximum() -> None:
    pool = WriterPool(PoolConfig(block_size=100, large_scale=2, max_scale=32))
    # large 200, then 400, 800, 1600, 3200 (= max)
    expected = {201: 400, 400: 400, 401: 800, 800: 800, 801: 1600, 1601: 3200, 3200: 3200}
    for first, capacity in expected.items():
        buf = pool.acquire(first)
        assert buf is not None
        assert (buf.size_class, buf.capacity) == (SizeClass.UNPOOLED, capacity)
        pool.release(buf)


def test_unpooled_capacity_capped_at_the_maximum() -> None:
    # max_scale 6 is not large_scale * 2**k: the doubling would give 8000, the cap gives 6000.
    pool = small_pool(large_scale=4, max_scale=6)
    buf = pool.acquire(4001)
    assert buf is not None
    assert buf.capacity == 6000
    pool.release(buf)
    buf = pool.acquire(6000)
    assert buf is not None and buf.capacity == 6000
    with pytest.raises(MessageTooLarge):
        pool.acquire(6001)


def test_large_scale_one_has_no_large_path() -> None:
    pool = small_pool(large_scale=1, max_scale=4)
    block = pool.acquire(1000)
    unpooled = pool.acquire(1001)
    assert block is not None and block.size_class is SizeClass.BLOCK
    assert unpooled is not None and unpooled.size_class is SizeClass.UNPOOLED
    assert unpooled.capacity == 2000
    assert pool.stats.large == 0


def test_negative_size_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        WriterPool().acquire(-1)


def test_check_size() -> None:
    pool = small_pool()
    pool.check_size(0)
    pool.check_size(16000)
    assert pool.stats.refused == 0
    with pytest.raises(MessageTooLarge, match="16001"):
        pool.check_size(16001)
    assert pool.stats.refused == 1


# --- frame buffer ----------------------------------------------------------------------------


def test_frame_buffer_fills_to_capacity() -> None:
    buf = FrameBuffer(SizeClass.BLOCK, 10)
    assert buf.fits(10) and not buf.fits(11)
    buf.size = 4
    assert buf.fits(6) and not buf.fits(7)
    buf.size = 10
    assert buf.fits(0) and not buf.fits(1)


def test_frame_buffer_has_slots() -> None:
    buf = FrameBuffer(SizeClass.BLOCK, 10)
    with pytest.raises(AttributeError):
        buf.other = 1  # type: ignore[attr-defined]


# --- leases ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "in_use"),
    [(1, "in_use_block"), (1001, "in_use_large"), (4001, "in_use_unpooled")],
)
def test_exhaustion_returns_none_and_recovers_after_release(first: int, in_use: str) -> None:
    pool = small_pool()
    a = pool.acquire(first)
    b = pool.acquire(first)
    assert a is not None and b is not None
    assert getattr(pool.stats, in_use) == 2
    assert pool.acquire(first) is None
    assert pool.acquire(first) is None
    assert pool.stats.exhausted == 2
    pool.release(a)
    assert getattr(pool.stats, in_use) == 1
    c = pool.acquire(first)
    assert c is not None
    assert getattr(pool.stats, in_use) == 2
    pool.release(b)
    pool.release(c)
    assert getattr(pool.stats, in_use) == 0


def test_classes_are_bounded_independently() -> None:
    pool = small_pool(blocks=1, large_blocks=1, unpooled=1)
    block = pool.acquire(10)
    assert block is not None
    assert pool.acquire(10) is None
    # Other classes still have leases although blocks are exhausted.
    large = pool.acquire(2000)
    unpooled = pool.acquire(5000)
    assert large is not None and unpooled is not None
    assert pool.acquire(2000) is None
    assert pool.acquire(5000) is None
    assert pool.stats.exhausted == 3


def test_too_large_refused_even_when_unpooled_exhausted() -> None:
    pool = small_pool(unpooled=1)
    assert pool.acquire(5000) is not None
    assert pool.acquire(5000) is None
    with pytest.raises(MessageTooLarge):
        pool.acquire(16001)
    assert (pool.stats.exhausted, pool.stats.refused) == (1, 1)


def test_double_release_is_harmless() -> None:
    pool = small_pool(blocks=1)
    buf = pool.acquire(10)
    assert buf is not None
    pool.release(buf)
    pool.release(buf)
    assert pool.stats.in_use_block == 0
    held = pool.acquire(10)
    assert held is not None
    pool.release(buf)  # the stale buffer must not free the lease now held by another frame
    assert pool.stats.in_use_block == 1
    assert pool.acquire(10) is None


def test_a_shared_lease_returns_when_its_last_holder_releases_it() -> None:
    pool = small_pool(blocks=1)
    buf = pool.acquire(10)
    assert buf is not None
    pool.share(buf)
    pool.share(buf)  # three sessions' writes of the same bytes: one lease
    assert (buf.holders, pool.stats.in_use_block, pool.stats.shared) == (3, 1, 2)
    pool.release(buf)
    pool.release(buf)
    assert pool.stats.in_use_block == 1 and not buf.released
    assert pool.acquire(10) is None  # still held by the third write
    pool.release(buf)
    assert buf.released and pool.stats.in_use_block == 0
    pool.release(buf)  # a returned lease: nothing happens
    assert pool.stats.in_use_block == 0 and buf.holders == 0


def test_room_is_what_a_lease_would_give_and_take_takes_it() -> None:
    pool = small_pool(blocks=1, large_blocks=1, unpooled=1)
    assert pool.room(10) == 1000  # a block's size: later messages may join the frame
    assert pool.room(2000) == 2000  # larger first messages go alone
    assert pool.room(5000) == 5000
    for first in (10, 2000, 5000):
        pool.take(first)
    assert (pool.room(10), pool.room(2000), pool.room(5000)) == (0, 0, 0)
    assert pool.stats.exhausted == 3
    with pytest.raises(MessageTooLarge):
        pool.room(16001)


def test_stats_and_peaks() -> None:
    pool = small_pool(blocks=3, large_blocks=3, unpooled=3)
    blocks = [pool.acquire(100) for _ in range(3)]
    larges = [pool.acquire(2000) for _ in range(2)]
    unpooled = [pool.acquire(9000)]
    for buf in blocks[:2] + larges:
        assert buf is not None
        pool.release(buf)
    again = pool.acquire(100)
    assert again is not None
    with pytest.raises(MessageTooLarge):
        pool.acquire(20000)
    assert pool.acquire(200) is not None  # blocks: 2 held before this, 3 after
    assert pool.acquire(300) is None
    assert pool.stats == PoolStats(
        block=5,
        large=2,
        unpooled=1,
        refused=1,
        exhausted=1,
        in_use_block=3,
        in_use_large=0,
        in_use_unpooled=1,
        peak_block=3,
        peak_large=2,
    )
    assert unpooled[0] is not None and unpooled[0].capacity == 16000


def test_in_flight_bytes_are_bounded() -> None:
    config = PoolConfig(block_size=1000, blocks=5, large_blocks=3, unpooled=2)
    pool = WriterPool(config)
    held: list[FrameBuffer] = []
    for first in [1, 999, 1000, 1001, 3999, 4000, 4001, 16000] * 10:
        buf = pool.acquire(first)
        if buf is not None:
            held.append(buf)
    bound = (
        config.blocks * config.block_size
        + config.large_blocks * config.large_size
        + config.unpooled * config.max_size
    )
    assert sum(b.capacity for b in held) <= bound
    assert len(held) == 5 + 3 + 2

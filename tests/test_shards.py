"""The sans-IO parts of rubris on a Redis Cluster (rubris_asgi/cluster/redis/shards/): the
partitions and their tags, the ``redis+cluster://`` URL, the slot map and its redirects."""

from __future__ import annotations

import binascii
import zlib

import pytest

from rubris_asgi.cluster.redis.shards.address import ClusterTarget, cluster_url, is_cluster_url
from rubris_asgi.cluster.redis.shards.partitions import (
    MAX_PARTITIONS,
    PARTITIONS,
    SLOTS,
    key_slot,
    middle_half,
    partition_of,
    prefix,
    slot_of_partition,
    slot_range,
    tag,
)
from rubris_asgi.cluster.redis.shards.slotmap import (
    Redirect,
    SlotMap,
    from_shards,
    from_slots,
    redirect_of,
)

pytestmark = pytest.mark.core


def test_key_slot_is_redis_s() -> None:
    # values Redis gives (CLUSTER KEYSLOT), and the hash-tag rules of its keyHashSlot
    assert key_slot("foo") == 12182
    assert key_slot("bar") == 5061
    assert key_slot("123456789") == 0x31C3  # the CRC16-XMODEM check value, below 16384
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers")
    assert key_slot("{user1000}.following") == key_slot("user1000")
    assert key_slot("foo{}{bar}") == binascii.crc_hqx(b"foo{}{bar}", 0) % SLOTS  # "{}": whole
    assert key_slot("foo{}{bar}") != key_slot("bar")
    assert key_slot("foo{{bar}}zap") == key_slot("{bar")  # the first "{" to the next "}"
    assert key_slot("foo{bar}{zap}") == key_slot("bar")
    assert key_slot("no{brace") == key_slot(b"no{brace")


def test_key_slot_agrees_with_redis_py() -> None:
    crc = pytest.importorskip("redis.crc")
    for key in ["", "a", "{", "}", "{}", "x{y}z", "rubris:{rb.5.2}:t:prices", "é{ü}"]:
        assert key_slot(key) == crc.key_slot(key.encode()), key


def test_each_tag_s_slot_is_in_the_middle_half_of_its_range() -> None:
    for count in (1, 3, 16, PARTITIONS, 100):
        for i in range(count):
            r, middle = slot_range(i, count), middle_half(i, count)
            assert len(middle) == len(r) - 2 * (len(r) // 4)
            assert middle.start >= r.start and middle.stop <= r.stop
            t = tag(i, count)
            assert t.startswith(f"rb.{i}.")
            assert slot_of_partition(i, count) == key_slot(t) in middle
            # the first such k: none before it qualifies
            k = int(t.rsplit(".", 1)[1])
            assert all(key_slot(f"rb.{i}.{j}") not in middle for j in range(k))


def test_ranges_cover_every_slot_once() -> None:
    covered = [s for i in range(PARTITIONS) for s in slot_range(i)]
    assert covered == list(range(SLOTS))


def _spread(masters: int, count: int = PARTITIONS) -> list[int]:
    """Partitions per master when the slots are split as redis-cli does (equal contiguous
    ranges: master m has [m*16384//n, (m+1)*16384//n) up to rounding)."""
    bounds = [m * SLOTS // masters for m in range(masters + 1)]
    counts = [0] * masters
    for i in range(count):
        s = slot_of_partition(i, count)
        counts[next(m for m in range(masters) if bounds[m] <= s < bounds[m + 1])] += 1
    return counts


def test_partitions_spread_evenly_over_masters() -> None:
    assert _spread(2) == [32, 32]
    assert _spread(3) == [21, 22, 21]
    # redis-cli's own split of 3 masters: 0-5460, 5461-10922, 10923-16383
    slots = [slot_of_partition(i) for i in range(PARTITIONS)]
    assert [
        sum(1 for s in slots if lo <= s <= hi)
        for lo, hi in ((0, 5460), (5461, 10922), (10923, 16383))
    ] == [21, 22, 21]
    for masters in range(1, 17):
        counts = _spread(masters)
        assert sum(counts) == PARTITIONS
        # up to 8 masters no master has more than one partition above another; a boundary
        # that falls in a range's middle half may go either way: 9 and 13 masters get 2
        assert max(counts) - min(counts) <= (1 if masters <= 8 else 2), (masters, counts)
    assert [max(c) - min(c) for c in map(_spread, (9, 13))] == [2, 2]


def test_prefix_puts_every_key_of_a_partition_in_its_slot() -> None:
    assert prefix("rubris:", 5) == "rubris:{" + tag(5) + "}:"
    for i in range(PARTITIONS):
        p = prefix("rubris:", i)
        for suffix in ("t:prices.AAPL", "r:x", "c:{odd}", "b:123", ""):
            assert key_slot(p + suffix) == slot_of_partition(i)
    with pytest.raises(ValueError, match="holds a"):
        prefix("app{1}:", 0)


def test_partition_of_is_stable_and_in_range() -> None:
    names = [f"prices.{i}" for i in range(2000)] + ["", "é", "queue:jobs"]
    for name in names:
        p = partition_of(name)
        assert 0 <= p < PARTITIONS
        assert p == zlib.crc32(name.encode()) % PARTITIONS  # the same in every process
    assert partition_of("prices.AAPL") == 21  # pinned: a change would move every topic
    counts = [0] * PARTITIONS
    for name in names[:2000]:
        counts[partition_of(name)] += 1
    assert min(counts) > 0.5 * 2000 / PARTITIONS  # spread, roughly evenly
    assert partition_of("x", 7) < 7


def test_partition_counts_are_checked() -> None:
    for bad in (0, MAX_PARTITIONS + 1):
        with pytest.raises(ValueError):
            tag(0, bad)
    with pytest.raises(ValueError):
        tag(PARTITIONS)
    with pytest.raises(ValueError):
        partition_of("x", 0)


def test_cluster_url() -> None:
    assert is_cluster_url("redis+cluster://h:1") and not is_cluster_url("redis://h:1")
    assert cluster_url("redis+cluster://127.0.0.1:7000") == ClusterTarget((("127.0.0.1", 7000),))
    t = cluster_url(
        "redis+cluster://us%40r:p%3Ass@a:7000,b,[::1]:7002/?socket_timeout=2.5&max_connections=8"
    )
    assert t.seeds == (("a", 7000), ("b", 6379), ("::1", 7002))
    assert (t.username, t.password) == ("us@r", "p:ss")
    assert t.options == {"socket_timeout": 2.5, "max_connections": 8}
    assert cluster_url("redis+cluster://secret@a:1").password == "secret"
    assert cluster_url("redis+cluster://:secret@a:1").username is None


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis://a:1", "not a redis\\+cluster"),
        ("redis+cluster://", "names no node"),
        ("redis+cluster://a:x", "is not a port"),
        ("redis+cluster://a:70000", "is not a port"),
        ("redis+cluster://a:1/2", "no database"),
        ("redis+cluster://a:1?db=2", "unknown option 'db'"),
        ("redis+cluster://a:1?socket_timeout=soon", "must be float"),
        ("redis+cluster://a:1?max_connections=0", "must be positive"),
    ],
)
def test_cluster_url_refuses(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        cluster_url(url)


def test_cluster_url_errors_hide_the_password() -> None:
    with pytest.raises(ValueError) as e:
        cluster_url("redis+cluster://u:hunter2@a:1/3")
    assert "hunter2" not in str(e.value)


def test_redirect_of() -> None:
    assert redirect_of("MOVED", "MOVED 3999 127.0.0.1:6381") == Redirect(
        "MOVED", 3999, ("127.0.0.1", 6381)
    )
    assert redirect_of("ASK", "3999 127.0.0.1:6381") == Redirect("ASK", 3999, ("127.0.0.1", 6381))
    assert redirect_of("MOVED", "1 [::1]:7000") == Redirect("MOVED", 1, ("::1", 7000))
    assert redirect_of("MOVED", "1 :7000") == Redirect("MOVED", 1, ("", 7000))  # host unknown
    for bad in ("", "MOVED", "x 127.0.0.1:1", "1 127.0.0.1", "16384 h:1", "1 h:p"):
        assert redirect_of("MOVED", bad) is None, bad


def _shard(slots: list[int], *nodes: tuple[str, int, str, str]) -> list[object]:
    """A shard as CLUSTER SHARDS answers it in RESP2: flat lists of names and values."""
    return [
        b"slots",
        slots,
        b"nodes",
        [
            [
                b"id",
                b"x",
                b"port",
                port,
                b"ip",
                host.encode(),
                b"endpoint",
                host.encode(),
                b"role",
                role.encode(),
                b"health",
                health.encode(),
            ]
            for host, port, role, health in nodes
        ],
    ]


def test_slot_map_from_cluster_shards() -> None:
    reply = [
        _shard(
            [0, 8191],
            ("10.0.0.1", 7000, "master", "online"),
            ("10.0.0.2", 7001, "replica", "online"),
        ),
        # a failover seen mid-way: the failed master still listed as one
        _shard(
            [8192, 9000, 9002, 16383],
            ("10.0.0.3", 7002, "master", "fail"),
            ("10.0.0.4", 7003, "master", "online"),
        ),
    ]
    m = from_shards(reply, ("10.0.0.9", 7000))
    assert m.owner(0) == m.owner(8191) == ("10.0.0.1", 7000)
    assert m.owner(8192) == m.owner(16383) == ("10.0.0.4", 7003)
    assert m.owner(9001) is None and m.covered == SLOTS - 1
    assert m.masters == {("10.0.0.1", 7000), ("10.0.0.4", 7003)}
    assert ("10.0.0.2", 7001) in m.nodes and ("10.0.0.3", 7002) in m.nodes
    # RESP3 gives maps; a node without endpoint or ip is the node asked
    resp3 = [
        {
            b"slots": [0, 16383],
            b"nodes": [{b"port": 7000, b"endpoint": b"?", b"ip": b"", b"role": b"master"}],
        }
    ]
    m3 = from_shards(resp3, ("asked", 7000))
    assert m3.owner(5) == ("asked", 7000) and m3.covered == SLOTS


def test_slot_map_from_cluster_slots_and_moved() -> None:
    reply = [
        [0, 5460, [b"127.0.0.1", 7000, b"id1"], [b"127.0.0.1", 7003, b"id4"]],
        [5461, 16383, [b"", 7001, b"id2"]],
    ]
    m = from_slots(reply, ("127.0.0.1", 7001))
    assert m.owner(5460) == ("127.0.0.1", 7000)
    assert m.owner(5461) == ("127.0.0.1", 7001)  # the empty host: the node asked
    assert ("127.0.0.1", 7003) in m.nodes and ("127.0.0.1", 7003) not in m.masters
    assert m.moved(10, ("127.0.0.1", 7001)) and not m.moved(10, ("127.0.0.1", 7001))
    assert m.owner(10) == ("127.0.0.1", 7001) and m.owner(11) == ("127.0.0.1", 7000)
    assert 10 in m.slots_of(("127.0.0.1", 7001))
    empty = SlotMap()
    assert empty.owner(0) is None and not empty.masters and empty.covered == 0


def test_answers_read_both_redis_py_forms() -> None:
    pytest.importorskip("redis")
    from redis.exceptions import MovedError, NoScriptError, ResponseError, TryAgainError

    from rubris_asgi.cluster.redis.nodes import REFUSING
    from rubris_asgi.cluster.redis.shards.answers import (
        ASK,
        CLUSTERDOWN,
        MOVED,
        NOSCRIPT,
        TRYAGAIN,
        SlotsRefused,
        kind_of,
        redirect,
        refusal,
    )

    here = ("10.0.0.1", 7000)
    # redis-py 5 on a plain connection: the whole text in a ResponseError
    plain = ResponseError("MOVED 3999 :6381")
    assert kind_of(plain) == MOVED
    assert redirect(plain, MOVED, here) == Redirect("MOVED", 3999, ("10.0.0.1", 6381))
    assert kind_of(ResponseError("ASK 1 h:2")) == ASK
    assert kind_of(ResponseError("TRYAGAIN Multiple keys request during rehashing")) == TRYAGAIN
    assert kind_of(ResponseError("CLUSTERDOWN Hash slot not served")) == CLUSTERDOWN
    assert kind_of(NoScriptError("No matching script")) == NOSCRIPT
    assert kind_of(ResponseError("ERR unknown command")) is None
    assert kind_of(b"MOVED 1 h:2") is None  # a value, not an error
    # redis-py 8 subclasses, the code stripped from the text (in 5 these classes exist too)
    try:
        moved = MovedError("3999 127.0.0.1:6381")
    except TypeError:  # pragma: no cover (a redis-py whose MovedError takes other arguments)
        moved = None
    if moved is not None:
        assert kind_of(moved) == MOVED
        assert redirect(moved, MOVED, here) == Redirect("MOVED", 3999, ("127.0.0.1", 6381))
    # what stands after the retries is one of REFUSING in every redis-py
    for text, kind in (("TRYAGAIN x", TRYAGAIN), ("CLUSTERDOWN y", CLUSTERDOWN)):
        raised = refusal(ResponseError(text), kind)
        assert isinstance(raised, REFUSING), raised
        assert str(raised).startswith(kind)
    assert isinstance(refusal(TryAgainError("x"), TRYAGAIN), TryAgainError)
    assert str(refusal(TryAgainError("x"), TRYAGAIN)) == "x"
    assert kind_of(SlotsRefused("CLUSTERDOWN z")) == CLUSTERDOWN

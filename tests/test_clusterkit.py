"""tests/clusterkit.py's RedisCluster does what the cluster tests will lean on: a real cluster
whose slots are all served, keys where their slot says, a slot moved under a writer's load
with nothing lost, a master restarted with its keys."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis as redis_sync
import redis.asyncio.cluster
from redis.crc import key_slot

from .clusterkit import SLOTS, RedisCluster

pytestmark = pytest.mark.redis  # real redis-servers, in cluster mode


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    """One 3-master cluster for the module (its slot map changes as the tests move slots)."""
    with RedisCluster() as c:
        yield c


@pytest.fixture
def rc(cluster: RedisCluster) -> Iterator[RedisCluster]:
    """The module's cluster, emptied."""
    cluster.flush()
    yield cluster


def _direct(port: int) -> redis_sync.Redis:
    return redis_sync.Redis(port=port, socket_timeout=5)


def _count_in_slot(port: int, slot: int) -> int:
    r = _direct(port)
    try:
        return int(r.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
    finally:
        r.close()


def test_three_masters_cover_every_slot(rc: RedisCluster) -> None:
    masters = rc.masters()
    assert len(masters) == 3
    assert len(rc.startup_nodes) == 3 and len(rc.urls) == 3
    owned = sorted(s for m in masters for s in m.slot_list())
    assert owned == list(range(SLOTS))  # every slot, each once
    for port in rc.ports:
        info = rc.cluster_info(port)
        assert info["cluster_state"] == "ok"
        assert info["cluster_known_nodes"] == "3"
        assert info["cluster_slots_ok"] == str(SLOTS)


def test_keys_land_on_the_node_of_their_slot(rc: RedisCluster) -> None:
    client = rc.client()
    try:
        keys = [f"key:{i}" for i in range(500)]
        for key in keys:
            client.set(key, key)
    finally:
        client.close()
    masters = rc.masters()
    for master in masters:
        mine = [k for k in keys if master.owns(key_slot(k.encode()))]
        assert mine, "500 keys spread over 3 masters give each some"
        r = _direct(master.port)
        try:
            assert r.dbsize() == len(mine)
            assert r.mget(mine[:1]) == [mine[0].encode()]  # served by it, not redirected
        finally:
            r.close()
    assert rc.node_for_slot(key_slot(b"key:0")).owns(key_slot(b"key:0"))


def test_migrate_slot_under_load_loses_nothing(rc: RedisCluster) -> None:
    slot = key_slot(b"{load}")
    source = rc.node_for_slot(slot)
    target = next(m for m in rc.masters() if m.port != source.port)
    client = rc.client()
    writer_client = rc.client()
    stop = threading.Event()
    try:
        client.mset({f"{{load}}k{i}": 0 for i in range(1000)})  # one slot: one MSET
        done = {"incr": 0, "set": 0}
        errors: list[BaseException] = []

        def write() -> None:
            # through RedisCluster, which follows ASK (a key already moved) and MOVED (after)
            i = 0
            try:
                while not stop.is_set():
                    writer_client.incr(f"{{load}}k{i % 1000}")
                    done["incr"] += 1
                    writer_client.set(f"{{load}}w{i}", i)
                    done["set"] += 1
                    i += 1
            except BaseException as e:  # reported below
                errors.append(e)

        thread = threading.Thread(target=write, daemon=True)
        thread.start()
        time.sleep(0.2)
        before = done["set"]
        # small batches with pauses: the slot stays half moved long enough for the writer
        moved = rc.migrate_slots([slot], target.port, batch=50, pause=0.02)
        during = done["set"] - before
        time.sleep(0.2)
        stop.set()
        thread.join(10)
        assert not thread.is_alive()
        assert not errors, errors
        assert during > 0, "the writer wrote while the slot moved"
        assert moved >= 1000  # by MIGRATE: every original (keys new meanwhile: written there)
        assert rc.node_for_slot(slot).port == target.port
        assert _count_in_slot(source.port, slot) == 0
        assert _count_in_slot(target.port, slot) == 1000 + done["set"]
        values = client.mget([f"{{load}}k{i}" for i in range(1000)])
        assert sum(int(v) for v in values) == done["incr"]  # not one increment lost
        written = client.mget([f"{{load}}w{i}" for i in range(done["set"])])
        assert written == [str(i).encode() for i in range(done["set"])]
    finally:
        stop.set()  # also when the test fails midway: the writer must not outlive its client
        client.close()
        writer_client.close()


def test_migrate_half_of_a_master(rc: RedisCluster) -> None:
    client = rc.client()
    try:
        for i in range(2000):
            client.set(f"half:{i}", i)
        first, second = rc.masters()[:2]
        slots = rc.migrate_half(first.port, second.port)
        assert len(slots) == first.slot_count // 2
        after = {m.port: m for m in rc.masters()}
        assert after[first.port].slot_count == first.slot_count - len(slots)
        assert after[second.port].slot_count == second.slot_count + len(slots)
        assert all(after[second.port].owns(s) for s in slots)
        moved = set(slots)
        moved_keys = [i for i in range(2000) if key_slot(f"half:{i}".encode()) in moved]
        assert moved_keys, "2,000 keys over 16,384 slots put some in a sixth of them"
        for i in moved_keys:
            assert _count_in_slot(second.port, key_slot(f"half:{i}".encode())) > 0
            assert _count_in_slot(first.port, key_slot(f"half:{i}".encode())) == 0
        for i in range(2000):
            assert client.get(f"half:{i}") == str(i).encode()
    finally:
        client.close()


def test_restart_of_a_master_keeps_its_keys(rc: RedisCluster) -> None:
    client = rc.client()
    try:
        for i in range(300):
            client.set(f"durable:{i}", i)
    finally:
        client.close()
    master = rc.node_for_slot(key_slot(b"durable:0"))
    r = _direct(master.port)
    try:
        keys_before = r.dbsize()
    finally:
        r.close()
    began = time.monotonic()
    rc.restart(master.port)
    assert time.monotonic() - began < 20
    for port in rc.ports:
        assert rc.cluster_info(port)["cluster_state"] == "ok"
    assert rc.node_for_slot(key_slot(b"durable:0")).port == master.port
    r = _direct(master.port)
    try:
        assert r.dbsize() == keys_before  # from its append-only file
    finally:
        r.close()
    client = rc.client()  # a fresh client: the old one's connection to the master is dead
    try:
        assert [client.get(f"durable:{i}") for i in range(300)] == [
            str(i).encode() for i in range(300)
        ]
    finally:
        client.close()


async def test_replicas_from_an_async_test() -> None:
    async with RedisCluster(replicas=1) as c:
        masters = c.masters()
        assert len(masters) == 3 and all(len(m.replicas) == 1 for m in masters)
        assert len(c.ports) == 6
        client = redis.asyncio.cluster.RedisCluster.from_url(c.url)
        try:
            await client.set("replicated", "yes")
        finally:
            await client.aclose()
        master = c.node_for_slot(key_slot(b"replicated"))
        r = _direct(master.port)
        replica = _direct(master.replicas[0])
        try:
            assert r.execute_command("WAIT", 1, 5000) == 1
            replica.execute_command("READONLY")
            assert replica.get("replicated") == b"yes"
        finally:
            r.close()
            replica.close()

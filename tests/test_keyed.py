"""Keyed topics (protocol.md section 5b) as sans-IO rules: the frames the engine builds, and
the table a client folding them holds."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from rubris_asgi.client.table import Table
from rubris_asgi.config import Config, Timing
from rubris_asgi.engine.engine import Engine
from rubris_asgi.engine.keyed.topic import KeyedTopic
from rubris_asgi.errors import TableFull
from rubris_asgi.protocol import Entry, EntryOp, Mode, Subscribed
from rubris_asgi.protocol import patch as merge

from .enginekit import FakeClock, RecordingSink, connect

SET, PATCH, DELETE, RESET, SYNCED = (int(op) for op in EntryOp)


def make(**timing: float) -> tuple[Engine, FakeClock]:
    clock = FakeClock()
    cfg = Config(timing=Timing(**timing)) if timing else Config()
    return Engine(cfg, clock=clock), clock


def table(e: Engine, name: str = "book", **kw: Any) -> KeyedTopic:
    t = e.topic(name, Mode.KEYED, **kw)
    assert isinstance(t, KeyedTopic)
    return t


def run(e: Engine, cycles: int = 20) -> None:
    for _ in range(cycles):
        e.scheduler.run_cycle()


def entries(sink: RecordingSink) -> list[tuple[int, int, str, Any]]:
    """(seq, op, key, decoded payload) of every ENTRY received, in order; taken."""
    out = []
    for frame in sink.take():
        for m in frame:
            if isinstance(m, Entry):
                out.append((m.seq, m.op, m.key, orjson.loads(m.payload) if m.payload else None))
    return out


def fold(t: Table, got: list[tuple[int, int, str, Any]]) -> Table:
    for seq, op, key, value in got:
        t.apply(seq, op, key, value)
    return t


def server_table(t: KeyedTopic) -> dict[str, Any]:
    return {k: orjson.loads(v) for k, v in t.items()}


def test_subscribe_sends_sets_in_seq_order_then_synced() -> None:
    e, _ = make()
    t = table(e)
    e.set_entry(t, "b", {"px": 1})
    e.set_entry(t, "a", {"px": 2})
    e.set_entry(t, "b", {"px": 3})  # b's latest change is now after a's
    s, sink = connect(e)
    e.subscribe(s, t, 7, 0, 0)
    run(e)
    frames = sink.take()
    sub = frames[0][0]
    assert isinstance(sub, Subscribed)
    assert (sub.req, sub.mode, sub.head, sub.recovered) == (7, Mode.KEYED, 3, False)
    got = [(m.seq, m.op, m.key, m.payload) for f in frames for m in f if isinstance(m, Entry)]
    assert got == [(2, SET, "a", b'{"px":2}'), (3, SET, "b", b'{"px":3}'), (3, SYNCED, "", b"")]


def test_a_slow_subscriber_gets_each_key_once_at_its_latest_and_never_older() -> None:
    e, _ = make()
    t = table(e)
    s, sink = connect(e, auto=False)
    e.subscribe(s, t, 1, 0, 0)
    run(e)  # SUBSCRIBED and SYNCED of the empty table, in a frame still being written
    for i in range(50):
        e.set_entry(t, f"k{i % 5}", {"v": i})
    run(e)  # nothing: its write is still under way
    sink.complete()
    sink.take()
    run(e)
    got = entries(sink)
    assert [(k, v["v"]) for _, op, k, v in got] == [(f"k{i}", 45 + i) for i in range(5)]
    assert [seq for seq, *_ in got] == sorted(seq for seq, *_ in got)


def test_patch_goes_to_the_up_to_date_and_set_to_those_behind() -> None:
    e, _ = make()
    t = table(e)
    row = {"price": 101.25, "size": 300, "orders": 4, "venue": "XNAS", "side": "bid"}
    e.set_entry(t, "101.25", row)
    fast, fsink = connect(e)
    slow, ssink = connect(e, auto=False)
    e.subscribe(fast, t, 1, 0, 0)
    e.subscribe(slow, t, 1, 0, 0)
    run(e)
    ssink.complete()
    fsink.take()
    ssink.take()
    e.set_entry(t, "101.25", {**row, "size": 400})  # the slow one has it: PATCH for both
    run(e)
    assert entries(fsink) == [(2, PATCH, "101.25", {"size": 400})]
    assert entries(ssink) == [(2, PATCH, "101.25", {"size": 400})]  # held, not completed
    e.set_entry(t, "101.25", {**row, "size": 500})
    e.set_entry(t, "101.25", {**row, "size": 600})  # two changes in one cycle: the 2nd's
    run(e)  # prev (3) is past what the fast one synced at (2): SET
    assert entries(fsink) == [(4, SET, "101.25", {**row, "size": 600})]
    ssink.complete()
    run(e)
    assert entries(ssink) == [(4, SET, "101.25", {**row, "size": 600})]
    e.set_entry(t, "101.25", {**row, "size": 700})
    run(e)  # both up to date again
    assert entries(fsink) == [(5, PATCH, "101.25", {"size": 700})]
    ssink.complete()
    run(e)
    assert entries(ssink) == [(5, PATCH, "101.25", {"size": 700})]


def test_the_fifty_percent_rule_decides_between_patch_and_set() -> None:
    e, _ = make()
    t = table(e)
    e.set_entry(t, "k", {"a": 1, "b": 2})
    s, sink = connect(e)
    e.subscribe(s, t, 1, 0, 0)
    run(e)
    sink.take()
    e.set_entry(t, "k", {"a": 1, "b": 3})  # patch {"b":3} is 7 bytes of 13: over half
    e.set_entry(t, "x", "text")
    run(e)
    assert [op for _, op, *_ in entries(sink)] == [SET, SET]
    e.set_entry(t, "k", {"a": 1, "b": 3, "name": "a long enough member to make it pay"})
    run(e)
    e.set_entry(t, "k", {"a": 2, "b": 3, "name": "a long enough member to make it pay"})
    run(e)
    got = entries(sink)
    assert [(op, v) for _, op, _, v in got] == [
        (SET, {"a": 1, "b": 3, "name": "a long enough member to make it pay"}),
        (PATCH, {"a": 2}),
    ]


def test_a_patch_that_cannot_say_a_kept_null_is_a_set() -> None:
    assert merge.diff({"a": 1, "b": {"c": 1}}, {"a": 1, "b": {"c": None}}) is None
    assert merge.diff({"a": 1}, {"a": None}) is None
    assert merge.diff({"a": 1, "b": 2}, {"a": 1}) == {"b": None}
    assert merge.diff({"a": 1}, {"a": 1.0}) == {"a": 1.0}
    assert merge.diff({"a": {"x": 1, "y": 2}}, {"a": {"x": 1, "y": 3}}) == {"a": {"y": 3}}
    assert merge.apply({"a": {"x": 1}}, {"a": {"y": None, "z": 2}, "b": None}) == {
        "a": {"x": 1, "z": 2}
    }
    assert merge.apply({"a": 1}, [1, 2]) == [1, 2]


def test_patch_entry_merges_and_sends_the_partial() -> None:
    e, _ = make()
    t = table(e)
    row = {"qty": 100, "avg": 12.5, "symbol": "AAPL", "account": "main", "book": "equities-us"}
    e.set_entry(t, "pos", row)
    s, sink = connect(e)
    e.subscribe(s, t, 1, 0, 0)
    run(e)
    sink.take()
    e.patch_entry(t, "pos", {"qty": 150, "account": None})
    run(e)
    assert entries(sink) == [(2, PATCH, "pos", {"qty": 150, "account": None})]
    assert server_table(t) == {
        "pos": {"qty": 150, "avg": 12.5, "symbol": "AAPL", "book": "equities-us"}
    }
    assert e.patch_entry(t, "pos", {"qty": 150}) == 2  # no change: no seq, nothing sent
    run(e)
    assert entries(sink) == []


def test_deletes_and_tombstones() -> None:
    e, _ = make()
    t = table(e)
    e.set_entry(t, "a", 1)
    e.set_entry(t, "b", 2)
    s, sink = connect(e)
    e.subscribe(s, t, 1, 0, 0)
    run(e)
    sink.take()
    assert e.delete_entry(t, "a") == 3
    assert e.delete_entry(t, "a") is None  # not held: nothing
    run(e)
    assert entries(sink) == [(3, DELETE, "a", None)]
    late, lsink = connect(e)
    e.subscribe(late, t, 1, 0, 0)
    run(e)  # a new subscriber is not told of what was deleted before it came
    assert entries(lsink) == [(2, SET, "b", 2), (3, SYNCED, "", None)]


def test_resume_sends_exactly_what_changed_since_then_synced() -> None:
    e, _ = make()
    t = table(e)
    for k in "abcd":
        e.set_entry(t, k, k.upper())
    s, sink = connect(e)
    e.subscribe(s, t, 1, 0, 0)
    run(e)
    mine = fold(Table("book"), entries(sink))
    held = mine.seq
    e.set_entry(t, "b", "B2")
    e.delete_entry(t, "c")
    e.set_entry(t, "e", "E")
    again, asink = connect(e)
    e.subscribe(again, t, 2, t.epoch, held)
    run(e)
    frames = asink.take()
    assert frames[0][0].recovered is True  # type: ignore[attr-defined]
    got = [(m.seq, m.op, m.key) for f in frames for m in f if isinstance(m, Entry)]
    assert got == [(5, SET, "b"), (6, DELETE, "c"), (7, SET, "e"), (7, SYNCED, "")]
    asink.frames[:] = []


def test_recovery_from_before_a_forgotten_delete_resets() -> None:
    e, clock = make(tombstones=60.0)
    t = table(e)
    for k in "abc":
        e.set_entry(t, k, k)
    e.delete_entry(t, "b")
    clock.advance(61)
    e.set_entry(t, "d", "d")
    assert e.forget_tombstones(clock()) == 1
    s, sink = connect(e)
    e.subscribe(s, t, 1, t.epoch, 2)  # it held seq 2: "b" was deleted (seq 4), forgotten
    run(e)
    frames = sink.take()
    assert frames[0][0].recovered is False  # type: ignore[attr-defined]
    got = [(m.op, m.key) for f in frames for m in f if isinstance(m, Entry)]
    assert got == [(RESET, ""), (SET, "a"), (SET, "c"), (SET, "d"), (SYNCED, "")]
    s2, sink2 = connect(e)
    e.subscribe(s2, t, 1, t.epoch, 4)  # from after the delete: still exact
    run(e)
    frames = sink2.take()
    assert frames[0][0].recovered is True  # type: ignore[attr-defined]
    assert [(m.op, m.key) for f in frames for m in f if isinstance(m, Entry)] == [
        (SET, "d"),
        (SYNCED, ""),
    ]


def test_another_epoch_resets_and_sends_the_whole_table() -> None:
    e, _ = make()
    t = table(e)
    e.set_entry(t, "a", 1)
    s, sink = connect(e)
    e.subscribe(s, t, 1, t.epoch + 1, 1)
    run(e)
    frames = sink.take()
    assert frames[0][0].recovered is False  # type: ignore[attr-defined]
    assert [(m.op, m.key) for f in frames for m in f if isinstance(m, Entry)] == [
        (RESET, ""),
        (SET, "a"),
        (SYNCED, ""),
    ]


def test_a_live_subscriber_behind_a_forgotten_delete_is_reset() -> None:
    e, clock = make(tombstones=60.0)
    t = table(e)
    e.set_entry(t, "a", 1)
    e.set_entry(t, "b", 2)
    s, sink = connect(e, auto=False)
    e.subscribe(s, t, 1, 0, 0)
    run(e)
    sink.complete()
    run(e)
    mine = fold(Table("book"), entries(sink))
    assert dict(mine) == {"a": 1, "b": 2} and mine.synced
    run(e)
    e.delete_entry(t, "a")  # its frame is stuck past the tombstone's life
    e.set_entry(t, "c", 3)
    clock.advance(61)
    e.forget_tombstones(clock())
    sink.complete()
    run(e)
    got = entries(sink)
    assert got[0][1] == RESET
    fold(mine, got)
    assert dict(mine) == {"b": 2, "c": 3} == server_table(t)


def test_replace_sends_the_differences() -> None:
    e, _ = make()
    t = table(e)
    e.replace_table(t, {"a": 1, "b": 2, "c": 3})
    s, sink = connect(e)
    e.subscribe(s, t, 1, 0, 0)
    run(e)
    sink.take()
    e.replace_table(t, {"a": 1, "b": 20, "d": 4})
    run(e)
    assert [(op, k, v) for _, op, k, v in entries(sink)] == [
        (DELETE, "c", None),
        (SET, "b", 20),
        (SET, "d", 4),
    ]
    assert server_table(t) == {"a": 1, "b": 20, "d": 4}


def test_max_keys_refuses_a_new_key_and_changes_nothing() -> None:
    e, _ = make()
    t = table(e, max_keys=2)
    e.set_entry(t, "a", 1)
    e.set_entry(t, "b", 2)
    with pytest.raises(TableFull, match="max_keys"):
        e.set_entry(t, "c", 3)
    e.set_entry(t, "a", 10)  # an existing key may change
    e.delete_entry(t, "b")
    e.set_entry(t, "c", 3)  # room again
    with pytest.raises(TableFull):
        e.replace_table(t, {"x": 1, "y": 2, "z": 3})
    assert server_table(t) == {"a": 10, "c": 3}


def test_a_bad_value_in_a_replace_changes_nothing() -> None:
    e, _ = make()
    t = table(e)
    e.replace_table(t, {"a": 1})
    with pytest.raises(TypeError):
        e.replace_table(t, {"b": 2, "c": object()})
    assert server_table(t) == {"a": 1} and t.seq == 1


def test_keys_are_checked() -> None:
    e, _ = make()
    t = table(e)
    with pytest.raises(TypeError, match="non-empty str"):
        e.set_entry(t, "", 1)
    with pytest.raises(TypeError, match="keyed topic"):
        e.publish(t, 1)


def test_a_table_folded_from_random_changes_equals_the_servers() -> None:
    """Fast and slow readers (a write that completes every n-th cycle) of random sets,
    patches and deletes: once each has read to the head, its table is the server's."""
    rnd = random.Random(5)
    e, clock = make()
    t = table(e, batch=8)
    readers = []
    for every in (1, 1, 3, 10):
        s, sink = connect(e, auto=False)
        e.subscribe(s, t, 1, 0, 0)
        readers.append((every, sink, Table("book")))
    for cycle in range(400):
        for _ in range(rnd.randrange(0, 6)):
            key = f"k{rnd.randrange(30)}"
            r = rnd.random()
            if r < 0.5:
                e.set_entry(
                    t, key, {"px": rnd.randrange(5), "qty": rnd.randrange(3), "x": "y" * 20}
                )
            elif r < 0.8:
                e.patch_entry(t, key, {"qty": rnd.randrange(3), "n": rnd.choice([None, 1])})
            else:
                e.delete_entry(t, key)
        e.scheduler.run_cycle()
        clock.advance(0.01)
        for every, sink, mine in readers:
            if cycle % every == 0:
                sink.complete()
                fold(mine, entries(sink))
    for _ in range(100):
        e.scheduler.run_cycle()
        for _every, sink, mine in readers:
            sink.complete()
            fold(mine, entries(sink))
    for _every, _sink, mine in readers:
        assert mine.seq == t.seq and mine.synced
        assert dict(mine) == server_table(t)


def test_max_rate_on_a_snapshot_spaces_its_frames() -> None:
    e, clock = make()
    t = e.topic("px", Mode.SNAPSHOT)
    e.publish(t, 0)
    s, sink = connect(e)
    e.subscribe(s, t, 1, 0, 0, every=0.5)
    e.scheduler.run_cycle()
    got = [(clock(), orjson.loads(m.payload)) for f in sink.take() for m in f if hasattr(m, "seq")]
    for i in range(1, 301):  # 100 a second for 3 s
        e.publish(t, i)
        e.scheduler.run_cycle()
        for frame in sink.take():
            got += [(clock(), orjson.loads(m.payload)) for m in frame if hasattr(m, "seq")]
        clock.advance(0.01)
    times = [at for at, _ in got]
    assert got[0][1] == 0  # the first value at once
    assert all(b - a >= 0.5 - 1e-9 for a, b in zip(times, times[1:], strict=False))
    assert len(got) in (6, 7)
    assert all(v == round((at - 1000.0) / 0.01) + 1 for at, v in got[1:])  # the latest each time


def test_max_rate_on_a_keyed_topic_after_its_initial_state() -> None:
    e, clock = make()
    t = table(e)
    for i in range(5):
        e.set_entry(t, f"k{i}", i)
    s, sink = connect(e)
    e.subscribe(s, t, 1, 0, 0, every=0.25)
    e.scheduler.run_cycle()
    first = entries(sink)
    assert [op for _, op, *_ in first] == [SET] * 5 + [SYNCED]
    stamps = []
    for i in range(100):
        clock.advance(0.01)
        e.set_entry(t, f"k{i % 5}", 100 + i)
        e.scheduler.run_cycle()
        if entries(sink):
            stamps.append(clock())
    # the first cycle at or past each due time: 0.26, 0.52, 0.78 s (the clock steps 10 ms)
    assert len(stamps) == 3
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert all(0.25 - 1e-9 <= g <= 0.26 + 1e-9 for g in gaps)
    assert e.scheduler.next_timer() is not None or not t.subs


def test_what_is_kept_is_kept_at_its_own_size() -> None:
    """A key's value, and a waiting queue item, hold their bytes and not the 4 KiB buffer
    orjson wrote them into (engine/topics.py ``trimmed``)."""
    import gc
    import tracemalloc

    from rubris_asgi.engine.channels import Registry
    from rubris_asgi.engine.queues import QueueSettings

    reg = Registry()

    @reg.queue("jobs", QueueSettings(max_length=10_000))
    def jobs(session: Any) -> None: ...

    e, _ = make()
    t = table(e)
    q = e.queue_named("jobs", reg)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(2000):
            e.set_entry(t, f"k{i}", {"px": i, "qty": 300})
        keyed = tracemalloc.get_traced_memory()[0]
        for i in range(2000):
            e.enqueue(q, {"job": i, "symbol": "AAPL"}, None, None)
        queued = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert (keyed - before) / 2000 < 1024  # about 400 bytes a key (4.4 KiB untrimmed)
    assert (queued - keyed) / 2000 < 512  # about 190 bytes an item (4.2 KiB untrimmed)

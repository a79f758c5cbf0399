"""The rules of batch tracking (the source document on batch fan-out), sans-IO.

Each test drives tracker.py over its in-memory view with explicit times: the cases the source
document names (all acked before the seal, seal then acks, double ack, out of order, a retried
consumer), failures, every error leaving everything as it was, and expiry.
"""

from __future__ import annotations

import copy
import random

import pytest

from rubris_asgi.batches import bits, tracker
from rubris_asgi.batches.ids import ItemRef, item_ids, new_batch_id, parse_item
from rubris_asgi.batches.tracker import MemoryView, State
from rubris_asgi.config import BatchConfig
from rubris_asgi.errors import (
    BadCount,
    BatchSealed,
    ItemOutOfRange,
    MalformedItem,
    UnknownBatch,
)

T0 = 1_000_000.0


def refs(batch: str, group: int, indexes: range | list[int]) -> list[ItemRef]:
    return [ItemRef(batch, group, i) for i in indexes]


@pytest.fixture
def view() -> MemoryView:
    return MemoryView()


def opened(view: MemoryView, *counts: int, batch: str = "b1") -> str:
    tracker.open_batch(view, batch, T0)
    for n in counts:
        tracker.add(view, batch, n, T0)
    return batch


# ids


def test_item_ids_round_trip() -> None:
    ids = list(item_ids("a1f", 3, 4))
    assert ids == ["a1f:3:0", "a1f:3:1", "a1f:3:2", "a1f:3:3"]
    assert [parse_item(i) for i in ids] == refs("a1f", 3, range(4))
    assert str(ItemRef("x", 0, 7)) == "x:0:7"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "b1",
        "b1:0",
        "b1:0:1:2",
        "b1:-1:0",
        "b1:0:01",
        "b1:00:1",
        "b1: 0:1",
        "b1:0:x",
        "b 1:0:0",
        "b1:0:1\n",
        "é:0:0",
        "b1:0:" + "9" * 19,
        17,
        None,
        ["b1:0:0"],
    ],
)
def test_malformed_item_ids_are_named(bad: object) -> None:
    with pytest.raises(MalformedItem) as exc:
        parse_item(bad)
    assert exc.value.status == 400
    assert "malformed item id" in exc.value.reason


def test_batch_ids_are_random_hex() -> None:
    ids = {new_batch_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)


# bits


def test_spans_split_at_chunk_boundaries() -> None:
    c = bits.CHUNK_BITS
    assert list(bits.spans(0, 5)) == [(0, 0, 5)]
    assert list(bits.spans(c - 2, 5)) == [(0, c - 2, c), (1, 0, 3)]
    assert list(bits.spans(3, 2 * c)) == [(0, 3, c), (1, 0, c), (2, 0, 3)]


def test_set_range_and_clear_match_a_bit_by_bit_model() -> None:
    rnd = random.Random(7)
    buf = bytearray(bits.CHUNK_BYTES)
    model = [False] * bits.CHUNK_BITS
    for _ in range(200):
        lo = rnd.randrange(bits.CHUNK_BITS)
        hi = rnd.randrange(lo, min(bits.CHUNK_BITS, lo + 40) + 1)
        bits.set_range(buf, lo, hi)
        for b in range(lo, hi):
            model[b] = True
        offsets = [rnd.randrange(bits.CHUNK_BITS) for _ in range(10)]
        expected = len({b for b in offsets if model[b]})
        assert bits.clear_bits(buf, offsets) == expected
        for b in offsets:
            model[b] = False
        assert bits.count(buf) == sum(model)
    # MSB first, as Redis SETBIT numbers bits
    one = bytearray(2)
    bits.set_range(one, 0, 1)
    bits.set_range(one, 9, 10)
    assert bytes(one) == b"\x80\x40"


# the source document's cases


def test_all_acked_before_the_seal_then_the_seal_says_complete(view: MemoryView) -> None:
    b = opened(view, 3)
    st = tracker.end(view, refs(b, 0, range(3)), T0 + 1)[b]
    assert (st.state, st.done, st.completed) == (State.OPEN, 3, False)
    sealed = tracker.seal(view, b, T0 + 2)
    assert sealed.state is State.COMPLETE and sealed.completed
    assert sealed.to_json() == {
        "state": "complete",
        "total": 3,
        "done": 3,
        "failed": 0,
        "completed": True,
    }
    # completed appears exactly once
    assert not tracker.seal(view, b, T0 + 3).completed
    assert not tracker.status(view, b).completed


def test_seal_then_acks_the_last_ack_says_complete(view: MemoryView) -> None:
    b = opened(view, 2, 3)
    assert tracker.seal(view, b, T0).state is State.SEALED
    answers = [
        tracker.end(view, [ItemRef(b, g, i)], T0)[b] for g, i in [(1, 2), (0, 0), (1, 0), (1, 1)]
    ]
    assert [a.completed for a in answers] == [False] * 4
    last = tracker.end(view, [ItemRef(b, 0, 1)], T0)[b]
    assert last.completed and last.state is State.COMPLETE and last.done == 5


def test_double_ack_and_retried_consumer_count_once(view: MemoryView) -> None:
    b = opened(view, 4)
    tracker.seal(view, b, T0)
    first = tracker.end(view, refs(b, 0, [0, 1]), T0)[b]
    assert first.done == 2
    # the same items again (a retried consumer), and duplicates within one request
    again = tracker.end(view, refs(b, 0, [1, 1, 0, 2]), T0)[b]
    assert (again.done, again.completed) == (3, False)
    last = tracker.end(view, refs(b, 0, [3, 3]), T0)[b]
    assert (last.done, last.completed) == (4, True)
    after = tracker.end(view, refs(b, 0, [3]), T0)[b]
    assert (after.state, after.done, after.completed) == (State.COMPLETE, 4, False)


def test_out_of_order_acks_across_groups_and_chunks(view: MemoryView) -> None:
    sizes = [5, bits.CHUNK_BITS + 3, 1, 2 * bits.CHUNK_BITS]
    b = opened(view, *sizes)
    everything = [ItemRef(b, g, i) for g, n in enumerate(sizes) for i in range(n)]
    random.Random(3).shuffle(everything)
    tracker.seal(view, b, T0)
    completed = []
    for k in range(0, len(everything), 997):
        st = tracker.end(view, everything[k : k + 997], T0)[b]
        completed.append(st.completed)
    assert completed.count(True) == 1 and completed[-1]
    assert tracker.status(view, b).done == sum(sizes)
    assert b not in view.chunks  # a complete batch keeps no bits


def test_failed_items_count_toward_completion_and_end_once(view: MemoryView) -> None:
    b = opened(view, 3)
    tracker.seal(view, b, T0)
    assert tracker.end(view, refs(b, 0, [0]), T0, failed=True)[b].failed == 1
    # an ack after the failure changes nothing, and the other way round
    st = tracker.end(view, refs(b, 0, [0, 1]), T0)[b]
    assert (st.done, st.failed) == (1, 1)
    st = tracker.end(view, refs(b, 0, [1, 2]), T0, failed=True)[b]
    assert (st.done, st.failed, st.completed, st.state) == (1, 2, True, State.COMPLETE)


def test_a_batch_sealed_empty_is_complete_at_the_seal(view: MemoryView) -> None:
    b = opened(view)
    st = tracker.seal(view, b, T0)
    assert (st.state, st.total, st.completed) == (State.COMPLETE, 0, True)


def test_one_request_touching_several_batches(view: MemoryView) -> None:
    a = opened(view, 2, batch="a")
    b = opened(view, 1, batch="b")
    tracker.seal(view, b, T0)
    out = tracker.end(view, [ItemRef(a, 0, 1), ItemRef(b, 0, 0), ItemRef(a, 0, 0)], T0)
    assert out[a].done == 2 and out[a].state is State.OPEN
    assert out[b].completed


# errors change nothing


def test_errors_name_the_item_and_change_nothing(view: MemoryView) -> None:
    b = opened(view, 3)
    before = copy.deepcopy(view.__dict__)
    cases: list[tuple[list[ItemRef], type[Exception], str]] = [
        ([ItemRef(b, 0, 0), ItemRef(b, 0, 3)], ItemOutOfRange, f"item {b}:0:3"),
        ([ItemRef(b, 0, 1), ItemRef(b, 1, 0)], ItemOutOfRange, "no such group"),
        ([ItemRef(b, 0, 2), ItemRef("nope", 0, 0)], UnknownBatch, "nope"),
    ]
    for items, kind, words in cases:
        with pytest.raises(kind) as exc:
            tracker.end(view, items, T0 + 5)
        assert words in str(exc.value)
        with pytest.raises(kind):
            tracker.check(view, items)
        assert view.__dict__ == before
    with pytest.raises(UnknownBatch) as unknown:
        tracker.seal(view, "nope", T0)
    assert unknown.value.status == 404
    with pytest.raises(BadCount):
        tracker.add(view, b, 0, T0)
    with pytest.raises(BadCount):
        tracker.add(view, b, 11, T0, BatchConfig(max_items=13))
    with pytest.raises(BadCount):
        tracker.add(view, b, 1, T0, BatchConfig(max_groups=1))
    assert view.__dict__ == before
    tracker.seal(view, b, T0)
    with pytest.raises(BatchSealed) as sealed:
        tracker.add(view, b, 1, T0)
    assert sealed.value.status == 409 and "sealed" in sealed.value.reason


# expiry


def test_expire_ends_a_live_batch_and_drops_its_bits(view: MemoryView) -> None:
    c = BatchConfig(expiry=100.0, sealed_expiry=50.0)
    b = opened(view, 10)
    assert tracker.idle_cutoff(State.OPEN, T0 + 100, c) == T0
    assert tracker.idle_cutoff(State.SEALED, T0 + 100, c) == T0 + 50
    rec = view.records[b]
    st = tracker.expire(view, rec, T0 + 200)
    assert st.state is State.EXPIRED and rec.ended == T0 + 200
    assert b not in view.chunks
    # an expired batch takes no more items, and its acks change nothing
    with pytest.raises(BatchSealed):
        tracker.add(view, b, 1, T0)
    assert tracker.end(view, refs(b, 0, [0]), T0)[b].done == 0
    with pytest.raises(ItemOutOfRange):  # its groups are still known
        tracker.end(view, refs(b, 0, [10]), T0)


def test_activity_is_what_moves_touched(view: MemoryView) -> None:
    b = opened(view, 2)
    tracker.end(view, refs(b, 0, [0]), T0 + 10)
    assert view.records[b].touched == T0 + 10
    tracker.end(view, refs(b, 0, [0]), T0 + 20)  # changed nothing: no activity
    assert view.records[b].touched == T0 + 10
    tracker.seal(view, b, T0 + 30)
    assert view.records[b].touched == T0 + 30

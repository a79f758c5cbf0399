"""The forms of work-queue items in Redis, on the node's side (cluster/redis/queues/runs.py),
and the items a node deals again from hand (hand.py): sans-IO, what the scripts' tests
(test_queue_runs_redis.py) rely on."""

from __future__ import annotations

import pytest

from rubris_asgi.cluster.redis.queues.hand import Hand
from rubris_asgi.cluster.redis.queues.runs import (
    HEAD,
    decode_item,
    encode_item,
    marks_of,
    piece_code,
    piece_name,
    records_of,
    run_of,
)
from rubris_asgi.engine.queues import QueueItem

pytestmark = pytest.mark.core

ORIGIN = bytes(6) + (7).to_bytes(4, "big")


def test_a_record_says_all_an_item_is() -> None:
    plain = QueueItem(b"x:y\n", True, None, 0.0)
    back = decode_item(encode_item(plain), 5.0)
    assert (back.payload, back.compressed, back.id, back.batch_item, back.enqueued) == (
        b"x:y\n",
        True,
        None,
        None,
        5.0,
    )
    item = QueueItem(b"\x00pay", False, "id-1", 0.0, "b.3")
    item.failures, item.attempt, item.key = 2, 3, "n.1f"
    back = decode_item(encode_item(item), 1.0)
    assert (back.payload, back.id, back.batch_item) == (b"\x00pay", "id-1", "b.3")
    assert (back.failures, back.attempt, back.key) == (2, 3, "n.1f")


def test_a_run_keeps_its_records_in_order() -> None:
    records = [b"0:0::0:[null,null]\n%d" % i for i in range(300)]
    assert list(records_of(run_of(records))) == records
    assert list(records_of(run_of(records[:1]))) == records[:1]


def test_pieces_and_marks() -> None:
    assert piece_name(piece_code("12.3")) == "12.3"
    assert marks_of([1]) == b"\x01"
    assert marks_of([1, 3, 9]) == b"\x05\x01"  # item J: bit (J-1) % 8 of byte (J-1) // 8


def parts(records: list[bytes], ends: list[int], k: int) -> tuple[bytes, bytes]:
    """Run 7 cut after its k-th record, as the CYCLE script cuts: the second part's base is
    where the first part ended, its ends unchanged."""
    first = run_of(records[:k], ORIGIN)
    rest = (
        (len(records) - k).to_bytes(2, "big")
        + ends[k - 1].to_bytes(4, "big")
        + ORIGIN
        + b"".join(e.to_bytes(4, "big") for e in ends[k:])
        + b"".join(records[k:])
    )
    return first, rest


def dealt(hand: Hand, run: bytes) -> list[QueueItem] | None:
    """What ``RedisQueues._took`` asks of its hand for a piece taken back."""
    count, base, _, number = HEAD.unpack_from(run)
    data = HEAD.size + 4 * count - base
    ends = tuple(
        int.from_bytes(run[HEAD.size + 4 * j : HEAD.size + 4 * j + 4]) for j in range(count)
    )
    return hand.deal(number, run, data, base, ends)


def test_a_node_deals_its_own_items_again_only_when_taken_back_unchanged() -> None:
    """A run this node made, taken back whole or in parts, is dealt as the items it put (no
    record decoded), each at most once, and only when every record taken is byte for byte the
    one put: a run that differs (another of the same number, say) is left to be decoded."""
    items = [QueueItem(b"%d" % i, False, None, 0.0) for i in range(4)]
    records = [encode_item(item) for item in items]
    ends = [sum(len(r) for r in records[: i + 1]) for i in range(4)]
    whole = run_of(records, ORIGIN)
    hand = Hand()
    hand.remember(7, list(items), whole, ends)
    forged = run_of([records[0], encode_item(QueueItem(b"x", False, None, 0.0))], ORIGIN)
    assert dealt(hand, forged) is None
    first, rest = parts(records, ends, 2)
    got = dealt(hand, rest)
    assert got is not None and all(a is b for a, b in zip(got, items[2:], strict=True))
    assert dealt(hand, rest) is None  # each item at most once
    got = dealt(hand, first)
    assert got is not None and all(a is b for a, b in zip(got, items[:2], strict=True))
    assert 7 not in hand  # all dealt: forgotten
    assert dealt(hand, whole) is None  # the same again (it cannot be, but if): decoded


def test_a_hand_forgets_its_oldest_runs_past_its_bound() -> None:
    hand = Hand(most=10)
    for number in range(1, 5):
        items = [QueueItem(b"%d" % i, False, None, 0.0) for i in range(4)]
        records = [encode_item(i) for i in items]
        ends = [sum(len(r) for r in records[: i + 1]) for i in range(4)]
        hand.remember(number, items, run_of(records, ORIGIN), ends)
    assert [n in hand for n in range(1, 5)] == [False, False, True, True]

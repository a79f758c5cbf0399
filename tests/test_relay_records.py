"""The records of a carried WebSocket, sans-IO (rubris_asgi/server/relay/records.py): what the
two nodes tell each other, and the numbers that keep a lost stretch from going unnoticed."""

from __future__ import annotations

import pytest

from rubris_asgi.server.relay.records import (
    ACK,
    CLOSE,
    FRAME,
    IN,
    Sequence,
    Window,
    close_body,
    close_record,
    record,
    records,
)

pytestmark = pytest.mark.core


def test_records_of_many_connections_read_back_in_order() -> None:
    frame = memoryview(bytearray(b"\x01\x02frame"))
    data = record(FRAME, 7, 1, frame) + record(ACK, 9, 42) + record(IN, 2**32 - 1, 3, b"x")
    frame[0] = 0xFF  # the buffer is reused at once: the record holds its own copy
    assert list(records(data)) == [
        (FRAME, 7, 1, b"\x01\x02frame"),
        (ACK, 9, 42, b""),
        (IN, 2**32 - 1, 3, b"x"),
    ]


def test_a_record_cut_short_is_an_error_not_a_shorter_frame() -> None:
    data = record(FRAME, 1, 1, b"abcdef")
    with pytest.raises(ValueError, match="body"):
        list(records(data[:-1]))
    with pytest.raises(ValueError, match="head"):
        list(records(data + data[:5]))


def test_a_close_carries_its_reason_and_last_frame() -> None:
    [(kind, conn, code, body)] = records(close_record(5, 1013, "slow consumer", b"\x0c\x07"))
    assert (kind, conn, code) == (CLOSE, 5, 1013)
    assert close_body(body) == ("slow consumer", b"\x0c\x07")
    [(_, _, _, body)] = records(close_record(5, 1000, "x" * 300))
    reason, last = close_body(body)
    assert reason == "x" * 120 and last == b""  # a close frame's reason is short


def test_a_sequence_takes_each_number_once_in_turn() -> None:
    seq = Sequence()
    assert seq.take(1) and seq.take(2)
    assert not seq.take(2)  # a repeat: the connection must end
    seq = Sequence()
    assert seq.take(1)
    assert not seq.take(3)  # frame 2 was lost: never write 3 after 1


def test_a_window_holds_its_size_and_confirmations_are_cumulative() -> None:
    w = Window(3)
    assert [w.send(), w.send(), w.send()] == [1, 2, 3]
    assert not w.room and w.outstanding == 3
    with pytest.raises(OverflowError):
        w.send()
    assert w.ack(2) and w.room and w.outstanding == 1
    assert not w.ack(1) and not w.ack(2)  # late or repeated: nothing new
    with pytest.raises(ValueError):
        w.ack(4)  # never sent: the other side is broken
    assert w.send() == 4 and w.ack(4) and w.outstanding == 0
    with pytest.raises(ValueError):
        Window(0)

"""The wire codec against protocol.md sections 1-4: round trips, varints, and hostile input."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rubris_asgi.errors import ErrorCode, ProtocolError
from rubris_asgi.protocol import (
    COMPRESSED,
    COMPRESSIBLE,
    SUBPROTOCOL,
    VERSION,
    Ack,
    Call,
    Codec,
    Entry,
    Flow,
    Gap,
    Goodbye,
    Hello,
    Item,
    Kind,
    Message,
    Mode,
    Nack,
    Nak,
    Ping,
    Pong,
    Publish,
    Push,
    Rejected,
    Result,
    Revoke,
    Stream,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    Welcome,
    decode_frame,
    encode,
    encode_frame,
    encode_message,
    encode_str,
    encode_uv,
    item_message,
    iter_messages,
    push_message,
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MAX_UV = 2**64 - 1
EDGE_UVS = [0, 1, 127, 128, 255, 16383, 16384, 2**21 - 1, 2**21, 2**32, 2**63, MAX_UV]

uvs = st.one_of(st.sampled_from(EDGE_UVS), st.integers(0, MAX_UV))
u8s = st.sampled_from([0, 1, 127, 128, 255]) | st.integers(0, 255)
texts = st.sampled_from(["", "a", "héllo ✓ 𝄞", "\x00", "x" * 200]) | st.text(max_size=24)
payloads = st.sampled_from([b"", b"\x00", b"{}", bytes(range(256))]) | st.binary(max_size=64)
flags = st.booleans()

server_messages = st.one_of(
    st.builds(Welcome, texts, texts, uvs, uvs, flags),
    st.builds(Push, uvs, uvs, payloads, flags),
    st.builds(Result, uvs, u8s, payloads, flags),
    st.builds(Stream, uvs, flags, payloads, flags),
    st.builds(Subscribed, uvs, uvs, u8s, u8s, uvs, uvs, flags, texts),
    st.builds(Rejected, uvs, uvs, texts),
    st.builds(Unsubscribed, uvs, uvs, texts),
    st.builds(Gap, uvs, uvs, uvs),
    st.builds(Pong, uvs),
    st.builds(Goodbye, uvs, texts),
    st.builds(Flow, u8s),
    st.builds(Item, uvs, uvs, uvs, payloads, flags),
    st.builds(Revoke, uvs, st.lists(uvs, max_size=6).map(tuple)),
    st.builds(Entry, uvs, uvs, u8s, texts, payloads, flags),
)
client_messages = st.one_of(
    st.builds(Hello, uvs, texts),
    st.builds(Subscribe, uvs, texts, uvs, uvs, payloads, flags),
    st.builds(Unsubscribe, uvs),
    st.builds(Call, uvs, texts, payloads, flags),
    st.builds(Ack, uvs, st.lists(uvs, max_size=6).map(tuple)),
    st.builds(Nack, uvs, uvs, flags),
    st.builds(Nak, u8s),
    st.builds(Ping, uvs),
    st.builds(Publish, uvs, texts, payloads, flags),
)
messages = server_messages | client_messages
frames = st.lists(messages, min_size=1, max_size=6)

# One message of every kind, used where a fixed sample is clearer than a strategy.
ONE_OF_EACH: list[Message] = [
    Welcome("s1", "r1", 15000, 1 << 20, True),
    Push(7, 300, b'{"p":1}'),
    Result(3, 1, b'{"code":3,"message":"no"}'),
    Stream(3, True, b"[1]"),
    Subscribed(1, 7, Mode.RING, Codec.JSON, 42, 300, False, "prices"),
    Rejected(2, 3, "unknown topic"),
    Unsubscribed(7, 0, ""),
    Gap(7, 10, 5),
    Pong(99),
    Goodbye(9, "shutting down"),
    Flow(75),
    Item(9, 4, 2, b'{"job":1}'),
    Revoke.of(9, [3, 4]),
    Entry(9, 12, 2, "101.25", b'{"size":400}'),
    Hello(VERSION, ""),
    Subscribe(1, "prices", 42, 299, b'{"depth":5}'),
    Unsubscribe(7),
    Call(4, "echo", b'"hi"'),
    Ack.private(7, 300),
    Nack(8, 12, True),
    Nak(50),
    Ping(99),
    Publish(5, "chat", b'"yo"'),
]


def split_message(data: bytes) -> tuple[int, bytes]:
    """Kind byte and body of one encoded message, by an independent reading of the header."""
    length, shift, pos = 0, 0, 1
    while True:
        b = data[pos]
        pos += 1
        length |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            break
    assert pos + length == len(data)
    return data[0], data[pos:]


def raw(kind: int, body: bytes) -> bytes:
    """A message built by hand, so the COMPRESSED bit and unknown kinds can be set freely."""
    return bytes([kind]) + encode_uv(len(body)) + body


def refused(frame: bytes | bytearray | memoryview) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode_frame(frame)
    assert info.value.code == ErrorCode.PROTOCOL
    return info.value


# --------------------------------------------------------------------------- constants


def test_constants() -> None:
    assert VERSION == 1
    assert SUBPROTOCOL == "rubris.v1"
    assert COMPRESSED == 0x80
    assert COMPRESSIBLE == {
        Kind.PUSH,
        Kind.RESULT,
        Kind.STREAM,
        Kind.ITEM,
        Kind.ENTRY,
        Kind.SUBSCRIBE,
        Kind.CALL,
        Kind.PUBLISH,
    }
    assert [k.value for k in Kind] == [*range(0x01, 0x0F), *range(0x21, 0x2A)]
    assert [m.value for m in Mode] == [1, 2, 3, 4, 5]
    assert [c.value for c in Codec] == [0, 1, 2]


def test_one_of_each_covers_every_kind() -> None:
    kinds = {split_message(encode(m))[0] for m in ONE_OF_EACH}
    assert kinds == set(Kind)


# --------------------------------------------------------------------------- round trips


@FAST
@given(messages)
def test_round_trip_one_message(msg: Message) -> None:
    assert decode_frame(encode(msg)) == [msg]


@FAST
@given(frames)
def test_round_trip_frame(msgs: list[Message]) -> None:
    frame = encode_frame(msgs)
    assert frame == b"".join(encode(m) for m in msgs)
    assert decode_frame(frame) == msgs
    for view in (bytearray(frame), memoryview(frame)):
        decoded = list(iter_messages(view))
        assert decoded == msgs
        for m in decoded:
            for field in ("payload", "params"):
                if hasattr(m, field):
                    assert type(getattr(m, field)) is bytes


def test_round_trip_one_of_each_in_one_frame() -> None:
    assert decode_frame(encode_frame(ONE_OF_EACH)) == ONE_OF_EACH


@pytest.mark.parametrize("n", EDGE_UVS)
def test_round_trip_edge_values(n: int) -> None:
    msgs: list[Message] = [
        Push(n, n, b""),
        Gap(n, n, n),
        Subscribed(n, n, 255, 0, n, n, True, ""),
        Ack(n, (n, n)),
        Welcome("", "", n, n, False),
        Subscribe(n, "", n, n, b""),
    ]
    assert decode_frame(encode_frame(msgs)) == msgs


def test_round_trip_unicode_and_large_payload() -> None:
    big = bytes(range(256)) * 4096  # 1 MiB: a multi-byte length and a long rest field
    msgs: list[Message] = [
        Call(1, "méthode/𝄞", big),
        Publish(2, "日本語", big, compressed=True),
        Rejected(3, 10, "nope ✗"),
    ]
    assert decode_frame(encode_frame(msgs)) == msgs


def test_encode_refuses_out_of_range_fields() -> None:
    bad: list[Message] = [
        Ping(-1),
        Ping(2**64),
        Result(1, 256, b""),
        Flow(300),
        Nak(-1),
        Subscribed(1, 1, 256, 0, 0, 0, False, "x"),
        Ack.private(1, 2**64),
        Hello(1, "\ud800"),  # a lone surrogate has no UTF-8 encoding
    ]
    for msg in bad:
        with pytest.raises(ValueError):
            encode(msg)


def test_encode_frame_refuses_empty() -> None:
    with pytest.raises(ValueError):
        encode_frame([])


def test_encode_message_and_str() -> None:
    assert encode_message(Kind.PING, b"\x05") == b"\x28\x01\x05"
    assert encode_message(Kind.PUSH, b"", compressed=True) == b"\x82\x00"
    assert encode_str("") == b"\x00"
    assert encode_str("é") == b"\x02\xc3\xa9"
    with pytest.raises(ValueError):
        encode_message(Kind.PING, b"", compressed=True)
    with pytest.raises(ValueError):
        encode_message(0x80, b"")


@FAST
@given(uvs, uvs, payloads, flags)
@example(MAX_UV, MAX_UV, b"x" * 300, True)
def test_push_message_equals_encode(topic: int, seq: int, payload: bytes, comp: bool) -> None:
    assert push_message(topic, seq, payload, comp) == encode(Push(topic, seq, payload, comp))


def test_push_message_layout() -> None:
    assert push_message(1, 2, b"ab") == b"\x02\x04\x01\x02ab"
    assert push_message(1, 128, b"", compressed=True) == b"\x82\x03\x01\x80\x01"


# --------------------------------------------------------------------------- varints


@pytest.mark.parametrize(
    ("n", "wire"),
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (300, b"\xac\x02"),
        (16383, b"\xff\x7f"),
        (16384, b"\x80\x80\x01"),
        (2**21 - 1, b"\xff\xff\x7f"),
        (2**21, b"\x80\x80\x80\x01"),
        (MAX_UV, b"\xff" * 9 + b"\x01"),
    ],
)
def test_uv_vectors(n: int, wire: bytes) -> None:
    assert encode_uv(n) == wire
    assert decode_frame(raw(Kind.PING, wire)) == [Ping(n)]


@FAST
@given(st.integers(0, MAX_UV))
def test_uv_round_trip(n: int) -> None:
    wire = encode_uv(n)
    assert 1 <= len(wire) <= 10
    assert decode_frame(raw(Kind.PING, wire)) == [Ping(n)]


@pytest.mark.parametrize("n", [-1, -(2**70), 2**64, 2**80])
def test_encode_uv_out_of_range(n: int) -> None:
    with pytest.raises(ValueError):
        encode_uv(n)


@pytest.mark.parametrize(
    "wire",
    [
        b"\xff" * 10 + b"\x01",  # 11 bytes
        b"\x80" * 10 + b"\x00",  # 11 bytes and overlong
        b"\x80" * 9 + b"\x02",  # exactly 2**64
        b"\xff" * 9 + b"\x7f",  # 10 bytes, far past 2**64
        b"\x80\x00",  # overlong 0
        b"\xff\x00",  # overlong 127
        b"\x80\x80\x00",
        b"\x80",  # cut off by the end of the body
    ],
)
def test_uv_refused(wire: bytes) -> None:
    refused(raw(Kind.PING, wire))


def test_uv_refused_in_message_length_and_ack_values() -> None:
    refused(b"\x28\x81\x00" + b"\x00")  # overlong length
    refused(b"\x28" + b"\xff" * 11)  # length longer than 10 bytes
    refused(raw(Kind.ACK, b"\x01\x05\x80\x00"))  # overlong value after the topic
    refused(raw(Kind.ACK, b"\x01\x05\x80"))  # a value cut off by the end of the body


def test_uv_bounded_by_its_message_not_the_frame() -> None:
    # The PING body is one byte with the continuation bit; the next message must not lend it
    # the rest of its varint.
    refused(raw(Kind.PING, b"\x80") + raw(Kind.PING, b"\x01"))


# --------------------------------------------------------------------------- malformed input


def test_empty_frame_refused() -> None:
    for empty in (b"", bytearray(), memoryview(b"")):
        refused(empty)
        with pytest.raises(ProtocolError):
            iter_messages(empty)


def test_non_bytes_frame_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        decode_frame("\x28\x01\x00")  # type: ignore[arg-type]


def test_every_truncation_decodes_a_prefix_then_refuses() -> None:
    encoded = [encode(m) for m in ONE_OF_EACH]
    frame = b"".join(encoded)
    boundaries = {0}
    for e in encoded:
        boundaries.add(max(boundaries) + len(e))
    for cut in range(len(frame) + 1):
        got: list[Message] = []
        try:
            for m in iter_messages(frame[:cut]):
                got.append(m)
        except ProtocolError:
            complete = False
        else:
            complete = True
        # A cut between two messages leaves a well-formed shorter frame (but not an empty one);
        # any other cut refuses the message it falls in, after yielding the ones before it.
        assert complete == (cut in boundaries and cut > 0)
        assert got == ONE_OF_EACH[: len(got)]
        assert sum(len(e) for e in encoded[: len(got)]) <= cut < sum(
            len(e) for e in encoded[: len(got) + 1]
        ) or (complete and cut == len(frame))


@FAST
@given(frames, st.data())
def test_random_truncation_and_corruption(msgs: list[Message], data: st.DataObject) -> None:
    frame = encode_frame(msgs)
    cut = data.draw(st.integers(0, len(frame)))
    try:
        got = list(iter_messages(frame[:cut]))
    except ProtocolError:
        pass
    else:
        assert got == msgs[: len(got)]
    corrupt = bytearray(frame)
    at = data.draw(st.integers(0, len(frame) - 1))
    corrupt[at] = data.draw(st.integers(0, 255))
    try:
        decode_frame(corrupt)
    except ProtocolError:
        pass


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64))
@example(b"\x00")
@example(b"\x80\x00")
@example(b"\xa5\x00")
def test_random_bytes_only_raise_protocol_error(data: bytes) -> None:
    try:
        decode_frame(data)
    except ProtocolError as e:
        assert e.code == ErrorCode.PROTOCOL


known_kind_bytes = st.sampled_from([k | c for k in Kind for c in (0, COMPRESSED)])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(known_kind_bytes, st.binary(max_size=24)), min_size=1, max_size=4))
def test_random_bodies_only_raise_protocol_error(parts: list[tuple[int, bytes]]) -> None:
    # Well-framed messages of real kinds with garbage bodies reach every field parser.
    try:
        decode_frame(b"".join(raw(k, body) for k, body in parts))
    except ProtocolError as e:
        assert e.code == ErrorCode.PROTOCOL


def test_length_past_end_of_frame() -> None:
    e = refused(b"\x28\x05\x01")
    assert "PING" in str(e) and "5" in str(e)


def test_body_too_short_for_its_fields() -> None:
    for msg in ONE_OF_EACH:
        kind, body = split_message(encode(msg))
        if kind in COMPRESSIBLE or kind in (Kind.ACK, Kind.REVOKE):
            shortest = {
                Kind.PUSH: 2,
                Kind.RESULT: 2,
                Kind.STREAM: 2,
                Kind.ITEM: 3,
                Kind.ENTRY: 10,
                Kind.SUBSCRIBE: 10,
                Kind.CALL: 6,
                Kind.PUBLISH: 6,
                Kind.ACK: 1,
                Kind.REVOKE: 1,
            }[Kind(kind)]
        else:
            shortest = len(body)
        for cut in range(shortest):
            refused(raw(kind, body[:cut]))


def test_bad_utf8_names_kind_field_and_offset() -> None:
    frame = encode(Ping(1)) + raw(Kind.SUBSCRIBE, b"\x01\x03ab\xff\x00\x00")
    e = refused(frame)
    assert str(e) == "SUBSCRIBE: name is not valid UTF-8 at offset 9"
    refused(raw(Kind.HELLO, b"\x01\x02\xed\xa0"))  # encoded surrogate half
    refused(raw(Kind.GOODBYE, b"\x01\x01\xc3"))  # cut-off sequence


@pytest.mark.parametrize(
    "msg",
    [
        Welcome("", "", 1, 1, True),
        Stream(1, True, b"x"),
        Subscribed(1, 2, 1, 0, 0, 0, True, "n"),
        Nack(1, 2, True),
    ],
)
@pytest.mark.parametrize("value", [2, 0x80, 0xFF])
def test_boolean_other_than_0_or_1_refused(msg: Message, value: int) -> None:
    kind, body = split_message(encode(msg))
    at = {Kind.WELCOME: 4, Kind.STREAM: 1, Kind.SUBSCRIBED: 6, Kind.NACK: 2}[Kind(kind)]
    assert body[at] == 1
    e = refused(raw(kind, body[:at] + bytes([value]) + body[at + 1 :]))
    assert "expected 0 or 1" in str(e)


def test_trailing_bytes_ignored_on_fixed_layout_kinds() -> None:
    for msg in ONE_OF_EACH:
        kind, body = split_message(encode(msg))
        if kind in COMPRESSIBLE or kind in (Kind.ACK, Kind.REVOKE):
            continue
        assert decode_frame(raw(kind, body + b"\xff\x80\x00")) == [msg]


def test_lazy_iteration_yields_before_the_error() -> None:
    it = iter_messages(encode(Ping(1)) + b"\x28\x05")
    assert next(it) == Ping(1)
    with pytest.raises(ProtocolError):
        next(it)


# --------------------------------------------------------------------------- kinds and bits


def test_unknown_kinds_skipped() -> None:
    frame = (
        encode(Ping(1))
        + raw(0x00, b"")
        + raw(0x30, b"\xff\xff\xff")  # not even a valid body for anything
        + raw(0x7F | COMPRESSED, b"\x00" * 200)  # multi-byte length
        + raw(0x1E, b"")
        + encode(Pong(2))
        + raw(0x20 | COMPRESSED, b"\x01")
    )
    assert decode_frame(frame) == [Ping(1), Pong(2)]
    assert decode_frame(raw(0x55, b"x")) == []  # not empty: it held a message we do not know


def test_unknown_kind_length_still_checked() -> None:
    refused(raw(0x30, b"abc")[:-1])
    refused(b"\x30\x80\x00")


@pytest.mark.parametrize("kind", sorted(set(Kind) - COMPRESSIBLE))
def test_compressed_bit_on_non_compressible_kind_refused(kind: Kind) -> None:
    msg = next(m for m in ONE_OF_EACH if split_message(encode(m))[0] == kind)
    _, body = split_message(encode(msg))
    e = refused(encode(Ping(1)) + raw(kind | COMPRESSED, body))
    assert kind.name in str(e) and "COMPRESSED" in str(e)


def test_compressed_bit_kept_as_flag() -> None:
    deflated = b"\xcb\x48\xcd\xc9\xc9\x07\x00"  # raw DEFLATE of b"hello": left as is
    wire = push_message(7, 9, deflated, compressed=True)
    assert wire[0] == Kind.PUSH | COMPRESSED
    assert decode_frame(wire) == [Push(7, 9, deflated, compressed=True)]
    for msg in (
        Result(1, 0, deflated, True),
        Stream(1, False, deflated, True),
        Subscribe(1, "t", 0, 0, deflated, True),
        Call(1, "m", deflated, True),
        Publish(1, "t", deflated, True),
    ):
        wire = encode(msg)
        assert wire[0] & COMPRESSED
        assert decode_frame(wire) == [msg]


# --------------------------------------------------------------------------- ACK


def test_ack_private() -> None:
    ack = Ack.private(7, 300)
    assert ack == Ack(7, (300,))
    assert ack.upto == 300
    assert encode(ack) == b"\x25\x03\x07\xac\x02"
    assert decode_frame(encode(ack))[0] == ack


def test_ack_items() -> None:
    ack = Ack.items(7, [10, 11, 300])
    assert ack == Ack(7, (3, 10, 11, 300))
    assert ack.items == (10, 11, 300)
    decoded = decode_frame(encode(ack))[0]
    assert isinstance(decoded, Ack) and decoded.items == (10, 11, 300)
    empty = Ack.items(7, ())
    assert empty.values == (0,) and empty.items == ()


def test_ack_helpers_refuse_bad_shapes() -> None:
    bare = decode_frame(raw(Kind.ACK, b"\x07"))[0]
    assert bare == Ack(7, ())
    for bad, attr in [(bare, "upto"), (bare, "items"), (Ack(7, (3, 1, 2)), "items")]:
        with pytest.raises(ProtocolError) as info:
            getattr(bad, attr)
        assert info.value.code == ErrorCode.PROTOCOL
    assert Ack(7, (5, 1)).upto == 5  # a private ACK with extra values still reads its upto


@FAST
@given(uvs, st.lists(uvs, max_size=8))
def test_ack_items_round_trip(topic: int, seqs: list[int]) -> None:
    decoded = decode_frame(encode(Ack.items(topic, seqs)))[0]
    assert isinstance(decoded, Ack) and decoded.items == tuple(seqs)


# --------------------------------------------------------------------------- ITEM and REVOKE


def test_item_message_matches_the_generated_encoder() -> None:
    for compressed in (False, True):
        msg = Item(300, 70_000, 2, b'{"job":1}', compressed)
        assert item_message(300, 70_000, 2, b'{"job":1}', compressed) == encode(msg)
        assert decode_frame(encode(msg)) == [msg]
    assert encode(Item(1, 2, 3, b"x")) == b"\x0c\x04\x01\x02\x03x"


def test_revoke_tags() -> None:
    r = Revoke.of(7, [4, 5, 200])
    assert r == Revoke(7, (3, 4, 5, 200)) and r.tags == (4, 5, 200)
    decoded = decode_frame(encode(r))[0]
    assert isinstance(decoded, Revoke) and decoded.tags == (4, 5, 200)
    with pytest.raises(ProtocolError) as info:
        _ = Revoke(7, (2, 4)).tags
    assert info.value.code == ErrorCode.PROTOCOL and "REVOKE" in str(info.value)

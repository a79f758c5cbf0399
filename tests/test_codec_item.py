"""The per-topic ITEM encoder (protocol.codec.item_encoder) writes what the generated one does.

The frame builder sends every queue delivery through it, so its shortcuts (the topic's uv
worked out once, a cached byte for a small attempt) must not change a byte of the wire."""

from __future__ import annotations

import pytest

from rubris_asgi.protocol import Item, decode_frame, encode, item_message
from rubris_asgi.protocol.codec import item_encoder


@pytest.mark.parametrize("topic", [0, 1, 127, 128, 300, 70_000, 2**40])
@pytest.mark.parametrize("attempt", [0, 1, 2, 127, 128, 300])
@pytest.mark.parametrize("compressed", [False, True])
def test_item_encoder_matches_the_generated_encoder(
    topic: int, attempt: int, compressed: bool
) -> None:
    encode_item = item_encoder(topic)
    for tag in (1, 127, 128, 16_384, 2**21, 2**63):
        for payload in (b"", b'{"job":1}', bytes(200)):
            want = encode(Item(topic, tag, attempt, payload, compressed))
            got = encode_item(tag, attempt, payload, compressed)
            assert got == want
            assert item_message(topic, tag, attempt, payload, compressed) == want
            assert decode_frame(got) == [Item(topic, tag, attempt, payload, compressed)]


def test_item_encoder_refuses_what_the_wire_cannot_carry() -> None:
    encode_item = item_encoder(5)
    with pytest.raises(ValueError):
        encode_item(-1, 1, b"x", False)
    with pytest.raises(ValueError):
        encode_item(1, -1, b"x", False)
    with pytest.raises(ValueError):
        encode_item(1, 2**64, b"x", False)
    with pytest.raises(ValueError):
        item_encoder(-1)

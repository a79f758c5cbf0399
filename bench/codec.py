"""Codec micro-benchmark: the wire codec's hot paths, on one core.

Not a test. It times what runs per message in a busy server or client:

- ``push``: ``push_message``, the PUSH built once per publish (the fan-out path);
- ``encode``: ``encode()`` of a mix of the other kinds (SUBSCRIBED, RESULT, GAP, PONG, ACK);
- ``decode_push``: ``decode_frame`` of a 64 KiB-class frame of 200 PUSH messages, per message
  (what a client reads);
- ``decode_client``: ``decode_frame`` of a typical client frame (ACK, NAK, PING, SUBSCRIBE,
  CALL), per message (what the server reads).

Each figure is the median of several rounds, in nanoseconds per message.

    python3 bench/codec.py            # last line: push_ns=N encode_ns=N decode_push_ns=N ...
    python3 bench/codec.py --quick
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from rubris_asgi.protocol import (  # noqa: E402
    Ack,
    Call,
    Gap,
    Message,
    Nak,
    Ping,
    Pong,
    Result,
    Subscribe,
    Subscribed,
    decode_frame,
    encode,
    encode_frame,
    push_message,
)

PAYLOAD = b'{"symbol":"AAPL","bid":101.25,"ask":101.27,"ts":1763700000000}'


def per_op_ns(fn: Callable[[], object], ops: int, rounds: int) -> float:
    """Median nanoseconds per operation of ``fn`` (which performs ``ops`` operations)."""
    samples = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            fn()
            samples.append((time.perf_counter_ns() - t0) / ops)
    finally:
        gc.enable()
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rounds = 5 if args.quick else 21
    n = 20_000

    def push() -> None:
        for i in range(n):
            push_message(7, 100_000 + i, PAYLOAD)

    mix: list[Message] = [
        Subscribed(3, 7, 2, 0, 123456789, 1000, False, "prices.AAPL"),
        Result(42, 0, PAYLOAD),
        Gap(7, 1000, 12),
        Pong(99),
        Ack(7, (1, 2000)),
    ]
    mix_n = n // len(mix)

    def encode_mix() -> None:
        for _ in range(mix_n):
            for m in mix:
                encode(m)

    push_frame = b"".join(push_message(7, 100_000 + i, PAYLOAD) for i in range(200))
    frames = 100

    def decode_push() -> None:
        for _ in range(frames):
            decode_frame(push_frame)

    client_frame = encode_frame(
        [
            Ack(7, (1, 2000)),
            Nak(50),
            Ping(12345),
            Subscribe(4, "prices.MSFT", 0, 0, b"{}"),
            Call(9, "place_order", PAYLOAD),
        ]
    )

    def decode_client() -> None:
        for _ in range(n // 5):
            decode_frame(client_frame)

    figures = {
        "push_ns": per_op_ns(push, n, rounds),
        "encode_ns": per_op_ns(encode_mix, mix_n * len(mix), rounds),
        "decode_push_ns": per_op_ns(decode_push, frames * 200, rounds),
        "decode_client_ns": per_op_ns(decode_client, (n // 5) * 5, rounds),
    }
    print(f"cores={os.cpu_count()} python={sys.version.split()[0]} rounds={rounds}")
    for key, value in figures.items():
        print(f"{key:18} {value:8.0f} ns per message (median)")
    print(" ".join(f"{k}={v:.0f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()

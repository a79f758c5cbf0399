"""Engine benchmark: message deliveries into frames per second, and cycle time, on one core.

Not a test. Sans-IO: no sockets, so it measures the scheduler's own cost: the fan-out, the
per-session fair slice and frame assembly. Every topic publishes once per cycle and every
subscriber receives it, so deliveries per cycle = sessions x topics per session.

    python3 bench/engine.py            # both cases; last line: deliveries_per_s=N (1,000 x 100)
    python3 bench/engine.py --quick    # fewer cycles
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from rubris_asgi.engine.buffers import FrameBuffer  # noqa: E402
from rubris_asgi.engine.engine import Engine  # noqa: E402
from rubris_asgi.engine.session import Session  # noqa: E402
from rubris_asgi.protocol import Mode  # noqa: E402


class NullSink:
    """A transport whose writes complete at once: only the engine's cost is measured."""

    __slots__ = ("engine", "session", "frames", "bytes")
    writing_since = 0.0  # FrameSink's: never a write in progress

    def __init__(self, engine: Engine, session: Session) -> None:
        self.engine = engine
        self.session = session
        self.frames = 0
        self.bytes = 0

    def write_now(self, frame: bytes) -> bool:
        self.frames += 1  # written at once, as a socket with room takes it (uvicorn)
        self.bytes += len(frame)
        return True

    def send_frame(self, frame: bytes, lease: FrameBuffer) -> None:
        self.frames += 1
        self.bytes += len(frame)
        self.engine.frame_done(self.session, lease)


def run_case(sessions: int, topics: int, cycles: int, mode: int) -> dict[str, float]:
    e = Engine()
    ts = [e.topic(f"t{i}", mode) for i in range(topics)]
    sinks = []
    for _ in range(sessions):
        s = e.open_session()
        sink = NullSink(e, s)
        e.attach(s, sink)
        for j, t in enumerate(ts):
            e.subscribe(s, t, j, 0, 0)
        sinks.append(sink)
    e.scheduler.run_cycle()  # SUBSCRIBED frames
    payload = {"bid": 101.25, "ask": 101.27, "ts": 1763700000000}
    times = []
    publish_times = []
    delivered0 = e.scheduler.stats.messages
    gc.collect()
    gc.disable()
    try:
        for _ in range(cycles):
            p0 = time.perf_counter()
            for t in ts:
                e.publish(t, payload)
            p1 = time.perf_counter()
            e.scheduler.run_cycle()
            p2 = time.perf_counter()
            publish_times.append((p1 - p0) / topics)
            times.append(p2 - p1)
    finally:
        gc.enable()
    delivered = e.scheduler.stats.messages - delivered0
    total = sum(times)
    msg_size = len(ts[0].msg)
    return {
        "sessions": sessions,
        "topics": topics,
        "msg_bytes": msg_size,
        "deliveries": delivered,
        "deliveries_per_s": delivered / total,
        "cycle_ms_median": statistics.median(times) * 1000,
        "publish_us_median": statistics.median(publish_times) * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mode", choices=["snapshot", "ring"], default="snapshot")
    args = ap.parse_args()
    mode = Mode.SNAPSHOT if args.mode == "snapshot" else Mode.RING
    n = 5 if args.quick else 20
    print(f"cores={os.cpu_count()} python={sys.version.split()[0]} mode={args.mode}")
    wide = run_case(10_000, 1, n * 5, mode)
    print(
        f"10,000 sessions x 1 topic: {wide['deliveries_per_s']:,.0f} deliveries/s, "
        f"cycle {wide['cycle_ms_median']:.2f} ms median, message {wide['msg_bytes']} B"
    )
    main_case = run_case(1_000, 100, n, mode)
    print(
        f"1,000 sessions x 100 topics: {main_case['deliveries_per_s']:,.0f} deliveries/s, "
        f"cycle {main_case['cycle_ms_median']:.2f} ms median, message {main_case['msg_bytes']} B, "
        f"publish {main_case['publish_us_median']:.2f} us median"
    )
    print(f"deliveries_per_s={main_case['deliveries_per_s']:.0f}")


if __name__ == "__main__":
    main()

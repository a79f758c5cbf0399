"""In-memory test kit for the sans-IO engine: a fake clock and a transport that records frames."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from rubris_asgi.engine.buffers import FrameBuffer
from rubris_asgi.engine.engine import Engine
from rubris_asgi.engine.session import Session
from rubris_asgi.protocol import Message, Push, decode_frame


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class RecordingSink:
    """A transport that 'writes' at once (or holds frames when ``auto`` is off).

    ``at_once``: frames are written by ``write_now``, with no lease (a socket with room under
    uvicorn); otherwise each is handed over with its lease and, with ``auto``, completed at once
    (a server's ``send`` that finishes on its first step)."""

    engine: Engine
    session: Session
    auto: bool = True
    frames: list[bytes] = field(default_factory=list)
    held: list[FrameBuffer] = field(default_factory=list)
    writing_since: float = 0.0  # FrameSink's: frames are taken at once (or held, unwritten)
    at_once: bool = False

    def write_now(self, frame: bytes) -> bool:
        if self.at_once:
            self.frames.append(frame)
        return self.at_once

    def send_frame(self, frame: bytes, lease: FrameBuffer) -> None:
        self.frames.append(frame)
        if self.auto:
            self.engine.frame_done(self.session, lease)
        else:
            self.held.append(lease)

    def complete(self) -> None:
        for lease in self.held:
            self.engine.frame_done(self.session, lease)
        self.held.clear()

    def messages(self) -> list[list[Message]]:
        return [decode_frame(f) for f in self.frames]

    def take(self) -> list[list[Message]]:
        out = self.messages()
        self.frames.clear()
        return out


def connect(
    engine: Engine, *, auto: bool = True, at_once: bool = False
) -> tuple[Session, RecordingSink]:
    s = engine.open_session()
    sink = RecordingSink(engine, s, auto=auto, at_once=at_once)
    engine.attach(s, sink)
    return s, sink


async def arrived(sink: RecordingSink, kind: type, n: int = 1) -> list[Any]:
    """Every message of ``kind`` the sink received so far, once there are ``n`` of them (a
    running app's scheduler delivers them; waits up to 3 s)."""
    got: list[Any] = []
    for _ in range(300):
        got = [m for f in sink.messages() for m in f if isinstance(m, kind)]
        if len(got) >= n:
            return got
        await asyncio.sleep(0.01)
    raise AssertionError(f"only {len(got)} {kind.__name__} arrived")


def pushes(frame: list[Message]) -> list[tuple[int, int, bytes]]:
    return [(m.topic, m.seq, m.payload) for m in frame if isinstance(m, Push)]

"""In-memory test kit for the sans-IO engine: a fake clock and a transport that records frames."""

from __future__ import annotations

from dataclasses import dataclass, field

from rubris_asgi.buffers import FrameBuffer
from rubris_asgi.engine import Engine
from rubris_asgi.protocol import Message, Push, decode_frame
from rubris_asgi.session import Session


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class RecordingSink:
    """A transport that 'writes' at once (or holds frames when ``auto`` is off)."""

    engine: Engine
    session: Session
    auto: bool = True
    frames: list[bytes] = field(default_factory=list)
    held: list[FrameBuffer] = field(default_factory=list)

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


def connect(engine: Engine, *, auto: bool = True) -> tuple[Session, RecordingSink]:
    s = engine.open_session()
    sink = RecordingSink(engine, s, auto=auto)
    engine.attach(s, sink)
    return s, sink


def pushes(frame: list[Message]) -> list[tuple[int, int, bytes]]:
    return [(m.topic, m.seq, m.payload) for m in frame if isinstance(m, Push)]

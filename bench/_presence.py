"""bench/tables.py's ``presence_converge_ms``: 1,000 sessions joining and leaving a topic with
presence across 2 nodes sharing a Redis (a ``redis-server`` this module starts on a free port
of 127.0.0.1 and stops), until both nodes' ``{topic}@presence`` tables equal the truth.

Sans-socket: the sessions are the engines' own (a session attached to a sink that takes every
frame), so what is timed is presence itself: each node's book, its batches to Redis, the
scripts, and the changes heard back by both nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

from rubris_asgi import Rubris
from rubris_asgi.cluster.redis.broker import RedisBroker
from rubris_asgi.engine.buffers import FrameBuffer
from rubris_asgi.engine.engine import Engine
from rubris_asgi.engine.keyed.topic import KeyedTopic
from rubris_asgi.engine.session import Session

USERS = 700
"""1,000 sessions of 700 users: some users have two or three tabs, spread over both nodes."""


class Sink:
    writing_since = 0.0

    def __init__(self, engine: Engine, session: Session) -> None:
        self.engine = engine
        self.session = session

    def write_now(self, frame: bytes) -> bool:
        return True

    def send_frame(self, frame: bytes, lease: FrameBuffer) -> None:
        self.engine.frame_done(self.session, lease)


@contextlib.asynccontextmanager
async def redis_server() -> AsyncIterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("presence_converge_ms needs redis-server (apt-get install redis-server)")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with tempfile.TemporaryDirectory() as d:
        proc = await asyncio.create_subprocess_exec(
            *[exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", d],
            stdout=subprocess.DEVNULL,
        )
        try:
            for _ in range(200):
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                    break
                await asyncio.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            await proc.wait()


def node(url: str) -> Rubris:
    rubris = Rubris(broker=RedisBroker(url, node_timeout=3.0, allow_volatile=True), batches=False)

    @rubris.shared("room.{id}", ring=8, presence=True)
    def room(session: Any, id: str) -> None:  # noqa: A002
        return None

    return rubris


async def follow(rubris: Rubris, name: str) -> Any:
    found = rubris.registry.match(name)
    assert found is not None
    t = rubris.engine.topic_of(name, found[0])
    await rubris.broker.follow(t)
    return t


async def converge_ms(sessions: int) -> float:
    """The longer of: all joins seen on both nodes; then half of the sessions ended, seen."""
    async with redis_server() as url:
        a, b = node(url), node(url)
        async with a, b:
            rooms = [await follow(r, "room.1") for r in (a, b)]
            tables = [await follow(r, "room.1@presence") for r in (a, b)]
            opened: list[tuple[Rubris, Session]] = []
            truth: dict[str, int] = {}

            def seen() -> bool:
                for t in tables:
                    assert isinstance(t, KeyedTopic)
                    got = {k: v["sessions"] for k, v in t.values().items()}
                    if got != truth:
                        return False
                return True

            async def until_seen() -> float:
                start = time.monotonic()
                while not seen():
                    if time.monotonic() - start > 30:
                        raise AssertionError("presence did not converge in 30 s")
                    await asyncio.sleep(0.001)
                return (time.monotonic() - start) * 1000

            start = time.monotonic()
            for i in range(sessions):
                r, t = (a, rooms[0]) if i % 2 else (b, rooms[1])
                user = f"user{i % USERS}"
                s = r.engine.open_session(owner=user)
                r.engine.attach(s, Sink(r.engine, s))
                r.engine.subscribe(s, t, 1, 0, 0)
                opened.append((r, s))
                truth[user] = truth.get(user, 0) + 1
            joined = (time.monotonic() - start) * 1000 + await until_seen()
            start = time.monotonic()
            for r, s in opened[::2]:
                r.engine.end_session(s)
                user = str(s.owner)
                truth[user] -= 1
                if not truth[user]:
                    del truth[user]
            left = (time.monotonic() - start) * 1000 + await until_seen()
            print(
                f"presence, {sessions} sessions of {min(sessions, USERS)} users on 2 nodes: "
                f"joins seen on both in {joined:.0f} ms, half of them ended in {left:.0f} ms"
            )
            return max(joined, left)


if __name__ == "__main__":
    print(asyncio.run(converge_ms(int(os.environ.get("SESSIONS", "1000")))))

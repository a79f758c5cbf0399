"""One client stops reading while 200 others keep receiving (seed 001, blocked writes).

The 200 subscribers run in a process of their own and measure publish-to-receive latency over
three windows of the same traffic, side by side: without the stalled client, with it, and
without it again (so the stalled window is compared with the machine's noise on both sides).
The stalled client is a raw TCP socket with a tiny receive buffer that does the WebSocket
handshake by hand and then never reads. Asserted: while it is blocked the others receive every
publish; their p99 stays within a generous factor of the baseline; nothing is lost for them;
the stalled session holds at most one frame lease, and after ``WriterConfig.max_blocked`` it is
ended with GOODBYE 7 and close 1013.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rubris_asgi import Codec, Config, Rubris, Session, Timing, WriterConfig
from rubris_asgi.protocol import Goodbye, Hello, Subscribe, decode_frame, encode_frame
from rubris_asgi.server.websocket import WebSocketConnection

from .apps import starlette_app
from .server import run_server
from .wirekit import parse_server_frames, raw_ws_handshake, until, ws_client_frame, ws_url

CLIENTS = 200
PER_PHASE = 150
INTERVAL = 0.020
MAX_BLOCKED = 1.5


def app() -> Rubris:
    rubris = Rubris(
        Config(
            writer=WriterConfig(max_blocked=MAX_BLOCKED),
            timing=Timing(session_timeout=5.0),
        )
    )

    @rubris.shared("feed", ring=1024)  # deep enough that a busy test machine never laps anyone
    async def feed(session: Session) -> None:
        return None

    @rubris.shared("fat", ring=64, codec=Codec.BYTES, compress_at=None)
    async def fat(session: Session) -> None:
        return None

    return rubris


@dataclass
class Watch:
    """Samples of the stalled session's state, every few milliseconds."""

    max_leases: int = 0
    max_stalled_leases: int = 0
    blocked_since: float = 0.0
    ended_at: float = 0.0
    published: list[int] = field(default_factory=list)
    """The feed's seq when the stalled client blocked and when it was ended."""
    delivered: list[int] = field(default_factory=list)
    """Messages the engine had handed to transports at those two moments."""


async def publish_phase(rubris: Rubris, name: str, n: int = PER_PHASE) -> None:
    for _ in range(n):
        rubris.publish("feed", {"t": time.monotonic(), "p": name})
        await asyncio.sleep(INTERVAL)
    rubris.publish("feed", {"end": name})


async def read_report(stdout: asyncio.StreamReader, phase: str) -> dict[str, Any]:
    line = await asyncio.wait_for(stdout.readline(), 20)
    report = json.loads(line)
    assert report["phase"] == phase, report
    return report  # type: ignore[no-any-return]


@pytest.mark.slow
async def test_a_stalled_client_does_not_slow_the_others() -> None:
    rubris = app()
    async with run_server(starlette_app(rubris)) as base:
        port = int(base.rsplit(":", 1)[1])
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.latencyclient",
            ws_url(base),
            "feed",
            str(CLIENTS),
            stdout=asyncio.subprocess.PIPE,
            cwd=str(Path(__file__).parent.parent),
        )
        stalled: socket.socket | None = None
        try:
            assert proc.stdout is not None
            assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"ready\n"
            await until(lambda: len(rubris.engine.topics["feed"].subs) == CLIENTS)

            # a warm-up phase, not measured: first connections' buffers, caches, allocator
            await publish_phase(rubris, "W", 50)
            await read_report(proc.stdout, "W")

            # phase A: the baseline
            await publish_phase(rubris, "A")
            before = await read_report(proc.stdout, "A")

            # phase B: the same, with a client that has stopped reading
            stalled, status, _ = await raw_ws_handshake(port, rcvbuf=4096)
            assert status == 101
            hello = encode_frame(
                [Hello(1, ""), Subscribe(1, "feed", 0, 0, b""), Subscribe(2, "fat", 0, 0, b"")]
            )
            await asyncio.get_running_loop().sock_sendall(stalled, ws_client_frame(hello))
            topics = rubris.engine.topics
            await until(lambda: "fat" in topics and len(topics["fat"].subs) == 1)
            [sub] = topics["fat"].subs
            session: Session = sub.session  # type: ignore[assignment]
            conn = session.sink
            assert isinstance(conn, WebSocketConnection)
            watch = Watch()

            async def watcher() -> None:
                while not watch.ended_at:
                    pool = rubris.stats().pool
                    leases = pool.in_use_block + pool.in_use_large + pool.in_use_unpooled
                    watch.max_leases = max(watch.max_leases, leases)
                    mine = 1 if conn.writing is not None else 0
                    watch.max_stalled_leases = max(watch.max_stalled_leases, mine)
                    if conn.writing_since and not watch.blocked_since:
                        watch.blocked_since = conn.writing_since
                        watch.published.append(topics["feed"].seq)
                        watch.delivered.append(rubris.stats().cycle.messages)
                    if session.id not in rubris.engine.sessions:
                        watch.ended_at = time.monotonic()
                        watch.published.append(topics["feed"].seq)
                        watch.delivered.append(rubris.stats().cycle.messages)
                    await asyncio.sleep(0.005)

            async def filler() -> None:
                # only the stalled client subscribes to "fat": its buffers fill in a moment
                blob = os.urandom(128 * 1024)
                for _ in range(200):
                    if watch.blocked_since or watch.ended_at:
                        return
                    rubris.publish("fat", blob)
                    await asyncio.sleep(INTERVAL)

            async def wake_up() -> tuple[int, int]:
                # once it has been ended, the stalled client reads again
                await asyncio.wait_for(watching, 15)
                assert stalled is not None
                return await drain_stalled(stalled)

            watching = asyncio.create_task(watcher())
            filling = asyncio.create_task(filler())
            waking = asyncio.create_task(wake_up())
            await publish_phase(rubris, "B")
            during = await read_report(proc.stdout, "B")
            await filling
            goodbye, close = await asyncio.wait_for(waking, 20)

            # phase C: the baseline again, so that B is compared with the machine's noise on
            # both sides of it (other work on a small machine comes and goes)
            await publish_phase(rubris, "C")
            after = await read_report(proc.stdout, "C")
            rubris.publish("feed", {"quit": 1})
            assert await asyncio.wait_for(proc.wait(), 20) == 0

            # the stalled client: blocked, then ended after max_blocked (housekeeping runs
            # every max_blocked / 4), holding at most one frame lease meanwhile
            assert watch.blocked_since, "the stalled client never blocked"
            held_for = watch.ended_at - watch.blocked_since
            assert MAX_BLOCKED <= held_for <= MAX_BLOCKED + 1.5, held_for
            assert watch.max_stalled_leases == 1
            assert watch.max_leases <= 5, watch.max_leases
            assert conn not in rubris.websocket.connections
            pool = rubris.stats().pool
            assert (pool.in_use_block, pool.in_use_large, pool.in_use_unpooled) == (0, 0, 0)
            # reading again, it got what was queued, then GOODBYE 7 and close 1013
            assert (goodbye, close) == (7, 1013), DRAINED

            # while it was blocked the others kept receiving, publish for publish: a cycle that
            # waited for the stalled socket would have delivered nothing in that time
            published = watch.published[1] - watch.published[0]
            delivered = watch.delivered[1] - watch.delivered[0]
            # (a precondition, not a bound: enough publishes fell in the blocked window for the
            # delivery check below to mean something. The filler shares the loop with the
            # server and sleeps INTERVAL between publishes; on a loaded 2-core machine 32 of the
            # nominal 75 fell in it, so the old "half of nominal" failed a run that had shown
            # exactly what this test is about)
            assert published >= 15, published
            assert delivered >= CLIENTS * (published - 5), (published, delivered)

            # the others: nothing lost, and latency within a generous factor of the baseline.
            # The slack is for the machine, not for rubris: on a 2-core machine with other work
            # running, the p99 of back-to-back 3 s windows without any stalled client ranged
            # from 13 to 285 ms (a pause of the whole process delays every client at once); a
            # cycle held up by the stalled client would put max_blocked (1.5 s) on half of
            # phase B's messages.
            for report in (before, during, after):
                assert report["per_client_min"] == PER_PHASE, report
                assert report["gaps"] == 0, report
            baseline = max(before["p99"], after["p99"])
            print(
                f"\np99 without the stalled client {before['p99'] * 1000:.1f} ms before, "
                f"{after['p99'] * 1000:.1f} ms after; with it {during['p99'] * 1000:.1f} ms. "
                f"p50 {before['p50'] * 1000:.1f} / {after['p50'] * 1000:.1f}; "
                f"{during['p50'] * 1000:.1f} ms. Stalled session ended {held_for:.2f} s "
                "after it blocked."
            )
            assert during["p99"] <= 5 * baseline + 0.300, (before, during, after)
            assert during["p50"] <= 5 * max(before["p50"], after["p50"]) + 0.020
        finally:
            if stalled is not None:
                stalled.close()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


DRAINED: dict[str, float] = {"bytes": 0, "seconds": 0.0}
"""What drain_stalled read, and how long it took (for a failure's message)."""


async def drain_stalled(sock: socket.socket) -> tuple[int, int]:
    """Read the stalled socket to its end: (the GOODBYE code, the close code).

    The server gives the GOODBYE and the close a bounded time each (2 s) behind the frames
    already in the socket (megabytes of "fat"). Read through the 4 KiB receive buffer that made
    this client stall, a loaded machine took longer than that to drain them, and the server
    gave up before its GOODBYE went out (CI, at load 4): a client reading again reads at its
    socket's speed, so the buffer is made an ordinary one first (the window it can grow to is
    fixed at the handshake, 64 KiB here: enough)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    loop = asyncio.get_running_loop()
    buf = b""
    goodbye = close = 0
    began = loop.time()
    deadline = began + 10
    while loop.time() < deadline and not close:
        try:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 3)
        except (asyncio.TimeoutError, ConnectionError):
            break
        if not chunk:
            break
        DRAINED["bytes"] += len(chunk)
        frames, buf = parse_server_frames(buf + chunk)
        for opcode, payload in frames:
            if opcode == 0x2:
                for m in decode_frame(payload):
                    if isinstance(m, Goodbye):
                        goodbye = m.code
            elif opcode == 0x8:
                close = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
    DRAINED["seconds"] = round(loop.time() - began, 3)
    return goodbye, close

"""Large messages on the wire (seed 001): every size up to the maximum arrives intact over both
transports, anything over it is refused to its publisher and never half-sent, and memory stays
bounded while many clients receive 1 MiB messages."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from rubris_asgi import Codec, Config, MessageTooLarge, PoolConfig, Rubris, Session, Timing
from rubris_asgi.client import CallError, Client
from rubris_asgi.protocol import Push, Subscribe, Subscribed, decode_frame

from .apps import starlette_app
from .server import run_server
from .wirekit import recv_until, until, ws_hello, ws_open, ws_url

TRANSPORTS = ["websocket", "longpoll"]
KIB = 1024
MIB = 1024 * KIB
HEADROOM = 32
"""What ``publish`` keeps free for the PUSH header: the largest payload is max_size - 32."""


def blob_app(pool: PoolConfig) -> Rubris:
    rubris = Rubris(Config(pool=pool, timing=Timing(poll_timeout=1.0, session_timeout=5.0)))

    @rubris.shared("blob", ring=16, codec=Codec.BYTES)
    async def blob(session: Session) -> None:
        return None

    @rubris.private("mine", codec=Codec.BYTES)
    async def mine(session: Session) -> None:
        return None

    @rubris.rpc("sized")
    async def sized(session: Session, n: Any) -> Any:
        return base64.b64encode(os.urandom(int(n)))[: int(n)].decode()  # deflate cannot halve it

    return rubris


SMALL = PoolConfig(block_size=16 * KIB, large_scale=4, max_scale=16, blocks=64, large_blocks=4)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_every_size_up_to_the_maximum_arrives_intact(transport: str) -> None:
    rubris = blob_app(SMALL)
    top = SMALL.max_size - HEADROOM  # 256 KiB - 32
    sizes = [
        1,
        SMALL.block_size - 64,  # fits a block
        SMALL.block_size + 1,  # just over a block: large pool
        SMALL.large_size,  # exactly a large block's worth of payload: unpooled x2
        100 * KIB,
        200 * KIB,
        top,
    ]
    payloads = [os.urandom(n) for n in sizes]  # random: deflate cannot shrink them
    async with run_server(starlette_app(rubris)) as base:
        async with Client(base + "/rubris", transport=transport) as c:  # type: ignore[arg-type]
            got: list[tuple[bytes, int]] = []
            await c.subscribe("blob", lambda v, info: got.append((v, info.seq)))
            # published back to back: small ones share frames, each large one goes alone
            for p in payloads:
                rubris.publish("blob", p)
            await until(lambda: len(got) == len(payloads), timeout=10)
            assert [hashlib.sha256(v).digest() for v, _ in got] == [
                hashlib.sha256(p).digest() for p in payloads
            ]
            assert [seq for _, seq in got] == list(range(1, len(payloads) + 1))
            stats = rubris.stats().pool
            assert stats.block >= 1 and stats.large >= 1 and stats.unpooled >= 4

            # over the maximum: refused to the publisher, nothing stored, nothing sent
            seq = rubris.engine.topics["blob"].seq
            for n in (top + 1, SMALL.max_size, 4 * MIB):
                with pytest.raises(MessageTooLarge):
                    rubris.publish("blob", os.urandom(n))
            assert rubris.engine.topics["blob"].seq == seq
            rubris.publish("blob", b"after")
            await until(lambda: len(got) == len(payloads) + 1)
            assert got[-1] == (b"after", seq + 1)  # no GAP, no fragment: the next seq

            # replies and private messages have the same ceiling
            with pytest.raises(CallError) as err:
                await c.call("sized", SMALL.max_size)
            assert err.value.code == 5
            assert len(await c.call("sized", 200 * KIB)) == 200 * KIB
            await c.subscribe("mine")
            session = rubris.engine.sessions[c.session_id]  # type: ignore[index]
            with pytest.raises(MessageTooLarge):
                rubris.send_nowait(session, "mine", os.urandom(top + 1))
            q = session.private("mine")
            assert q is not None and len(q) == 0 and q.seq == 0
            assert c.state == "open"
        # a long-poll session keeps its last frame's lease until the next poll acknowledges it
        pool = rubris.stats().pool
        assert pool.in_use_block + pool.in_use_large + pool.in_use_unpooled <= 1
    # the server has stopped and every session has ended: every lease is back
    pool = rubris.stats().pool
    assert (pool.in_use_block, pool.in_use_large, pool.in_use_unpooled) == (0, 0, 0)


async def test_a_large_message_does_not_hold_small_ones_back_on_the_wire() -> None:
    """Seed 001: a message that does not fit after others waits for the next frame; a large
    one goes alone in its own buffer, so the small ones published with it are not stuck
    behind it in one huge frame."""
    rubris = blob_app(SMALL)

    @rubris.shared("tick", ring=16, codec=Codec.BYTES)
    async def tick(session: Session) -> None:
        return None

    async with run_server(starlette_app(rubris)) as base:
        async with await ws_open(base, max_size=None) as ws:
            await ws_hello(ws, Subscribe(1, "blob", 0, 0, b""), Subscribe(2, "tick", 0, 0, b""))
            for _ in range(2):
                await recv_until(ws, lambda m: isinstance(m, Subscribed))
            big = os.urandom(200 * KIB)
            rubris.publish("tick", b"t1")
            rubris.publish("blob", big)
            rubris.publish("tick", b"t2")
            frames: list[list[Any]] = []
            while sum(len(f) for f in frames) < 3:
                frames.append(decode_frame(await asyncio.wait_for(ws.recv(), 5)))  # type: ignore[arg-type]
            sizes = [[len(m.payload) for m in f if isinstance(m, Push)] for f in frames]
            # the 200 KiB message never shares a frame
            assert [200 * KIB] in sizes
            assert all(len(f) == 1 for f in sizes if 200 * KIB in f)
            assert sorted(n for f in sizes for n in f) == [2, 2, 200 * KIB]


def stalled(rubris: Rubris) -> str:
    """The server's side of a delivery that stopped: what each unfinished session waits on."""
    e = rubris.engine
    lines = [
        f"{e.pool!r}; scheduler clients {len(e.scheduler.clients)}, timers "
        f"{len(e.scheduler.timers)}, paused {e.scheduler.paused}"
    ]
    now = e.clock()
    for s in list(e.sessions.values()):
        if not s.has_work():
            continue
        since = getattr(s.sink, "writing_since", 0.0)
        writing = now - since if since else 0.0
        lines.append(
            f"{s.id[:6]} {s.state.name} ready={s.ready} queued={s.queued} held={s.held} "
            f"hold={s.hold_until - now:+.3f} writing={writing:.3f}s pending={len(s.pending)}"
        )
    return "\n".join(lines)


@pytest.mark.slow
async def test_many_clients_receiving_1_mib_messages_keep_memory_bounded() -> None:
    """50 subscribers (in a process of their own) receive 1 MiB messages published back to
    back; the server's memory peak is a fraction of what it delivers, and every lease comes
    back."""
    pool = PoolConfig(block_size=64 * KIB, large_scale=4, max_scale=32, unpooled=8)
    rubris = blob_app(pool)
    clients, messages = 50, 8
    payloads = [os.urandom(MIB) for _ in range(messages)]
    async with run_server(starlette_app(rubris)) as base:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.bulkclient",
            ws_url(base),
            "blob",
            str(clients),
            str(messages),
            stdout=asyncio.subprocess.PIPE,
            cwd=str(Path(__file__).parent.parent),
        )
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line == b"ready\n", line
            await until(lambda: len(rubris.engine.topics["blob"].subs) == clients)
            tracemalloc.start()
            try:
                before, _ = tracemalloc.get_traced_memory()
                tracemalloc.reset_peak()
                for p in payloads:
                    rubris.publish("blob", p)
                    await asyncio.sleep(0.02)
                line = await asyncio.wait_for(proc.stdout.readline(), 60)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert line.strip(), stalled(rubris)  # the clients gave up: say what was stuck
            got = json.loads(line)
            assert got == [[hashlib.sha256(p).hexdigest() for p in payloads]] * clients
            assert await asyncio.wait_for(proc.wait(), 10) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        growth = peak - before
        delivered = clients * messages * MIB  # 400 MiB
        # What is held at once: the ring's messages (8 MiB), at most `unpooled` frames being
        # handed over by the engine, and per connection what the ASGI server buffers (about
        # one frame beyond its high-water mark) - not the 400 MiB that went through.
        assert growth < clients * 2 * MIB + messages * MIB, f"peak growth {growth / MIB:.0f} MiB"
        assert growth < delivered / 4
        stats = rubris.stats().pool
        assert stats.unpooled == clients * messages  # every 1 MiB frame: an unpooled frame
        await until(lambda: rubris.stats().pool.in_use_unpooled == 0)
        stats = rubris.stats().pool
        assert (stats.in_use_block, stats.in_use_large, stats.in_use_unpooled) == (0, 0, 0)
        print(f"server peak growth {growth / MIB:.1f} MiB for {delivered / MIB:.0f} MiB delivered")

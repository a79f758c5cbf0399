"""Exact resume and late joiners (protocol.md section 5), the clients against a real server.

A resumed session's ring topics go on from what the client holds: the client restates each
ring's epoch and last seq in the frame of its resuming HELLO, and the server replays what its
ring still holds after that, with a GAP first for what it lost, before anything newer. These
tests lose messages on purpose where they used to vanish: frames the server wrote to a
connection that dies before the client reads them (a WebSocket whose reader is paused and then
reset; long-poll responses lost on the way until the client says HELLO again), and check that
every ring seq arrives exactly once, in order, or inside a GAP.

The Python client here; the browser client in tests/test_browser_resume.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from rubris_asgi import Rubris
from rubris_asgi.client import Client, GapInfo, PushInfo

from .apps import make_rubris, starlette_app
from .server import run_server

TRANSPORTS = ["websocket", "longpoll"]
WAIT = 10.0


async def until(cond: Any, what: str, timeout: float = WAIT) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.01)


@dataclass
class Seen:
    """What one ring subscription delivered, in order: ``("push", seq)`` and
    ``("gap", start, count)``."""

    events: list[tuple[Any, ...]] = field(default_factory=list)

    def push(self, value: Any, info: PushInfo) -> None:
        assert value == info.seq, (value, info.seq)  # the tests publish seq n as the value n
        self.events.append(("push", info.seq))

    def gap(self, g: GapInfo) -> None:
        self.events.append(("gap", g.start, g.count))

    @property
    def seqs(self) -> list[int]:
        return [e[1] for e in self.events if e[0] == "push"]

    @property
    def top(self) -> int:
        """The highest seq delivered or named by a GAP."""
        top = 0
        for e in self.events:
            top = max(top, e[1] if e[0] == "push" else e[1] + e[2] - 1)
        return top

    def assert_exact(self, total: int, first: int = 1) -> None:
        """Every seq first … total exactly once, pushed or inside a GAP, in order."""
        expected = first
        for e in self.events:
            start, count = (e[1], 1) if e[0] == "push" else (e[1], e[2])
            assert start == expected, f"{e} where seq {expected} was due; events: {self.events}"
            assert count >= 1, e
            expected = start + count
        assert expected == total + 1, f"ended before {total}: {self.events}"


def publish(rubris: Rubris, topic: str, first: int, last: int) -> None:
    for n in range(first, last + 1):
        rubris.publish(topic, n)


# ---- WebSocket: frames written to a connection that dies unread -------------------------------


async def lose_unread_frames(rubris: Rubris, c: Client, topic: str, first: int, last: int) -> None:
    """Pause the client's socket, publish ``first … last`` (the server writes them into the
    socket), then reset the connection: what was written is never read."""
    link = c._link
    ws = getattr(link, "ws", None)
    assert ws is not None, "not a WebSocket link"
    transport = ws.transport
    transport.pause_reading()
    sid = c.session_id
    publish(rubris, topic, first, last)
    # until the scheduler has written them all: nothing of the topic waits in the session
    s = rubris.engine.sessions[sid]  # type: ignore[index]
    await until(lambda: not s.pending, "the server to write to the paused socket")
    await asyncio.sleep(0.1)
    transport.abort()  # RST: the bytes in flight are gone


@pytest.mark.parametrize("lost", [5, 20])  # within the ring of 8, and past it (a GAP)
async def test_websocket_resume_is_exact(lost: int) -> None:
    rubris = make_rubris()  # ring.* keeps 8
    async with run_server(starlette_app(rubris)) as base:
        async with Client(base + "/rubris", backoff=(0.05, 0.2)) as c:
            seen = Seen()
            sub = await c.subscribe("ring.x", seen.push, on_gap=seen.gap)
            publish(rubris, "ring.x", 1, 3)
            await until(lambda: seen.seqs == [1, 2, 3], "the first three")
            await lose_unread_frames(rubris, c, "ring.x", 4, 3 + lost)
            await until(lambda: c.stats.reconnects == 1 and c.state == "open", "the resume")
            assert c.resumed
            publish(rubris, "ring.x", 4 + lost, 6 + lost)
            await until(lambda: seen.top == 6 + lost, "everything, replayed or named by a GAP")
            seen.assert_exact(6 + lost)
            if lost <= 8:
                assert seen.seqs == list(range(1, 7 + lost)) and sub.recovered
            else:
                # the ring of 8 lost the oldest: one GAP names them, before anything newer
                assert [e for e in seen.events if e[0] == "gap"] == [("gap", 4, lost - 8)]
                assert not sub.recovered


async def test_websocket_resume_of_a_ring_empty_at_subscribe() -> None:
    # nothing received yet (head 0 at subscribe): the position restated is seq 0 of its epoch,
    # and what was published meanwhile arrives from seq 1
    rubris = make_rubris()
    async with run_server(starlette_app(rubris)) as base:
        async with Client(base + "/rubris", backoff=(0.05, 0.2)) as c:
            seen = Seen()
            await c.subscribe("ring.empty", seen.push, on_gap=seen.gap)
            await lose_unread_frames(rubris, c, "ring.empty", 1, 3)
            await until(lambda: c.stats.reconnects == 1 and c.state == "open", "the resume")
            publish(rubris, "ring.empty", 4, 4)
            await until(lambda: seen.top == 4, "everything")
            seen.assert_exact(4)


# ---- long-poll: responses lost until the client says HELLO again -----------------------------


class LosingPolls(httpx.AsyncBaseTransport):
    """Real HTTP, but while ``losing`` a poll that carries a frame loses its response (the
    server sent it), so the client retries, gives up and resumes with a new HELLO; that HELLO
    ends the losing."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.losing = False
        self.lost = 0
        self.hellos: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/lp"):
            self.losing = False
            self.hellos.append(request.content)
        response = await self.inner.handle_async_request(request)
        if self.losing and request.method == "GET" and response.status_code == 200:
            await response.aread()
            await response.aclose()
            self.lost += 1
            raise httpx.ReadError("the response was lost on the way", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_longpoll_resume_is_exact() -> None:
    rubris = make_rubris()
    lossy = LosingPolls()
    async with run_server(starlette_app(rubris)) as base:
        async with Client(
            base + "/rubris", transport="longpoll", http_transport=lossy, backoff=(0.01, 0.05)
        ) as c:
            seen = Seen()
            sub = await c.subscribe("ring.lp", seen.push, on_gap=seen.gap)
            publish(rubris, "ring.lp", 1, 3)
            await until(lambda: seen.seqs == [1, 2, 3], "the first three")
            lossy.losing = True
            publish(rubris, "ring.lp", 4, 8)
            await until(lambda: c.stats.reconnects == 1 and c.state == "open", "the re-HELLO")
            assert lossy.lost > 0 and c.resumed
            publish(rubris, "ring.lp", 9, 10)
            await until(lambda: seen.top == 10, "everything")
            seen.assert_exact(10)
            assert seen.seqs == list(range(1, 11)) and sub.recovered


# ---- late joiners ------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_late_joiner_gets_the_last_n_then_new_ones(transport: str) -> None:
    rubris = make_rubris()  # ring.* keeps 8
    async with run_server(starlette_app(rubris)) as base:
        publish(rubris, "ring.late", 1, 5)
        async with Client(base + "/rubris", transport=transport) as c:  # type: ignore[arg-type]
            three = Seen()
            await c.subscribe("ring.late", three.push, on_gap=three.gap, last=3)
            await until(lambda: three.top >= 5, "the last three")
            # all it holds when fewer than asked, oldest first
            publish(rubris, "ring.many", 1, 12)
            more = Seen()
            await c.subscribe("ring.many", more.push, on_gap=more.gap, last=20)
            await until(lambda: more.top >= 12, "what the ring of 8 holds")
            publish(rubris, "ring.late", 6, 6)
            publish(rubris, "ring.many", 13, 13)
            await until(lambda: three.top == 6 and more.top == 13, "the new ones")
            assert three.events == [("push", n) for n in (3, 4, 5, 6)]
            assert more.events == [("push", n) for n in range(5, 14)]
            # no `last`: only what is newer than the subscribe
            publish(rubris, "ring.plain", 1, 2)
            plain = Seen()
            await c.subscribe("ring.plain", plain.push, on_gap=plain.gap)
            publish(rubris, "ring.plain", 3, 3)
            await until(lambda: plain.top == 3, "a new one")
            assert plain.events == [("push", 3)]

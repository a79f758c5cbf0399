"""The plain-loop baseline of bench/fanout.py (``--app plain``): a plain Starlette broadcast loop.

What a team writes without Rubris: a Starlette WebSocket endpoint at /rubris/ws that accepts
(subprotocol ``rubris.v1``), reads the client's first frame (HELLO and its SUBSCRIBEs), answers
one frame with WELCOME and one SUBSCRIBED per topic, keeps the socket in a set, and reads (and
ignores) whatever the client sends later (its PINGs) until it disconnects. Speaking the rubris
wire format (rubris_asgi.protocol) lets the same load (bench/_fanout_load.py) measure both.

The publisher has the same control endpoints and stats shape as bench/_fanout_server.py's. A
*round* is, for each topic ``bench.{t}``: encode ONE frame holding one PUSH (seq increasing per
topic, payload orjson ``{"t": <stamp ns>, "i": <round>, "pad": "xxx..."}`` as Rubris's publisher
sends it), then ``for ws in subscribers[t]: await ws.send_bytes(frame)``, Starlette's
``WebSocket.send_bytes`` awaited client after client: that is the plain loop. A topic's
subscribers are the sockets whose first frame SUBSCRIBEd to it (a set per topic), so a client
that takes only K of the T topics (bench/fanout.py ``--per-client K``) gets only those; with
every client on every topic it is the same loop over all the sockets. Open loop: rounds
at their scheduled times, stamped with the scheduled time, so a loop that falls behind shows as
latency (no coordinated omission), yielding to the event loop between rounds (a loop that
falls behind would otherwise starve its sockets' readers and the control requests; a send that
does not block does not yield). Closed loop (``max``): rounds back to back, every send of a
round awaited, yielding to the event loop between rounds. ``cycle.messages`` and
``cycle.frames`` count completed sends (one message a frame). Stopping lets the round under way
finish, so every round counted is sent whole.

Started by bench/fanout.py as a subprocess, like bench/_fanout_server.py and with its options
(``--topics``, ``--pad``, ``--cpu``, ``--server uvicorn|hypercorn|granian``; ``--ring`` is
accepted and ignored); prints ``PORT n``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import sys
import time
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _fanout_server import control_routes, raise_nofile, server_args  # noqa: E402
from _servers import orphan_watchdog, serve  # noqa: E402

from rubris_asgi.errors import ErrorCode  # noqa: E402
from rubris_asgi.protocol import (  # noqa: E402
    SUBPROTOCOL,
    Codec,
    Mode,
    Push,
    Rejected,
    Subscribe,
    Subscribed,
    Welcome,
    encode,
    encode_frame,
    iter_messages,
)

HEARTBEAT_MS = 60_000  # as the Rubris server's: the load's clients PING at half of it
MAX_FRAME = 256 * 1024


class PlainLoop:
    """The connected sockets and the publisher that loops over them; one run at a time."""

    def __init__(self, topics: int, pad: int) -> None:
        self.names = [f"bench.{i}" for i in range(topics)]
        self.numbers = {name: i + 1 for i, name in enumerate(self.names)}  # topic ids, from 1
        self.seqs = [0] * topics  # last seq sent, per topic
        self.pad = "x" * pad
        self.clients: set[WebSocket] = set()
        self.subs: list[set[WebSocket]] = [set() for _ in range(topics)]  # per topic
        self.task: asyncio.Task[None] | None = None
        self.stopping = False
        self.in_round = False
        self.rounds = 0  # all rounds ever published (the payload's "i")
        self.run_rounds = 0
        self.run_mode = ""
        self.max_late_ms = 0.0
        self.started_ns = 0
        self.ended_ns = 0
        self.subscribers = 0  # deliveries per round, fixed at the start of a run
        self.sends = 0  # completed sends (one frame, one message each)
        self.failed_sends = 0

    async def publish_round(self, stamp_ns: int) -> None:
        i = self.rounds
        self.rounds = i + 1
        self.run_rounds += 1
        self.in_round = True
        try:
            for t in range(len(self.names)):
                seq = self.seqs[t] + 1
                self.seqs[t] = seq
                payload = orjson.dumps({"t": stamp_ns, "i": i, "pad": self.pad})
                frame = encode(Push(t + 1, seq, payload))
                subs = self.subs[t]
                for ws in list(subs):  # a copy: clients come and go while we await
                    try:
                        await ws.send_bytes(frame)
                    except Exception:  # gone: its reader drops it from the sets
                        self.failed_sends += 1
                        subs.discard(ws)
                        continue
                    self.sends += 1
        finally:
            self.in_round = False

    def start(self, mode: str, rate: float, window: float, seconds: float) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self.task = None
        self.stopping = False
        self.subscribers = sum(len(subs) for subs in self.subs)
        self.run_rounds = 0
        self.run_mode = mode
        self.max_late_ms = 0.0
        self.started_ns = time.monotonic_ns()
        self.ended_ns = 0
        coro = self._open(rate, seconds) if mode == "open" else self._closed(seconds)
        self.task = asyncio.get_running_loop().create_task(coro)

    def stop(self) -> None:
        """Stop publishing; a round under way is finished first (nothing counted goes unsent)."""
        self.stopping = True
        task = self.task
        if task is not None and not task.done() and not self.in_round:
            task.cancel()
            self.ended_ns = time.monotonic_ns()

    async def _open(self, rate: float, seconds: float) -> None:
        interval_ns = int(1e9 / rate)
        start = time.monotonic_ns()
        stop_at = start + int(seconds * 1e9)
        due = start
        now = start
        while due < stop_at and not self.stopping:
            # publish every round whose time has come, stamped with its scheduled time
            while due <= now and due < stop_at and not self.stopping:
                late = (now - due) / 1e6
                if late > self.max_late_ms:
                    self.max_late_ms = late
                await self.publish_round(due)
                due += interval_ns
                # a send that does not block does not yield: a loop that has fallen behind would
                # otherwise keep the event loop (its readers, the control requests) to itself
                await asyncio.sleep(0)
                now = time.monotonic_ns()
            wait = (due - now) / 1e9
            if wait > 0:
                await asyncio.sleep(wait)
                now = time.monotonic_ns()
        self.ended_ns = time.monotonic_ns()

    async def _closed(self, seconds: float) -> None:
        stop_at = time.monotonic_ns() + int(seconds * 1e9)
        while not self.stopping:
            now = time.monotonic_ns()
            if now >= stop_at:
                break
            await self.publish_round(now)
            await asyncio.sleep(0)  # let the sockets' readers and the control requests in
        self.ended_ns = time.monotonic_ns()

    def info(self) -> dict[str, object]:
        return {
            "mode": self.run_mode,
            "running": self.task is not None and not self.task.done(),
            "rounds": self.rounds,
            "run_rounds": self.run_rounds,
            "deliveries_per_round": self.subscribers,
            "max_late_ms": self.max_late_ms,
            "started_ns": self.started_ns,
            "ended_ns": self.ended_ns,
        }

    async def endpoint(self, ws: WebSocket) -> None:
        """One client: the handshake the load expects, then wait for it to go."""
        await ws.accept(subprotocol=SUBPROTOCOL)
        try:
            first = await ws.receive_bytes()
        except WebSocketDisconnect:
            return
        replies: list[Any] = [Welcome(secrets.token_hex(8), "", HEARTBEAT_MS, MAX_FRAME, False)]
        numbers: list[int] = []
        for m in iter_messages(first):
            if type(m) is Subscribe:
                number = self.numbers.get(m.name)
                if number is None:
                    replies.append(Rejected(m.req, ErrorCode.UNKNOWN, "unknown topic"))
                else:
                    numbers.append(number)
                    head = self.seqs[number - 1]
                    replies.append(
                        Subscribed(m.req, number, Mode.RING, Codec.JSON, 1, head, False, m.name)
                    )
        await ws.send_bytes(encode_frame(replies))
        self.clients.add(ws)
        for number in numbers:
            self.subs[number - 1].add(ws)
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
        finally:
            self.clients.discard(ws)
            for number in numbers:
                self.subs[number - 1].discard(ws)

    def figures(self) -> dict[str, Any]:
        """The stats fields bench/fanout.py reads, in the shape the Rubris server gives them."""
        n = len(self.clients)
        return {
            "sessions": n,
            "connected": n,
            "topics": len(self.names),
            "cycle": {"messages": self.sends, "frames": self.sends},
            "held": 0,
            "failed_sends_max": 0,
            "failed_sends": self.failed_sends,
            "pool": {},
        }


def make_app(topics: int, pad: int) -> Starlette:
    loop = PlainLoop(topics, pad)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
        watchdog = asyncio.create_task(orphan_watchdog())
        try:
            yield
        finally:
            loop.stop()
            if loop.task is not None:
                loop.task.cancel()
            watchdog.cancel()

    return Starlette(
        routes=[
            *control_routes(loop, loop.figures),
            WebSocketRoute("/rubris/ws", loop.endpoint),
        ],
        lifespan=lifespan,
    )


def main() -> None:
    args = server_args(__doc__ or "").parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})  # inherited by granian's worker and its threads
    raise_nofile()
    serve(functools.partial(make_app, args.topics, args.pad), args.server)


if __name__ == "__main__":
    main()

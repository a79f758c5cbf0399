"""The load half of bench/fanout.py: N raw WebSocket clients in one asyncio process.

Each client opens ``{mount}/ws`` with ``websockets.asyncio.client.connect`` (subprotocol
``rubris.v1``, no permessage-deflate), sends HELLO and one SUBSCRIBE per topic in one frame,
waits for WELCOME and every SUBSCRIBED (decoded with ``rubris_asgi.protocol.iter_messages``),
then hands its socket to a :class:`RawReader`, which reads the server's frames in
``data_received`` until the connection ends. Every client subscribes to all the topics, or
with ``per_client=K`` client ``i`` to K of the T: ``names[(i + j) % T]`` for ``j < K``, so each
topic has ``N * K / T`` subscribers when T divides N (:func:`client_topics`). Clients connect at
most ``concurrency`` at a time (a semaphore: bounded parallel batches).

Reading is the load side's hot path, so it decodes only what it needs, in place: for every
PUSH it reads ``topic`` and ``seq`` (uv) and the publish stamp ``t`` from the payload, which the
server encodes with orjson as ``{"t":<int>,"i":...}``, so ``t`` is the digits between byte 5 and
the first comma; it never builds a frame or message object (:func:`pushes_in`). A frame holding
anything other than plain PUSH messages (GAP, PONG, GOODBYE, a long or compressed message)
goes through ``iter_messages`` from that message on. ``decode="full"`` sends every frame through
``iter_messages`` and ``orjson.loads`` instead (slower; it checks that the fast path measures
the same thing). Until 2026-11-26 frames were read through ``websockets`` (``recv()`` in a task
per client): the load then cost 50-80 % of a core where it now costs 15-20 %, and at 10,000
clients its own backlog was most of the latency measured (p50 330 ms, now 170 ms).

Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC is one clock for every process of the
machine, so the server's stamp and the client's receive time compare directly. A message's
receive time is taken when the bytes that complete its frame come off the socket (the
``data_received`` call), not when the loop gets round to decoding it.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from array import array
from collections import deque
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode

from rubris_asgi.protocol import (
    Gap,
    Goodbye,
    Hello,
    Ping,
    Push,
    Rejected,
    Subscribe,
    Subscribed,
    Welcome,
    encode,
    encode_frame,
    iter_messages,
)

PUSH = 0x02


class GcTimer:
    """Counts a process's garbage collections and the time they stop its event loop.

    Both processes use one: the server reports its own, the load its own.
    """

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.max_ms = 0.0
        self._t = 0.0
        self.ignore = False
        gc.callbacks.append(self._callback)

    def collect(self) -> None:
        """An explicit full collection (before measuring RSS): not counted as a pause."""
        self.ignore = True
        try:
            gc.collect()
        finally:
            self.ignore = False

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if self.ignore:
            return
        if phase == "start":
            self._t = time.perf_counter()
        else:
            dt = time.perf_counter() - self._t
            g = info["generation"]
            self.count[g] += 1
            self.seconds[g] += dt
            self.max_ms = max(self.max_ms, dt * 1000)

    def info(self, mark: bool = False) -> dict[str, object]:
        """Counts and seconds since start; the longest pause since the last ``mark``."""
        out = {"count": self.count[:], "seconds": self.seconds[:], "max_ms": self.max_ms}
        if mark:
            self.max_ms = 0.0
        return out


class StampedConnection(ClientConnection):
    """A client connection that notes when each message's last bytes came off the socket.

    The receive time of a message is taken in ``data_received``, when the event loop hands the
    connection the bytes, not when the read loop gets round to the message: with a thousand
    sockets on one core that can be tens of milliseconds later, and would count the load's own
    queueing as server latency and cross-client skew.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rx_ns = 0
        self.stamps: deque[int] = deque()

    def data_received(self, data: bytes) -> None:
        self.rx_ns = time.monotonic_ns()
        super().data_received(data)

    def process_event(self, event: Any) -> None:
        if (
            type(event) is Frame
            and event.fin
            and event.opcode in (Opcode.BINARY, Opcode.TEXT, Opcode.CONT)
        ):
            self.stamps.append(self.rx_ns)
        super().process_event(event)


class Recorder:
    """What every client's read loop writes into (one process, one thread: no locks).

    ``count``: PUSH messages received since the start. ``lat``: receive - publish (ns) of every
    PUSH while ``recording``. ``skew``: for sampled messages (``seq % sample == 0``), keyed by
    ``topic << 40 | seq``: [first receive, last receive, clients that got it], always on, so a
    message that straddles the start or end of a window is still complete.
    """

    __slots__ = ("count", "lat", "skew", "sample_mask", "recording", "gaps", "lost", "closed")

    def __init__(self, sample: int = 4) -> None:
        if sample & (sample - 1):
            raise ValueError("sample must be a power of two")
        self.count = 0
        self.lat = array("q")
        self.skew: dict[int, list[int]] = {}
        self.sample_mask = sample - 1
        self.recording = False
        self.gaps = 0
        self.lost = 0
        self.closed = 0

    def reset(self) -> None:
        self.lat = array("q")
        self.skew = {}
        self.recording = False
        self.gaps = 0
        self.lost = 0


def _slow(buf: bytes, now: int, rec: Recorder) -> int:
    """Every message of ``buf`` through the protocol module's decoder; returns PUSH count."""
    pushes = 0
    for m in iter_messages(buf):
        if type(m) is Push:
            pushes += 1
            payload = m.payload
            if rec.recording:
                rec.lat.append(now - orjson.loads(payload)["t"])
            if not m.seq & rec.sample_mask:
                key = m.topic << 40 | m.seq
                e = rec.skew.get(key)
                if e is None:
                    rec.skew[key] = [now, now, 1]
                else:
                    e[1] = now
                    e[2] += 1
        elif type(m) is Gap:
            rec.gaps += 1
            rec.lost += m.count
        elif type(m) is Goodbye:
            rec.closed += 1
    return pushes


def pushes_in(buf: bytes, pos: int, n: int, now: int, rec: Recorder) -> int:
    """The PUSH messages of one frame's payload, ``buf[pos:n]``, counted and timed: the load's
    hot path. Reads ``topic`` and ``seq`` (uv) and the stamp ``t`` (the digits between byte 5 of
    the payload and the first comma); anything else goes through the real decoder from there."""
    pushes = 0
    recording = rec.recording
    mask = rec.sample_mask
    while pos < n:
        ln = buf[pos + 1] if pos + 1 < n else 0x80
        if buf[pos] != PUSH or ln >= 0x80:
            # anything unusual (another kind, a long message): the real decoder
            return pushes + _slow(buf[pos:n], now, rec)
        p = pos + 2
        end = p + ln
        # topic:uv
        topic = buf[p]
        p += 1
        if topic >= 0x80:
            topic &= 0x7F
            shift = 7
            while True:
                b = buf[p]
                p += 1
                topic |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
        # seq:uv
        seq = buf[p]
        p += 1
        if seq >= 0x80:
            seq &= 0x7F
            shift = 7
            while True:
                b = buf[p]
                p += 1
                seq |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
        # payload: {"t":<digits>,...
        if recording:
            rec.lat.append(now - int(buf[p + 5 : buf.index(b",", p + 5, end)]))
        if not seq & mask:
            key = topic << 40 | seq
            e = rec.skew.get(key)
            if e is None:
                rec.skew[key] = [now, now, 1]
            else:
                e[1] = now
                e[2] += 1
        pushes += 1
        pos = end
    return pushes


def frame_pushes(buf: bytes, pos: int, n: int, now: int, rec: Recorder) -> int:
    """``decode="frame"``: the PUSH messages of one frame's payload counted, and only the first
    one timed (its stamp is the frame's latency; no skew). A tenth of the work of
    :func:`pushes_in` at ten messages a frame: for overload cases, where the load reading every
    message's stamp could not keep up with the server and its backlog became the latency."""
    if buf[pos] != PUSH or pos + 1 >= n or buf[pos + 1] >= 0x80:
        return pushes_in(buf, pos, n, now, rec)  # the first one unusual: the whole frame
    first = pos
    pushes = 0
    while pos + 1 < n and buf[pos] == PUSH and buf[pos + 1] < 0x80:
        pushes += 1
        pos += 2 + buf[pos + 1]
    if pos < n:  # a GAP, a long message...: the rest the real way
        pushes += _slow(buf[pos:n], now, rec)
    if rec.recording:
        p = first + 2
        while buf[p] >= 0x80:  # topic:uv
            p += 1
        p += 1
        while buf[p] >= 0x80:  # seq:uv
            p += 1
        p += 1
        end = first + 2 + buf[first + 1]
        rec.lat.append(now - int(buf[p + 5 : buf.index(b",", p + 5, end)]))
    return pushes


def masked(opcode: int, payload: bytes, mask: bytes) -> bytes:
    """A client's frame (RFC 6455 section 5.3: FIN, masked)."""
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, 0x80 | n))
    elif n < 65536:
        head = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
    key = (mask * (n // 4 + 1))[:n]
    body = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
    return head + mask + body


class RawReader(asyncio.Protocol):
    """A client's socket once its handshake is done: frames read here, in ``data_received``.

    The handshake (HTTP upgrade, HELLO, the SUBSCRIBEs) goes through ``websockets``; then the
    transport is handed to this protocol, which reads the server's (unmasked) frames itself
    and counts and times the PUSHes of each in place: no frame objects, no ``recv()``, no task
    per client. Through ``websockets``, reading cost the load several times what a frame costs
    the server, and at 10,000 clients (or 1,000 x 10 overloaded) the load, saturated, was what
    the latency figures measured. A message's receive time is that of the ``data_received``
    that completed its frame, as ``StampedConnection`` took it.
    """

    def __init__(self, rec: Recorder, decode: str, transport: Any) -> None:
        self.rec = rec
        self.full = decode == "full"
        self.frames = decode == "frame"
        self.transport = transport
        self.rest = b""
        self.mask = os.urandom(4)
        self.ended = False

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        if self.rest:
            data = self.rest + data
            self.rest = b""
        rec = self.rec
        n = len(data)
        i = 0
        while i + 2 <= n:
            ln = data[i + 1]  # a server's frames are never masked
            h = 2
            if ln == 126:
                if i + 4 > n:
                    break
                ln = int.from_bytes(data[i + 2 : i + 4], "big")
                h = 4
            elif ln == 127:
                if i + 10 > n:
                    break
                ln = int.from_bytes(data[i + 2 : i + 10], "big")
                h = 10
            end = i + h + ln
            if end > n:
                break
            opcode = data[i] & 0x0F
            if opcode == 0x2:  # rubris sends each frame whole (FIN), binary
                if self.full:
                    rec.count += _slow(data[i + h : end], now, rec)
                elif self.frames:
                    rec.count += frame_pushes(data, i + h, end, now, rec)
                else:
                    rec.count += pushes_in(data, i + h, end, now, rec)
            elif opcode == 0x9:  # PING: PONG with its payload
                self.transport.write(masked(0xA, data[i + h : end], self.mask))
            elif opcode == 0x8:  # the server's close: answer it, then the server ends the TCP
                self.send_close()
            i = end
        if i < n:
            self.rest = data[i:]

    def send(self, message: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(masked(0x2, message, self.mask))

    def send_close(self) -> None:
        if not self.ended:
            self.ended = True
            self.rec.closed += 1
            if not self.transport.is_closing():
                self.transport.write(masked(0x8, (1000).to_bytes(2, "big"), self.mask))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended:
            self.ended = True
            self.rec.closed += 1


class Client:
    __slots__ = ("ws", "task", "heartbeat_ms", "topics", "reader", "resume")

    def __init__(self, ws: StampedConnection, heartbeat_ms: int, topics: dict[int, str]) -> None:
        self.ws = ws
        self.task: asyncio.Task[None] | None = None
        self.heartbeat_ms = heartbeat_ms
        self.topics = topics
        self.reader: RawReader | None = None
        """Once the handshake is done (fan-out clients): what reads and writes the socket."""
        self.resume = ""
        """The session's resume token (WELCOME)."""

    async def send(self, message: bytes) -> None:
        if self.reader is not None:
            self.reader.send(message)
        else:
            await self.ws.send(message)


async def open_client(url: str, names: list[str], rec: Recorder, decode: str) -> Client:
    ws = await connect(
        url,
        subprotocols=["rubris.v1"],  # type: ignore[list-item]
        compression=None,
        max_size=None,
        proxy=None,
        ping_interval=None,
        open_timeout=60,
        close_timeout=5,
        user_agent_header=None,
        create_connection=StampedConnection,
    )
    assert isinstance(ws, StampedConnection)
    hello = [Hello(1, ""), *(Subscribe(i + 1, name, 0, 0, b"") for i, name in enumerate(names))]
    await ws.send(encode_frame(hello))
    heartbeat_ms = 0
    token = ""
    topics: dict[int, str] = {}
    while heartbeat_ms == 0 or len(topics) < len(names):
        frame = await asyncio.wait_for(ws.recv(), 60)
        ws.stamps.popleft()
        assert isinstance(frame, bytes), "the server sent a text frame"
        for m in iter_messages(frame):
            if isinstance(m, Welcome):
                heartbeat_ms = m.heartbeat_ms
                token = m.resume
            elif isinstance(m, Subscribed):
                topics[m.topic] = m.name
            elif isinstance(m, Rejected):
                raise RuntimeError(f"SUBSCRIBE refused: {m.reason} (code {m.code})")
            elif isinstance(m, Goodbye):
                raise RuntimeError(f"GOODBYE during the handshake: {m.reason} (code {m.code})")
    client = Client(ws, heartbeat_ms, topics)
    client.resume = token
    # nothing else was sent yet (a fresh server's topics hold nothing to replay): any byte
    # websockets has read past the handshake would be lost to the raw reader, so there is none
    if ws.protocol.reader.buffer or ws.protocol.events or ws.recv_messages.frames:
        raise RuntimeError("the server sent more than the handshake before the bench began")
    client.reader = RawReader(rec, decode, ws.transport)
    ws.transport.set_protocol(client.reader)
    return client


def client_topics(i: int, names: list[str], per_client: int = 0) -> list[str]:
    """The topics client ``i`` subscribes to: all of ``names`` (``per_client`` 0), or K of them
    in a ring, ``names[(i + j) % T]`` for ``j < K``: with N clients every topic gets N * K / T
    subscribers (give or take one when T does not divide N)."""
    if per_client <= 0 or per_client >= len(names):
        return names
    t = len(names)
    return [names[(i + j) % t] for j in range(per_client)]


async def open_clients(
    url: str,
    n: int,
    names: list[str],
    rec: Recorder,
    decode: str,
    concurrency: int = 200,
    per_client: int = 0,
) -> list[Client]:
    """``n`` clients, at most ``concurrency`` connecting at once; client ``i`` subscribes to
    ``client_topics(i, names, per_client)``. Returned in order (client ``i`` at index ``i``)."""
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Client:
        async with sem:
            return await open_client(url, client_topics(i, names, per_client), rec, decode)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def pinger(clients: list[Client]) -> None:
    """PING every client at half its heartbeat, spread evenly over that interval."""
    if not clients:
        return
    interval = max(1.0, clients[0].heartbeat_ms / 2000)
    ticks = max(1, int(interval / 0.25))
    token = 0
    tick = 0
    while True:
        await asyncio.sleep(interval / ticks)
        tick = (tick + 1) % ticks
        for c in clients[tick::ticks]:
            token += 1
            try:
                await c.send(encode(Ping(token)))
            except ConnectionClosed:
                pass


async def close_clients(clients: list[Client], concurrency: int = 500) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(c: Client) -> None:
        async with sem:
            if c.reader is not None:  # a close frame, then the TCP connection
                c.reader.send_close()
                c.reader.transport.close()
                return
            try:
                await asyncio.wait_for(c.ws.close(), 5)
            except Exception:
                c.ws.transport.abort()
        if c.task is not None:
            c.task.cancel()

    await asyncio.gather(*(one(c) for c in clients), return_exceptions=True)
    tasks: list[Any] = [c.task for c in clients if c.task is not None]
    await asyncio.gather(*tasks, return_exceptions=True)

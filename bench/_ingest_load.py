"""The load half of bench/ingest.py: raw HTTP/1.1 posters and seq-tracking WebSocket subscribers.

``Poster``: one keep-alive HTTP/1.1 connection (asyncio streams) that POSTs pre-built NDJSON
requests to ``{mount}/api/publish`` back to back and counts the answers (status, messages,
``Rubris-Fill``). It never builds a request while measuring: the bytes are made up front.

``Tracker`` and :func:`open_subscribers`: WebSocket clients (the connection class and the
handshake of bench/_fanout_load.py) whose read loop checks, per client and topic, that seqs
arrive without holes. A hole (seq past the next expected one, with or without a GAP before it)
counts its missing seqs as lost; at the end of a phase, what a subscriber never got up to the
topic's head (the server's count of what the topic published) counts too. Latency is receive
minus the ``t`` stamp in the payload (``{"t":<CLOCK_MONOTONIC ns>,...}``, parsed from the bytes
as fanout's fast path does), taken when the frame's bytes came off the socket.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from typing import Any

import orjson
from _fanout_load import Client, StampedConnection
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from rubris_asgi.protocol import (
    Gap,
    Goodbye,
    Hello,
    Push,
    Rejected,
    Subscribe,
    Subscribed,
    Welcome,
    encode_frame,
    iter_messages,
)

PUSH = 0x02


# --------------------------------------------------------------------------- raw HTTP posting


def ndjson_request(path: str, token: str, body: bytes) -> bytes:
    """One complete HTTP/1.1 POST (head and body) as bytes."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/x-ndjson\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class PostStats:
    """What a set of posters saw: answers by status, messages accepted, fills, latencies."""

    __slots__ = ("ok", "ok_msgs", "refused", "other", "max_fill", "lat", "recording")

    def __init__(self) -> None:
        self.ok = 0
        self.ok_msgs = 0
        self.refused = 0
        self.other: dict[int, int] = {}
        self.max_fill = 0
        self.lat = array("q")
        self.recording = False


class Poster:
    """One keep-alive connection posting ``requests`` (cycled) until ``stop`` is set.

    ``retry_after``: on 429, wait this long before the next request (None: at once).
    """

    def __init__(
        self, port: int, requests: list[tuple[bytes, int]], stats: PostStats, offset: int = 0
    ) -> None:
        self.port = port
        self.requests = requests
        self.stats = stats
        self.i = offset
        self.stop = False

    async def run(self, retry_after: float | None = None, hold_above: int = 101) -> None:
        """Post until ``stop``. On 429 wait ``retry_after`` (None: at once) and send the same
        request again; after an answer whose fill is >= ``hold_above``, pause 20 ms."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        st = self.stats
        reqs = self.requests
        try:
            while not self.stop:
                data, n = reqs[self.i % len(reqs)]
                t0 = time.monotonic_ns()
                writer.write(data)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                length = 0
                fill = -1
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"rubris-fill":
                        fill = int(value)
                if length:
                    await reader.readexactly(length)
                if status != 429:
                    self.i += 1
                if st.recording:
                    st.lat.append(time.monotonic_ns() - t0)
                    st.max_fill = max(st.max_fill, fill)
                    if status == 200:
                        st.ok += 1
                        st.ok_msgs += n
                    elif status == 429:
                        st.refused += 1
                    else:
                        st.other[status] = st.other.get(status, 0) + 1
                if status == 429 and retry_after:
                    await asyncio.sleep(retry_after)
                elif fill >= hold_above:
                    await asyncio.sleep(0.02)
        finally:
            writer.close()


# --------------------------------------------------------------------------- subscribers


class Tracker:
    """What every subscriber's read loop writes into (one process, one thread: no locks).

    ``count``: PUSH messages received. ``holes``: seqs skipped over (lost before the end of a
    phase). ``gaps``: GAP messages (the server saying a ring was lapped). ``dups``: a seq at or
    below one already received. ``lat``: receive - stamp (ns) while ``recording``.
    """

    __slots__ = ("count", "holes", "gaps", "gap_count", "dups", "lat", "recording", "closed")

    def __init__(self) -> None:
        self.count = 0
        self.holes = 0
        self.gaps = 0
        self.gap_count = 0
        self.dups = 0
        self.lat = array("q")
        self.recording = False
        self.closed = 0


class Subscriber:
    __slots__ = ("client", "next", "names")

    def __init__(self, client: Client, nxt: dict[int, int], names: dict[int, str]) -> None:
        self.client = client
        self.next = nxt
        """Per topic number: the next seq expected (head at SUBSCRIBED + 1, then last + 1)."""
        self.names = names


def _slow(buf: bytes, now: int, tr: Tracker, nxt: dict[int, int]) -> None:
    for m in iter_messages(buf):
        if type(m) is Push:
            tr.count += 1
            exp = nxt[m.topic]
            if m.seq > exp:
                tr.holes += m.seq - exp
            elif m.seq < exp:
                tr.dups += 1
                continue
            nxt[m.topic] = m.seq + 1
            if tr.recording:
                tr.lat.append(now - orjson.loads(m.payload)["t"])
        elif type(m) is Gap:
            tr.gaps += 1
            tr.gap_count += m.count
        elif type(m) is Goodbye:
            tr.closed += 1


async def read_loop(ws: StampedConnection, tr: Tracker, nxt: dict[int, int]) -> None:
    recv = ws.recv
    stamp = ws.stamps.popleft
    try:
        while True:
            buf = await recv()
            now = stamp()
            if type(buf) is not bytes:
                _slow(bytes(buf, "utf-8"), now, tr, nxt)
                continue
            n = len(buf)
            pos = 0
            pushes = 0
            holes = 0
            recording = tr.recording
            lat = tr.lat
            while pos < n:
                ln = buf[pos + 1] if pos + 1 < n else 0x80
                if buf[pos] != PUSH or ln >= 0x80:
                    _slow(buf[pos:], now, tr, nxt)  # anything unusual: the real decoder
                    break
                p = pos + 2
                end = p + ln
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
                pos = end
                pushes += 1
                exp = nxt[topic]
                if seq != exp:
                    if seq < exp:
                        tr.dups += 1
                        continue
                    holes += seq - exp
                nxt[topic] = seq + 1
                if recording:  # payload: {"t":<digits>,...
                    lat.append(now - int(buf[p + 5 : buf.index(b",", p + 5, end)]))
            tr.count += pushes
            tr.holes += holes
    except ConnectionClosed:
        tr.closed += 1


async def open_subscriber(url: str, names: list[str], tr: Tracker) -> Subscriber:
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
    topics: dict[int, str] = {}
    nxt: dict[int, int] = {}
    while heartbeat_ms == 0 or len(topics) < len(names):
        frame = await asyncio.wait_for(ws.recv(), 60)
        ws.stamps.popleft()
        assert isinstance(frame, bytes), "the server sent a text frame"
        for m in iter_messages(frame):
            if isinstance(m, Welcome):
                heartbeat_ms = m.heartbeat_ms
            elif isinstance(m, Subscribed):
                topics[m.topic] = m.name
                nxt[m.topic] = m.head + 1
            elif isinstance(m, Rejected):
                raise RuntimeError(f"SUBSCRIBE refused: {m.reason} (code {m.code})")
            elif isinstance(m, Goodbye):
                raise RuntimeError(f"GOODBYE during the handshake: {m.reason} (code {m.code})")
    client = Client(ws, heartbeat_ms, topics)
    client.task = asyncio.get_running_loop().create_task(read_loop(ws, tr, nxt))
    return Subscriber(client, nxt, topics)


async def open_subscribers(
    url: str, groups: list[list[str]], n: int, tr: Tracker, concurrency: int = 200
) -> list[Subscriber]:
    """``n`` subscribers; subscriber i takes the topics of ``groups[i % len(groups)]``."""
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Subscriber:
        async with sem:
            return await open_subscriber(url, groups[i % len(groups)], tr)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def unreceived(subs: list[Subscriber], heads: dict[str, Any]) -> int:
    """Seqs the topics published that their subscribers have not received (yet)."""
    missing = 0
    for sub in subs:
        for number, name in sub.names.items():
            missing += max(0, heads.get(name, 0) - (sub.next[number] - 1))
    return missing

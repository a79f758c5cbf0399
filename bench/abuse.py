"""Abuse: what one client can do to the server and to the others, against the default settings.

Not a test. A bounded, loopback-only run of eight attacks (about 50 s against a server that
holds; every wait is capped, and with every cap reached it stays around three minutes) against
a real server: bench/_abuse_server.py, the app under attack (``Rubris()`` with the
default ``Config``, served by ``rubris_asgi.serve`` on 127.0.0.1 in its own process; its
channels, hooks and control routes are described there). Every client here talks to
127.0.0.1 only. The attacks run on a server each phase, so that none inherits another's state:

    server A   1. foreign publish, 8. CSRF, 3. body before auth, 7. revocation, then
               4. inflate (alone: the only latency measured)
    server B   2. topics after leave     } these three in parallel, after A is gone: B and C
    server C   6. idle connections       } mostly wait on the server's clocks, and D's flood
    server D   5. session flood          } of sessions from 127.0.0.1 would block B's client

The last line, key=value (targets in brackets):

``foreign_publish_delivered`` [0]
    alice subscribes ``chat.staff`` (its handler refuses everyone but alice); bob and an
    anonymous client each PUBLISH 50 messages there, then PING and wait for the PONG; the
    PUSHes alice receives on ``chat.staff`` within 1 s after. (A sanity line then checks that
    alice's own PUBLISH does reach her, so the count can see a delivery.)
``topics_after_leave`` [0]
    one anonymous client subscribes to 2,000 ``trades.R{i}`` topics (over two sessions: one
    may hold ``Limits.max_subscriptions``, 1,000) and PUBLISHes once to each of 500
    ``chat.p{i}`` rooms, checks the server holds the 2,500 topics, and disconnects; then
    ``GET /control/topics`` every 0.5 s until it reports 0 topics or 75 s have passed: the
    topics left then. The seconds it took are printed (expected about 35: the sessions
    outlive their connections ``session_timeout``, 30 s; a fed topic is kept
    ``session_timeout`` after its last use; an empty one goes 5 s after its last subscriber).
``body_read_before_auth_bytes`` [0]
    a raw TCP connection sends the head of ``POST /rubris/api/publish`` with
    ``Content-Type: application/x-ndjson``, ``Content-Length: 16777216`` (the default
    ``Limits.api_body``) and no credentials (no cookie, no token), then waits 2 s for an
    answer. An answer (401/403) within those 2 s: 0, the server refused before any byte of
    the body existed. Otherwise the body (valid NDJSON publishes to ``chat.lobby``, so that
    nothing but the authorisation can refuse it) is sent in 64 KiB chunks, 5 ms apart,
    looking for the answer before each chunk: the figure is the body bytes written to the
    socket before the answer was seen (to within a chunk). That is an upper bound of what the
    server read: up to the two sockets' buffers (on loopback, autotuned up to a few MiB) may
    not have been read by it. A server that reads the whole body first shows 16 MiB.
``ping_p99_ms_under_inflate`` [<= 50]
    six anonymous WebSockets, in a separate process (the machine's cores are printed; on 2
    cores the server, the attackers and the measuring client share them), each send for 10 s,
    as fast as the server reads them, frames of 16 compressed PUBLISHes to ``chat.flood{i}``
    whose payloads inflate to 1 MiB of JSON each (a string of one repeated character, raw
    deflate at zlib-ng level 9: about 1 KB each). Meanwhile alice, on her own WebSocket in
    this process, sends a PING every 50 ms (open loop: on schedule whether or not the last
    PONG came) and records each PONG's round trip; a PING unanswered 3 s after the flood
    counts with the time it waited. The 99th percentile (nearest rank), in ms; the median,
    the count and a baseline without the flood are printed, with how many PUBLISHes the
    attackers wrote to their sockets and how many the server numbered (what it read and
    inflated; the rest waited in the kernel's buffers).
``one_client_capped`` [1] / ``alice_refused`` [0]
    one anonymous client opens long-poll sessions (``POST /rubris/lp`` with a HELLO frame),
    8 requests in flight, 3,000 requests in all. 1 when it was refused (503) before the end
    and the sessions it got equal ``Limits.max_sessions_per_address`` (1,000), else 0. Then
    alice (``X-User: alice``), from the same address, opens 5 sessions (3 WebSocket, 2
    long-poll): ``alice_refused`` is how many were refused.
``idle_conn_held_s`` [<= 30]
    45 raw TCP connections: 20 send nothing, 20 send a request head one byte every 2 s, 5 send
    the head of ``POST /rubris/lp/xyz`` (no such session) with ``Content-Length: 1000`` and
    then one body byte every 2 s. Each is watched until the server closes it (EOF, or a
    reset on read or write); the longest any was held, in seconds; 60 when one was still
    open after 60 s. An answer the server sends without closing (a 404, a 408) does not end
    the wait: only the close frees what the connection holds.
``revoked_session_open_s`` [<= 1]
    carol opens a WebSocket and subscribes ``orders.carol``; the bench calls
    ``POST /control/revoke/carol`` (which revokes her and awaits ``rubris.disconnect``); the
    seconds from sending that request until carol's socket has received GOODBYE and is closed
    (10 when that had not happened after 10 s).
``csrf_accepted`` [0]
    what a browser sends for a cross-site simple request (no preflight): ``Origin:
    https://evil.example``, ``Content-Type: text/plain``, ``Cookie: user=alice``, to
    ``POST /rubris/api/batches`` (an empty body: the open, which needs none) and
    ``POST /rubris/api/publish`` (``{"topic": "chat.lobby", "data": "csrf"}``); how many were
    answered 2xx. The same requests without ``Origin`` are printed as a sanity line (a publish
    as ``text/plain`` is refused 415 whatever its origin; ``application/json`` is shown too).

A scenario that fails outright prints its error and ``error`` for its keys.

    python3 bench/abuse.py
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any, TypeVar

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol
from zlib_ng import zlib_ng

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from _servers import BENCH_PID_ENV  # noqa: E402

from rubris_asgi import Limits  # noqa: E402
from rubris_asgi.protocol import (  # noqa: E402
    Goodbye,
    Hello,
    Message,
    Ping,
    Pong,
    Publish,
    Push,
    Rejected,
    Subscribe,
    Subscribed,
    Welcome,
    decode_frame,
    encode_frame,
)

SERVER = os.path.join(HERE, "_abuse_server.py")
HOST = "127.0.0.1"
LIMITS = Limits()  # the defaults the server runs with

T = TypeVar("T")

# the scenarios' sizes
FOREIGN_PUBLISHES = 50
TRADES_TOPICS = 2000
CHAT_ROOMS = 500
TOPICS_WAIT_S = 75.0
API_BODY = 16 * 1024 * 1024
BODY_CHUNK = 64 * 1024
BODY_PACE_S = 0.005
BODY_SEND_CAP_S = 10.0
BODY_ANSWER_CAP_S = 10.0
FLOOD_CONNS = 6
FLOOD_S = 10.0
FLOOD_PER_FRAME = 16
INFLATED = 1024 * 1024  # what each flood payload inflates to (Limits.max_inflated)
PING_EVERY_S = 0.05
LP_REQUESTS = 3000
LP_IN_FLIGHT = 8
IDLE_CAP_S = 60.0
DRIBBLE_S = 2.0
REVOKE_CAP_S = 10.0


def say(line: str) -> None:
    print(line, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def http_client(port: int, timeout: float = 10.0, **kwargs: Any) -> httpx.AsyncClient:
    # trust_env=False: no proxy from the environment, every request goes to 127.0.0.1
    return httpx.AsyncClient(
        base_url=f"http://{HOST}:{port}", timeout=timeout, trust_env=False, **kwargs
    )


# --------------------------------------------------------------------------- the server


class Server:
    """bench/_abuse_server.py in a process of its own; its log goes to a scratch file."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dir = tempfile.mkdtemp(prefix=f"rubris-abuse-{name}-")
        self.log_path = os.path.join(self.dir, "server.log")
        self.port = 0
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.port = free_port()
        env = {**os.environ, BENCH_PID_ENV: str(os.getpid())}
        log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            # its own session: a Ctrl-C here reaches this process only, which stops the server
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                SERVER,
                "--port",
                str(self.port),
                "--dir",
                self.dir,
                stdout=log,
                stderr=log,
                start_new_session=True,
                env=env,
            )
        finally:
            os.close(log)
        deadline = time.monotonic() + 30
        async with http_client(self.port, timeout=2) as c:
            while True:
                try:
                    r = await c.get("/control/topics")
                    if r.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if self.proc.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server {self.name} did not start: {self.log_tail()}")
                await asyncio.sleep(0.05)
        say(f"[server {self.name}] started on {HOST}:{self.port} (pid {self.proc.pid})")

    async def state(self, prefix: str = "") -> dict[str, int]:
        async with http_client(self.port) as c:
            params = {"prefix": prefix} if prefix else None
            r = await c.get("/control/topics", params=params)
            r.raise_for_status()
            out: dict[str, int] = r.json()
            return out

    def log_tail(self, n: int = 5) -> str:
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return f"{len(lines)} lines" + "".join(f"\n    {line[:200]}" for line in lines[-n:])

    async def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if proc is not None:
            say(f"[server {self.name}] stopped; its log: {self.log_tail()}")
        shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------- a raw peer


class Peer:
    """A WebSocket speaking protocol frames directly, keeping the rest of a frame for later."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.backlog: deque[Message] = deque()

    @classmethod
    async def open(cls, port: int, user: str | None = None) -> Peer:
        headers = {"X-User": user} if user else {}
        ws = await connect(
            f"ws://{HOST}:{port}/rubris/ws",
            subprotocols=[Subprotocol("rubris.v1")],
            compression=None,
            additional_headers=headers,
            proxy=None,
            open_timeout=10,
            close_timeout=2,
            ping_interval=None,
            max_size=16 * 1024 * 1024,
        )
        return cls(ws)

    async def send(self, msgs: list[Message]) -> None:
        await self.ws.send(encode_frame(msgs))

    async def next(self, timeout: float) -> Message:
        """The next message; ``asyncio.TimeoutError`` after ``timeout`` s, ``ConnectionClosed``
        when the socket is closed."""
        while not self.backlog:
            frame = await asyncio.wait_for(self.ws.recv(), max(timeout, 0.001))
            if isinstance(frame, bytes):
                self.backlog.extend(decode_frame(frame))
        return self.backlog.popleft()

    async def until(self, pred: Callable[[Message], bool], timeout: float) -> Message:
        deadline = time.monotonic() + timeout
        while True:
            m = await self.next(deadline - time.monotonic())
            if pred(m):
                return m

    async def hello(self, *extra: Message) -> Message:
        """HELLO (with ``extra``); the first answer: WELCOME, or GOODBYE when refused."""
        await self.send([Hello(1, ""), *extra])
        return await self.next(10)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 5)


async def bounded(aw: Awaitable[T], seconds: float) -> T:
    return await asyncio.wait_for(aw, seconds)


# --------------------------------------------------------------------------- 1. foreign publish


async def foreign_publish(port: int) -> int:
    alice = await Peer.open(port, "alice")
    bob = await Peer.open(port, "bob")
    anon = await Peer.open(port)
    try:
        w = await alice.hello(Subscribe(1, "chat.staff", 0, 0, b""))
        assert isinstance(w, Welcome), w
        sub = await alice.until(lambda m: isinstance(m, (Subscribed, Rejected)), 5)
        assert isinstance(sub, Subscribed), sub
        topic = sub.topic
        for who, p in (("bob", bob), ("anonymous", anon)):
            assert isinstance(await p.hello(), Welcome)
            msgs: list[Message] = [
                Publish(100 + i, "chat.staff", orjson.dumps({"spoof": who, "i": i}))
                for i in range(FOREIGN_PUBLISHES)
            ]
            await p.send([*msgs, Ping(7)])
            rejected: dict[tuple[int, str], int] = {}
            while True:
                m = await p.next(10)
                if isinstance(m, Rejected):
                    key = (m.code, m.reason)
                    rejected[key] = rejected.get(key, 0) + 1
                elif isinstance(m, Pong):
                    break
            say(
                f"[1 foreign] {who}: {FOREIGN_PUBLISHES} PUBLISHes to chat.staff, "
                f"REJECTED (code, reason): {rejected}"
            )
        delivered = 0
        deadline = time.monotonic() + 1.0
        while True:
            try:
                m = await alice.next(deadline - time.monotonic())
            except asyncio.TimeoutError:
                break
            if isinstance(m, Push) and m.topic == topic:
                delivered += 1
        say(f"[1 foreign] PUSHes alice received on chat.staff within 1 s: {delivered}")
        # sanity: the count sees a delivery when there is one
        await alice.send([Publish(900, "chat.staff", b'"from alice"')])
        try:
            own = await alice.until(lambda m: isinstance(m, Push) and m.topic == topic, 5)
            say(f"[1 foreign] sanity: alice's own PUBLISH reached her: {isinstance(own, Push)}")
        except asyncio.TimeoutError:
            say("[1 foreign] sanity: alice's own PUBLISH did NOT reach her within 5 s")
        return delivered
    finally:
        for p in (alice, bob, anon):
            await p.close()


# --------------------------------------------------------------------------- 8. CSRF


async def csrf(port: int) -> int:
    entry = orjson.dumps({"topic": "chat.lobby", "data": "csrf"})
    requests = [("/rubris/api/batches", b""), ("/rubris/api/publish", entry)]

    async def post(path: str, body: bytes, origin: str | None, kind: str) -> httpx.Response:
        headers = {"Content-Type": kind, "Cookie": "user=alice"}
        if origin is not None:
            headers["Origin"] = origin
        async with http_client(port) as c:
            return await c.post(path, content=body, headers=headers)

    accepted = 0
    for path, body in requests:
        r = await post(path, body, "https://evil.example", "text/plain")
        ok = 200 <= r.status_code < 300
        accepted += ok
        say(f"[8 csrf] cross-site {path}: {r.status_code} {r.text[:100]}")
    sanity = []
    for path, body in requests:
        r = await post(path, body, None, "text/plain")
        sanity.append(f"{path} text/plain {r.status_code}")
    r = await post("/rubris/api/publish", entry, None, "application/json")
    sanity.append(f"/rubris/api/publish application/json {r.status_code}")
    say(f"[8 csrf] sanity, the same without Origin: {'; '.join(sanity)}")
    return accepted


# --------------------------------------------------------------------------- 3. body before auth


def ndjson_body(total: int) -> bytes:
    """``total`` bytes (a multiple of 1 KiB) of NDJSON publishes to chat.lobby, 1 KiB lines."""
    head, tail = b'{"topic":"chat.lobby","data":"', b'"}\n'
    line = head + b"x" * (1024 - len(head) - len(tail)) + tail
    if total % len(line):
        raise ValueError(f"{total} is not a multiple of {len(line)}")
    return line * (total // len(line))


async def read_head(reader: asyncio.StreamReader) -> tuple[int, float]:
    """The status of the answer and when it was seen (0: closed without one)."""
    data = b""
    while b"\r\n" not in data:
        chunk = await reader.read(4096)
        if not chunk:
            return 0, time.monotonic()
        data += chunk
    parts = data.split(b" ", 2)
    return (int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1), time.monotonic()


async def body_before_auth(port: int) -> int:
    reader, writer = await bounded(asyncio.open_connection(HOST, port), 10)
    try:
        head = (
            f"POST /rubris/api/publish HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
            f"Content-Type: application/x-ndjson\r\nContent-Length: {API_BODY}\r\n\r\n"
        ).encode()
        started = time.monotonic()
        writer.write(head)
        await bounded(writer.drain(), 10)
        answer = asyncio.create_task(read_head(reader))
        await asyncio.wait({answer}, timeout=2.0)
        sent = 0
        note = ""
        if not answer.done():
            body = ndjson_body(API_BODY)
            send_until = time.monotonic() + BODY_SEND_CAP_S
            try:
                while sent < API_BODY and not answer.done():
                    if time.monotonic() > send_until:
                        note = f" (sending stopped after {BODY_SEND_CAP_S:g} s)"
                        break
                    chunk = body[sent : sent + BODY_CHUNK]
                    writer.write(chunk)
                    await bounded(writer.drain(), 10)
                    sent += len(chunk)
                    await asyncio.sleep(BODY_PACE_S)
            except (ConnectionError, asyncio.TimeoutError) as exc:
                note = f" (sending stopped: {type(exc).__name__})"
            await asyncio.wait({answer}, timeout=BODY_ANSWER_CAP_S)
        if not answer.done():
            answer.cancel()
            say(f"[3 body] no answer {BODY_ANSWER_CAP_S:g} s after {sent:,} body bytes{note}")
            return sent
        status, at = answer.result()
        when = "before any body byte was sent" if sent == 0 else f"after {sent:,} body bytes"
        say(
            f"[3 body] answer {status} {at - started:.3f} s after the head, {when}{note}"
            f" (a body of {API_BODY:,} declared)"
        )
        return sent
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 2)


# --------------------------------------------------------------------------- 7. revocation


async def revocation(port: int) -> float:
    carol = await Peer.open(port, "carol")
    try:
        w = await carol.hello(Subscribe(1, "orders.carol", 0, 0, b""))
        assert isinstance(w, Welcome), w
        sub = await carol.until(lambda m: isinstance(m, (Subscribed, Rejected)), 5)
        assert isinstance(sub, Subscribed), sub
        async with http_client(port) as c:
            started = time.monotonic()
            request = asyncio.create_task(c.post("/control/revoke/carol"))
            bye: Message | None = None
            try:
                bye = await carol.until(lambda m: isinstance(m, Goodbye), REVOKE_CAP_S)
                remaining = REVOKE_CAP_S - (time.monotonic() - started)
                await asyncio.wait_for(carol.ws.wait_closed(), max(remaining, 0.001))
                seconds = time.monotonic() - started
            except ConnectionClosed:
                seconds = time.monotonic() - started
            except asyncio.TimeoutError:
                seconds = REVOKE_CAP_S
            r = await bounded(request, 10)
        say(
            f"[7 revoke] carol's GOODBYE {bye!r}, close {carol.ws.close_code}, "
            f"{seconds:.3f} s after the request; /control/revoke answered {r.status_code} {r.text}"
        )
    finally:
        await carol.close()
    # sanity: carol cannot come back
    try:
        again = await Peer.open(port, "carol")
        try:
            first = await again.hello()
            say(f"[7 revoke] sanity: carol connecting again gets {type(first).__name__}")
        except (ConnectionClosed, asyncio.TimeoutError) as exc:
            say(f"[7 revoke] sanity: carol connecting again: {type(exc).__name__}")
        finally:
            await again.close()
    except InvalidStatus as exc:
        say(f"[7 revoke] sanity: carol connecting again refused: HTTP {exc.response.status_code}")
    return seconds


# --------------------------------------------------------------------------- 4. inflate


def flood_process(
    port: int, conns: int, seconds: float, ready: Event, results: Queue[dict[str, Any]]
) -> None:
    """The attackers, in a process of their own (multiprocessing, spawn)."""
    results.put(asyncio.run(_flood(port, conns, seconds, ready)))


async def _flood(port: int, conns: int, seconds: float, ready: Event) -> dict[str, Any]:
    text = b'"' + b"a" * (INFLATED - 2) + b'"'
    payload = zlib_ng.compress(text, 9, -15)
    peers = [await Peer.open(port) for _ in range(conns)]
    welcomed = 0
    for p in peers:
        welcomed += isinstance(await p.hello(), Welcome)
    rejected: dict[int, int] = {}
    stop = asyncio.Event()

    async def drain(p: Peer) -> None:  # read and drop what comes back (REJECTED, FLOW)
        with contextlib.suppress(ConnectionClosed):
            while not stop.is_set():
                try:
                    m = await p.next(0.5)
                except asyncio.TimeoutError:
                    continue
                if isinstance(m, Rejected):
                    rejected[m.code] = rejected.get(m.code, 0) + 1

    async def one(i: int, p: Peer, deadline: float) -> int:
        frame = encode_frame(
            [
                Publish(k, f"chat.flood{i}", payload, compressed=True)
                for k in range(1, FLOOD_PER_FRAME + 1)
            ]
        )
        sent = 0
        with contextlib.suppress(ConnectionClosed, asyncio.TimeoutError):
            while time.monotonic() < deadline:
                await asyncio.wait_for(p.ws.send(frame), deadline - time.monotonic() + 0.05)
                sent += FLOOD_PER_FRAME
        return sent

    readers = [asyncio.create_task(drain(p)) for p in peers]
    ready.set()
    deadline = time.monotonic() + seconds
    sent = await asyncio.gather(*(one(i, p, deadline) for i, p in enumerate(peers)))
    stop.set()
    for p in peers:
        p.ws.transport.abort()  # no closing handshake behind a backlog the server reads slowly
    await asyncio.gather(*readers, return_exceptions=True)
    return {
        "welcomed": welcomed,
        "sent": sum(sent),
        "per_conn": sent,
        "payload_bytes": len(payload),
        "rejected": rejected,
    }


def quantile(sorted_values: list[float], q: float) -> float:
    """Nearest rank."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


async def ping_rtts(alice: Peer, seconds: float) -> tuple[list[float], int]:
    """PING every PING_EVERY_S for ``seconds`` (open loop); the round trips in ms, and how
    many were unanswered 3 s after the last (counted with the time they waited)."""
    sent: dict[int, float] = {}
    rtts: list[float] = []
    finished = False  # every PING sent
    answered = asyncio.Event()  # ... and every PONG back

    async def reader() -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                try:
                    m = await alice.next(1.0)
                except asyncio.TimeoutError:
                    continue
                if isinstance(m, Pong) and m.token in sent:
                    rtts.append((time.monotonic() - sent.pop(m.token)) * 1000)
                    if finished and not sent:
                        answered.set()

    task = asyncio.create_task(reader())
    token = 0
    due = time.monotonic()
    end = due + seconds
    while due < end:
        token += 1
        sent[token] = time.monotonic()
        await alice.send([Ping(token)])
        due += PING_EVERY_S
        await asyncio.sleep(max(0.0, due - time.monotonic()))
    finished = True
    if sent:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(answered.wait(), 3.0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    now = time.monotonic()
    lost = len(sent)
    rtts.extend((now - t) * 1000 for t in sent.values())
    return rtts, lost


def describe(rtts: list[float]) -> str:
    s = sorted(rtts)
    if not s:
        return "no samples"
    return (
        f"n={len(s)} median={statistics.median(s):.2f} p99={quantile(s, 0.99):.2f} "
        f"max={s[-1]:.2f} ms"
    )


async def inflate(server: Server) -> float:
    port = server.port
    alice = await Peer.open(port, "alice")
    try:
        assert isinstance(await alice.hello(), Welcome)
        base, _ = await ping_rtts(alice, 2.0)
        say(f"[4 inflate] baseline, no flood: {describe(base)}")
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Event()
        results: Queue[dict[str, Any]] = ctx.Queue()
        proc = ctx.Process(
            target=flood_process, args=(port, FLOOD_CONNS, FLOOD_S, ready, results), daemon=True
        )
        proc.start()
        try:
            deadline = time.monotonic() + 15
            while not ready.is_set():
                if not proc.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("the flood process did not get ready")
                await asyncio.sleep(0.02)
            started = time.monotonic()
            rtts, lost = await ping_rtts(alice, FLOOD_S)
            stats = await asyncio.to_thread(results.get, True, 10)
            took = time.monotonic() - started
        finally:
            await asyncio.to_thread(proc.join, 10)
            if proc.is_alive():
                proc.terminate()
                await asyncio.to_thread(proc.join, 5)
        st = await server.state("chat.flood")
        s = sorted(rtts)
        rate = LIMITS.inbound_rate
        budget = FLOOD_CONNS * (rate * FLOOD_S + rate) / INFLATED
        say(
            f"[4 inflate] {stats['welcomed']}/{FLOOD_CONNS} attackers wrote {stats['sent']:,} "
            f"PUBLISHes to their sockets ({stats['payload_bytes']:,} B each, inflating to "
            f"{INFLATED:,} B; per connection {stats['per_conn']}; what the server did not read "
            f"sat in the kernel's buffers), REJECTED by code {stats['rejected']}"
        )
        say(
            f"[4 inflate] the server numbered {st['seqs']:,} of them: "
            f"{st['seqs'] * INFLATED / 2**20 / took:,.1f} MiB/s inflated over {took:.1f} s "
            f"(the input budget, {rate / 2**20:g} MiB/s a connection plus as much of burst, "
            f"allows about {budget:,.0f} in {FLOOD_S:g} s)"
        )
        say(f"[4 inflate] alice under the flood: {describe(rtts)}, unanswered {lost}")
        say(
            f"[4 inflate] {os.cpu_count()} cores: the server (one process, one event loop), "
            "the attackers' process and this one (alice) share them"
        )
        return quantile(s, 0.99)
    finally:
        await alice.close()


# --------------------------------------------------------------------------- 2. topics after leave


async def topics_after_leave(server: Server) -> int:
    port = server.port
    cap = LIMITS.max_subscriptions
    names = [f"trades.R{i}" for i in range(TRADES_TOPICS)]
    peers: list[Peer] = []
    try:
        subscribed = rejected = 0
        for n, start in enumerate(range(0, len(names), cap)):
            p = await Peer.open(port)
            peers.append(p)
            assert isinstance(await p.hello(), Welcome)
            msgs: list[Message] = [
                Subscribe(start + k + 1, name, 0, 0, b"")
                for k, name in enumerate(names[start : start + cap])
            ]
            if n == 0:
                msgs += [Publish(10_000 + i, f"chat.p{i}", b'"x"') for i in range(CHAT_ROOMS)]
            await p.send([*msgs, Ping(1)])
            while True:
                m = await p.next(20)
                if isinstance(m, Subscribed):
                    subscribed += 1
                elif isinstance(m, Rejected):
                    rejected += 1
                elif isinstance(m, Pong):
                    break
        st = await server.state()
        say(
            f"[2 topics] {len(peers)} anonymous sessions: {subscribed} SUBSCRIBED, {rejected} "
            f"REJECTED, {CHAT_ROOMS} PUBLISHes; the server holds {st['topics']} topics, "
            f"{st['sessions']} sessions"
        )
    finally:
        for p in peers:
            await p.close()
    left = time.monotonic()
    sessions_gone: float | None = None
    st = await server.state()
    while time.monotonic() - left < TOPICS_WAIT_S:
        st = await server.state()
        if sessions_gone is None and st["sessions"] == 0:
            sessions_gone = time.monotonic() - left
        if st["topics"] == 0:
            break
        await asyncio.sleep(0.5)
    waited = time.monotonic() - left
    gone = f"{sessions_gone:.1f} s" if sessions_gone is not None else "never"
    say(
        f"[2 topics] after the client left: its sessions gone after {gone}; {st['topics']} "
        f"topics left after {waited:.1f} s"
    )
    return st["topics"]


# --------------------------------------------------------------------------- 5. session flood


async def lp_open(c: httpx.AsyncClient, user: str | None) -> int:
    headers = {"X-User": user} if user else {}
    r = await c.post("/rubris/lp", content=encode_frame([Hello(1, "")]), headers=headers)
    if r.status_code == 200 and not isinstance(decode_frame(r.content)[0], Welcome):
        return -1
    return r.status_code


async def session_flood(server: Server) -> tuple[int, int]:
    port = server.port
    cap = LIMITS.max_sessions_per_address
    order: list[int] = []  # statuses in the order they came back
    errors: dict[str, int] = {}
    started = time.monotonic()
    first_refused: float | None = None
    issued = 0
    limits = httpx.Limits(max_connections=LP_IN_FLIGHT)
    async with http_client(port, limits=limits) as c:

        async def worker() -> None:
            nonlocal issued, first_refused
            while issued < LP_REQUESTS:
                issued += 1
                try:
                    status = await lp_open(c, None)
                except httpx.HTTPError as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    continue
                if status == 503 and first_refused is None:
                    first_refused = time.monotonic() - started
                order.append(status)

        await bounded(asyncio.gather(*(worker() for _ in range(LP_IN_FLIGHT))), 45)
        took = time.monotonic() - started
        accepted = order.count(200)
        first = order.index(503) if 503 in order else None
        codes = {s: order.count(s) for s in sorted(set(order))}
        say(
            f"[5 flood] {len(order)} long-poll opens in {took:.1f} s: {codes}, errors {errors}; "
            + (
                f"first 503 after {first} answers ({first_refused:.2f} s)"
                if first is not None and first_refused is not None
                else "never refused"
            )
            + f"; {accepted} sessions got (the per-address cap: {cap})"
        )
        capped = int(first is not None and accepted == cap)
        # alice, from the same address: 3 WebSocket sessions and 2 long-poll ones
        refused = 0
        outcomes: list[str] = []
        peers: list[Peer] = []
        try:
            for _ in range(3):
                try:
                    p = await Peer.open(port, "alice")
                    peers.append(p)
                    first_msg = await p.hello()
                    ok = isinstance(first_msg, Welcome)
                    outcomes.append("ws " + ("ok" if ok else repr(first_msg)))
                except (ConnectionClosed, InvalidStatus, asyncio.TimeoutError, OSError) as exc:
                    ok = False
                    outcomes.append(f"ws {type(exc).__name__}")
                refused += not ok
            for _ in range(2):
                try:
                    status = await lp_open(c, "alice")
                except httpx.HTTPError as exc:
                    status = 0
                    outcomes.append(f"lp {type(exc).__name__}")
                else:
                    outcomes.append(f"lp {status}")
                refused += status != 200
            # for the record: another anonymous WebSocket from the address is refused too
            try:
                p = await Peer.open(port)
                peers.append(p)
                anon = await p.hello()
                anon_outcome = type(anon).__name__ + (
                    f" {anon.code} {anon.reason!r}" if isinstance(anon, Goodbye) else ""
                )
            except (ConnectionClosed, InvalidStatus, asyncio.TimeoutError, OSError) as exc:
                anon_outcome = type(exc).__name__
        finally:
            for p in peers:
                await p.close()
    say(f"[5 flood] alice's 5 sessions: {', '.join(outcomes)}; one more anonymous: {anon_outcome}")
    return capped, refused


# --------------------------------------------------------------------------- 6. idle connections


async def hold(port: int, kind: str) -> tuple[str, float, int | None, str]:
    """One connection of ``kind`` (silent, head, body) until the server closes it; returns
    (kind, seconds held, the status of an answer it got or None, how it ended)."""
    started = time.monotonic()
    reader, writer = await bounded(asyncio.open_connection(HOST, port), 10)
    if kind == "body":
        writer.write(
            f"POST /rubris/lp/xyz HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
            "Content-Length: 1000\r\n\r\n".encode()
        )
        drip = b"x" * 1000
    else:
        drip = f"GET /rubris/client.js HTTP/1.1\r\nHost: {HOST}:{port}\r\nX-Slow: ".encode()
        drip += b"a" * 1000
    dripped = 0
    next_drip = started + DRIBBLE_S
    received = b""
    status: int | None = None
    how = "still open"
    try:
        while True:
            now = time.monotonic()
            if now - started >= IDLE_CAP_S:
                return kind, IDLE_CAP_S, status, how
            wait = started + IDLE_CAP_S - now
            if kind != "silent":
                wait = min(wait, max(0.0, next_drip - now))
            try:
                data = await asyncio.wait_for(reader.read(65536), max(wait, 0.001))
            except asyncio.TimeoutError:
                if kind != "silent" and time.monotonic() >= next_drip:
                    try:
                        writer.write(drip[dripped : dripped + 1])
                        await bounded(writer.drain(), 5)
                    except (ConnectionError, asyncio.TimeoutError):
                        return kind, time.monotonic() - started, status, "reset on write"
                    dripped += 1
                    next_drip += DRIBBLE_S
                continue
            except ConnectionError:
                return kind, time.monotonic() - started, status, "reset"
            if not data:
                return kind, time.monotonic() - started, status, "closed"
            received += data
            if status is None and b"\r\n" in received:
                parts = received.split(b" ", 2)
                status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 2)


async def idle_connections(server: Server) -> float:
    kinds = ["silent"] * 20 + ["head"] * 20 + ["body"] * 5
    results = await bounded(asyncio.gather(*(hold(server.port, k) for k in kinds)), IDLE_CAP_S + 8)
    for kind in ("silent", "head", "body"):
        mine = [r for r in results if r[0] == kind]
        held = sorted(r[1] for r in mine)
        statuses = sorted({str(r[2]) for r in mine})
        hows = sorted({r[3] for r in mine})
        say(
            f"[6 idle] {len(mine)} {kind}: held {held[0]:.1f}-{held[-1]:.1f} s, "
            f"answers {statuses}, ended {hows}"
        )
    return max(r[1] for r in results)


# --------------------------------------------------------------------------- the run


async def attempt(name: str, aw: Awaitable[T], seconds: float) -> T | None:
    """Run one scenario, bounded; on failure print why and give None (``error``)."""
    try:
        return await asyncio.wait_for(aw, seconds)
    except Exception as exc:
        say(f"[{name}] FAILED: {type(exc).__name__}: {exc}")
        say("".join(traceback.format_exception(exc)[-4:]).rstrip())
        return None


def fmt(value: float | int | None, spec: str = "d") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "error"
    return format(value, spec)


async def amain() -> str:
    started = time.monotonic()
    say(f"abuse: default Config, servers on {HOST}, {os.cpu_count()} cores")
    a = Server("A")
    await a.start()
    try:
        foreign = await attempt("1 foreign", foreign_publish(a.port), 15)
        csrf_n = await attempt("8 csrf", csrf(a.port), 10)
        body = await attempt("3 body", body_before_auth(a.port), 25)
        revoked = await attempt("7 revoke", revocation(a.port), 15)
        p99 = await attempt("4 inflate", inflate(a), 35)
    finally:
        await a.stop()
    servers = {name: Server(name) for name in "BCD"}
    try:
        await asyncio.gather(*(s.start() for s in servers.values()))
        topics, idle, flood = await asyncio.gather(
            attempt("2 topics", topics_after_leave(servers["B"]), TOPICS_WAIT_S + 15),
            attempt("6 idle", idle_connections(servers["C"]), IDLE_CAP_S + 10),
            attempt("5 flood", session_flood(servers["D"]), 60),
        )
    finally:
        await asyncio.gather(*(s.stop() for s in servers.values()))
    capped, alice_refused = flood if flood is not None else (None, None)
    say(f"done in {time.monotonic() - started:.0f} s")
    return (
        f"foreign_publish_delivered={fmt(foreign)} "
        f"topics_after_leave={fmt(topics)} "
        f"body_read_before_auth_bytes={fmt(body)} "
        f"ping_p99_ms_under_inflate={fmt(p99, '.1f')} "
        f"one_client_capped={fmt(capped)} "
        f"alice_refused={fmt(alice_refused)} "
        f"idle_conn_held_s={fmt(idle, '.1f')} "
        f"revoked_session_open_s={fmt(revoked, '.3f')} "
        f"csrf_accepted={fmt(csrf_n)}"
    )


def main() -> None:
    final = asyncio.run(amain())
    print(final, flush=True)


if __name__ == "__main__":
    main()

"""rubris_asgi.client against hand-written fake servers (no rubris server involved).

The WebSocket fake is a ``websockets`` server on a free port that answers HELLO with WELCOME
(resuming when the token matches) and hands each connection to the test, which reads the client's
messages and writes server frames built with rubris_asgi.protocol. The long-poll fake is an
``httpx.MockTransport`` handler that numbers frames, re-sends frame ack+1 and can lose a
response, answer 204, or forget the session.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, TypeVar

import httpx
import orjson
import pytest
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from rubris_asgi.client import (
    CallError,
    Client,
    ConnectionLost,
    GapInfo,
    PushInfo,
    SubscribeRejected,
)
from rubris_asgi.errors import ErrorCode, ProtocolError
from rubris_asgi.protocol import (
    Ack,
    Call,
    Gap,
    Goodbye,
    Hello,
    Message,
    Mode,
    Nak,
    Ping,
    Pong,
    Publish,
    Push,
    Rejected,
    Result,
    Stream,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    Welcome,
    decode_frame,
    encode_frame,
)
from rubris_asgi.protocol.deflate import DeflateCompressor

M = TypeVar("M")
WAIT = 2.0


def js(value: Any) -> bytes:
    return orjson.dumps(value)


# --------------------------------------------------------------------------- WebSocket fake


class FakeConn:
    def __init__(self, ws: ServerConnection, hello: Hello, resumed: bool) -> None:
        self.ws = ws
        self.hello = hello
        self.resumed = resumed
        self.frames: list[bytes] = []
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.closed = asyncio.Event()

    async def send(self, *msgs: Message) -> None:
        await self.ws.send(encode_frame(msgs))

    async def expect(self, cls: type[M], timeout: float = WAIT) -> M:
        """The next client message of type ``cls`` (others are skipped)."""

        async def find() -> M:
            while True:
                m = await self.inbox.get()
                if isinstance(m, cls):
                    return m

        return await asyncio.wait_for(find(), timeout)

    async def subscribed(
        self, name: str, topic: int, mode: int = Mode.RING, codec: int = 0, epoch: int = 7
    ) -> Subscribe:
        sub = await self.expect(Subscribe)
        assert sub.name == name
        await self.send(Subscribed(sub.req, topic, mode, codec, epoch, 0, False, name))
        return sub


class FakeServer:
    def __init__(self) -> None:
        self.conns: asyncio.Queue[FakeConn] = asyncio.Queue()
        self.sessions = 0
        self.token = ""
        self.resume_ok = True
        self.heartbeat_ms = 0
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/rubris"

    async def handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None and ws.request.path == "/rubris/ws"
        assert ws.subprotocol == "rubris.v1"
        first = await ws.recv()
        assert isinstance(first, bytes)
        hello = decode_frame(first)[0]
        assert isinstance(hello, Hello) and hello.version == 1
        resumed = self.resume_ok and bool(hello.resume) and hello.resume == self.token
        if not resumed:
            self.sessions += 1
            self.token = f"tok-{self.sessions}"
        welcome = Welcome(f"s{self.sessions}", self.token, self.heartbeat_ms, 1 << 20, resumed)
        await ws.send(encode_frame([welcome]))
        conn = FakeConn(ws, hello, resumed)
        conn.frames.append(first)
        for m in decode_frame(first)[1:]:  # what came with HELLO (a resume's ring positions)
            conn.inbox.put_nowait(m)
        await self.conns.put(conn)
        try:
            async for frame in ws:
                assert isinstance(frame, bytes)
                conn.frames.append(frame)
                for m in decode_frame(frame):
                    conn.inbox.put_nowait(m)
        except ConnectionClosed:
            pass
        finally:
            conn.closed.set()

    async def next_conn(self) -> FakeConn:
        return await asyncio.wait_for(self.conns.get(), WAIT)


async def connected(server: FakeServer, **kw: Any) -> tuple[Client, FakeConn]:
    kw.setdefault("backoff", (0.01, 0.05))
    client = Client(server.url, **kw)
    await client.connect()
    return client, await server.next_conn()


async def eventually(pred: Any, timeout: float = WAIT) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


# --------------------------------------------------------------------------- tests: WebSocket


async def test_connect_gets_welcome(server: FakeServer) -> None:
    client, conn = await connected(server)
    try:
        assert client.state == "open"
        assert client.session_id == "s1"
        assert client.resumed is False
        assert client.transport == "websocket"
        assert client.welcome is not None and client.welcome.resume == "tok-1"
        assert conn.hello == Hello(1, "")
        # HELLO travels alone, first
        assert decode_frame(conn.frames[0]) == [Hello(1, "")]
        await client.wait_connected(timeout=1)
    finally:
        await client.close()
    state: str = client.state  # a plain str: mypy keeps the narrowing to "open" across await
    assert state == "closed"


async def test_connect_failure_raises_connection_lost() -> None:
    client = Client("http://127.0.0.1:9/rubris", open_timeout=1)
    with pytest.raises(ConnectionLost) as info:
        await client.connect()
    assert isinstance(info.value, ConnectionError)
    assert client.state == "closed"
    await client.close()


async def test_frames_queued_before_welcome_follow_hello(server: FakeServer) -> None:
    client = Client(server.url)
    sub_task = asyncio.ensure_future(client.subscribe("a"))
    await asyncio.sleep(0)
    await client.connect()
    conn = await server.next_conn()
    await conn.subscribed("a", topic=3)
    sub = await asyncio.wait_for(sub_task, WAIT)
    assert sub.topic == 3
    assert decode_frame(conn.frames[0]) == [Hello(1, "")]
    await client.close()


async def test_subscribe_with_sync_and_async_callbacks(server: FakeServer) -> None:
    client, conn = await connected(server)
    got: list[tuple[Any, PushInfo]] = []
    order: list[str] = []

    def on_a(value: Any, info: PushInfo) -> None:
        got.append((value, info))
        order.append(f"a{info.seq}")

    async def on_b(value: Any, info: PushInfo) -> None:
        await asyncio.sleep(0.01)  # awaited in order: b1 ends before a2 starts
        order.append(f"b{info.seq}")

    task = asyncio.ensure_future(client.subscribe("a", on_a))
    await conn.subscribed("a", topic=10, codec=0)
    sub_a = await task
    task = asyncio.ensure_future(client.subscribe("b", on_b, params={"x": 1}))
    s = await conn.subscribed("b", topic=11, codec=2)
    assert orjson.loads(s.params) == {"x": 1}
    await task
    assert (sub_a.topic, sub_a.mode, sub_a.codec, sub_a.epoch) == (10, Mode.RING, 0, 7)

    await conn.send(
        Push(10, 1, js({"v": 1})), Push(11, 1, b"text"), Push(10, 2, js([2])), Push(99, 1, b"?")
    )
    await eventually(lambda: len(order) == 3)
    assert order == ["a1", "b1", "a2"]
    assert got[0] == ({"v": 1}, PushInfo("a", 10, 1, False))
    assert got[1][0] == [2]
    assert sub_a.last_seq == 2
    assert client.stats.frames >= 2 and client.stats.messages >= 4
    await client.close()


async def test_subscription_async_iterator_and_get(server: FakeServer) -> None:
    client, conn = await connected(server)
    task = asyncio.ensure_future(client.subscribe("bin"))
    await conn.subscribed("bin", topic=4, codec=1)
    sub = await task
    await conn.send(*(Push(4, i, bytes([i])) for i in range(1, 6)))
    value, info = await sub.get(timeout=WAIT)
    assert value == b"\x01" and info.seq == 1
    seen = []
    async for value, info in sub:
        seen.append(value)
        if info.seq == 5:
            break
    assert seen == [b"\x02", b"\x03", b"\x04", b"\x05"]
    with pytest.raises(asyncio.TimeoutError):
        await sub.get(timeout=0.02)

    # unsubscribe waits for UNSUBSCRIBED and ends the iteration
    task2 = asyncio.ensure_future(client.unsubscribe(sub))
    assert (await conn.expect(Unsubscribe)).topic == 4
    assert not task2.done()
    await conn.send(Unsubscribed(4, 0, ""))
    await asyncio.wait_for(task2, WAIT)
    assert sub.ended
    assert [x async for x in sub] == []
    await client.close()


async def test_subscribe_rejected(server: FakeServer) -> None:
    client, conn = await connected(server)
    task = asyncio.ensure_future(client.subscribe("nope"))
    s = await conn.expect(Subscribe)
    await conn.send(Rejected(s.req, ErrorCode.UNKNOWN, "unknown topic"))
    with pytest.raises(SubscribeRejected) as info:
        await task
    assert (info.value.code, info.value.reason) == (3, "unknown topic")
    # the name is free again
    task = asyncio.ensure_future(client.subscribe("nope"))
    await conn.subscribed("nope", topic=1)
    await task
    await client.close()


async def test_call_result_and_error(server: FakeServer) -> None:
    client, conn = await connected(server)
    task = asyncio.ensure_future(client.call("add", [1, 2]))
    c = await conn.expect(Call)
    assert c.method == "add" and orjson.loads(c.payload) == [1, 2]
    await conn.send(Result(c.call, 0, js(3)))
    assert await task == 3

    task = asyncio.ensure_future(client.call("boom"))
    c2 = await conn.expect(Call)
    assert c2.call != c.call and c2.payload == b""
    await conn.send(Result(c2.call, 1, js({"code": 10, "message": "no way"})))
    with pytest.raises(CallError) as info:
        await task
    assert (info.value.code, info.value.message) == (10, "no way")

    with pytest.raises(asyncio.TimeoutError):
        await client.call("slow", timeout=0.05)
    assert client._calls == {}
    await client.close()


async def test_stream_items_final_item_and_error(server: FakeServer) -> None:
    client, conn = await connected(server)

    async def collect(method: str) -> list[Any]:
        return [item async for item in client.stream(method, {"n": 3})]

    task = asyncio.ensure_future(collect("count"))
    c = await conn.expect(Call)
    await conn.send(Stream(c.call, False, js(1)), Stream(c.call, False, js(2)))
    await conn.send(Stream(c.call, True, js(3)))  # a final item on last=1
    assert await task == [1, 2, 3]

    task = asyncio.ensure_future(collect("count"))
    c = await conn.expect(Call)
    await conn.send(Stream(c.call, False, js("x")), Stream(c.call, True, b""))
    assert await task == ["x"]

    seen: list[Any] = []

    async def failing() -> None:
        async for item in client.stream("bad"):
            seen.append(item)

    task2 = asyncio.ensure_future(failing())
    c = await conn.expect(Call)
    await conn.send(
        Stream(c.call, False, js(1)), Result(c.call, 1, js({"code": 4, "message": "no"}))
    )
    with pytest.raises(CallError) as info:
        await task2
    assert info.value.code == 4 and seen == [1]
    assert client._streams == {}
    await client.close()


async def test_gap_is_surfaced(server: FakeServer) -> None:
    client, conn = await connected(server)
    gaps: list[GapInfo] = []
    task = asyncio.ensure_future(client.subscribe("r", on_gap=gaps.append))
    await conn.subscribed("r", topic=2)
    sub = await task
    await conn.send(Push(2, 1, js(1)), Gap(2, 2, 3), Push(2, 5, js(5)))
    await sub.get(timeout=WAIT)
    value, info = await sub.get(timeout=WAIT)
    assert (value, info.seq) == (5, 5)
    assert sub.gaps == [GapInfo("r", 2, 3)] == gaps
    assert client.stats.gaps == 1
    await client.close()


async def test_compressed_push_is_inflated(server: FakeServer) -> None:
    client, conn = await connected(server, record=True)
    task = asyncio.ensure_future(client.subscribe("z"))
    await conn.subscribed("z", topic=5)
    sub = await task
    value = {"text": "rubris " * 500}
    raw = js(value)
    packed = DeflateCompressor().compress(raw)
    await conn.send(Push(5, 1, packed, compressed=True))
    got, info = await sub.get(timeout=WAIT)
    assert got == value and info.compressed
    assert client.stats.compressed == 1
    assert client.stats.bytes_saved == len(raw) - len(packed)
    assert client.raw_frames is not None and client.raw_frames[-1][0] == 0x82  # PUSH|COMPRESSED
    await client.close()


async def test_deflate_bomb_closes_the_client(server: FakeServer) -> None:
    client, conn = await connected(server, max_inflated=1000)
    task = asyncio.ensure_future(client.subscribe("z"))
    await conn.subscribed("z", topic=5)
    sub = await task
    pending = asyncio.ensure_future(client.call("x"))
    await conn.send(Push(5, 1, DeflateCompressor().compress(b"\0" * 100_000), compressed=True))
    with pytest.raises(ConnectionLost):
        await asyncio.wait_for(pending, WAIT)
    assert client.state == "closed"
    assert isinstance(client.error, ProtocolError) and client.error.code == ErrorCode.TOO_LARGE
    with pytest.raises(ConnectionLost):
        await sub.get(timeout=WAIT)
    await asyncio.wait_for(conn.closed.wait(), WAIT)
    await client.close()


async def test_private_ack_after_ack_every_and_duplicates_dropped(server: FakeServer) -> None:
    client, conn = await connected(server, ack_every=3, ack_interval=30)
    task = asyncio.ensure_future(client.subscribe("fills"))
    await conn.subscribed("fills", topic=8, mode=Mode.PRIVATE)
    sub = await task
    await conn.send(Push(8, 1, js(1)), Push(8, 2, js(2)))
    await eventually(lambda: sub.qsize() == 2)
    assert conn.inbox.empty()  # two messages: no ACK yet
    await conn.send(Push(8, 3, js(3)))
    assert await conn.expect(Ack) == Ack.private(8, 3)
    # a replay of what the client holds is dropped silently
    await conn.send(Push(8, 2, js(2)), Push(8, 3, js(3)), Push(8, 4, js(4)))
    values = [(await sub.get(timeout=WAIT))[0] for _ in range(4)]
    assert values == [1, 2, 3, 4]
    assert sub.qsize() == 0 and sub.last_seq == 4
    await client.close()


async def test_private_ack_timer(server: FakeServer) -> None:
    client, conn = await connected(server, ack_every=100, ack_interval=0.05)
    task = asyncio.ensure_future(client.subscribe("fills", lambda v, i: None))
    await conn.subscribed("fills", topic=8, mode=Mode.PRIVATE)
    await task
    await conn.send(Push(8, 1, js(1)))
    assert await conn.expect(Ack) == Ack.private(8, 1)
    await client.close()


async def test_reconnect_resumes_session(server: FakeServer) -> None:
    client, conn = await connected(server)
    task = asyncio.ensure_future(client.subscribe("r"))
    await conn.subscribed("r", topic=2)
    sub = await task
    call = asyncio.ensure_future(client.call("slow"))
    c = await conn.expect(Call)
    await conn.ws.close()  # the connection drops; the session lives on

    conn2 = await server.next_conn()
    assert conn2.hello == Hello(1, "tok-1") and conn2.resumed
    await client.wait_connected(timeout=WAIT)
    assert client.resumed and client.stats.reconnects == 1
    await conn2.send(Result(c.call, 0, js("late")), Push(2, 1, js("after")))
    assert await asyncio.wait_for(call, WAIT) == "late"  # a resumed session still answers
    value, info = await sub.get(timeout=WAIT)
    assert value == "after" and info.topic == 2 and sub.topic == 2
    await client.close()


async def test_reconnect_without_resume_subscribes_again(server: FakeServer) -> None:
    client, conn = await connected(server)
    task = asyncio.ensure_future(client.subscribe("ring"))
    await conn.subscribed("ring", topic=2, epoch=7)
    ring = await task
    task = asyncio.ensure_future(client.subscribe("mine"))
    await conn.subscribed("mine", topic=3, mode=Mode.PRIVATE, epoch=1)
    mine = await task
    await conn.send(Push(2, 41, js(41)), Push(2, 42, js(42)), Push(3, 5, js(5)))
    await eventually(lambda: ring.qsize() == 2 and mine.qsize() == 1)
    call = asyncio.ensure_future(client.call("slow"))
    await conn.expect(Call)

    server.resume_ok = False
    await conn.ws.close()
    conn2 = await server.next_conn()
    assert conn2.hello.resume == "tok-1" and not conn2.resumed
    with pytest.raises(ConnectionLost):
        await asyncio.wait_for(call, WAIT)
    s1 = await conn2.expect(Subscribe)
    s2 = await conn2.expect(Subscribe)
    assert (s1.name, s1.epoch, s1.since) == ("ring", 7, 42)
    assert (s2.name, s2.epoch, s2.since) == ("mine", 0, 0)
    await conn2.send(
        Subscribed(s1.req, 20, Mode.RING, 0, 7, 45, True, "ring"),
        Subscribed(s2.req, 21, Mode.PRIVATE, 0, 1, 0, False, "mine"),
        Push(20, 43, js(43)),
        Push(21, 1, js("fresh")),  # a new private queue: seq 1 is not a duplicate
    )
    await eventually(lambda: ring.qsize() == 3 and mine.qsize() == 2)
    assert (ring.topic, ring.recovered, ring.last_seq) == (20, True, 43)
    assert mine.topic == 21
    assert [(await ring.get())[0] for _ in range(3)] == [41, 42, 43]
    assert [(await mine.get())[0] for _ in range(2)] == [5, "fresh"]
    await client.close()


async def test_goodbye_shutting_down_reconnects_other_codes_close(server: FakeServer) -> None:
    client, conn = await connected(server)
    await conn.send(Goodbye(ErrorCode.SHUTTING_DOWN, "restart"))
    conn2 = await server.next_conn()
    assert conn2.hello.resume == "tok-1"
    await client.wait_connected(timeout=WAIT)
    assert client.stats.goodbye == (9, "restart")

    await conn2.send(Goodbye(ErrorCode.NOT_AUTHORISED, "go away"))
    await eventually(lambda: client.state == "closed")
    assert client.stats.goodbye == (4, "go away")
    with pytest.raises(ConnectionLost):
        await client.call("x")
    await client.close()


async def test_heartbeat_pings_and_drops_a_silent_server(server: FakeServer) -> None:
    server.heartbeat_ms = 50
    client, conn = await connected(server)
    ping = await conn.expect(Ping)
    await conn.send(Pong(ping.token))
    # the fake stops answering: the client drops the connection after 2 x 50 ms and resumes
    conn2 = await server.next_conn()
    assert conn2.hello.resume == "tok-1"
    await client.close()


async def test_ping_publish_and_nak(server: FakeServer) -> None:
    client, conn = await connected(server)
    task = asyncio.ensure_future(client.ping())
    p = await conn.expect(Ping)
    await conn.send(Pong(p.token))
    assert 0 <= await task < WAIT

    await client.publish("chat", {"m": "hi"})
    pub = await conn.expect(Publish)
    assert (pub.name, orjson.loads(pub.payload)) == ("chat", {"m": "hi"})
    await conn.send(Rejected(pub.req, 3, "unknown topic"))
    await eventually(lambda: client.stats.rejected == 1)
    assert client.rejections[-1].name == "chat"

    await client.send_nak(75)
    assert await conn.expect(Nak) == Nak(75)
    await client.close()


async def test_close_leaves_no_task_behind(server: FakeServer) -> None:
    before = asyncio.all_tasks()
    client, conn = await connected(server)
    task = asyncio.ensure_future(client.subscribe("r"))
    await conn.subscribed("r", topic=2, mode=Mode.PRIVATE)
    sub = await task
    pending = asyncio.ensure_future(client.call("never"))
    await conn.expect(Call)
    assert len(asyncio.all_tasks() - before) > 2
    await client.close()
    with pytest.raises(ConnectionLost):
        await pending
    assert sub.ended
    await asyncio.wait_for(conn.closed.wait(), WAIT)
    await eventually(lambda: all(t.done() for t in asyncio.all_tasks() - before - {pending}))
    left = [t for t in asyncio.all_tasks() - before if not t.done()]
    assert left == []
    assert client.state == "closed"


async def test_resume_restates_ring_positions_in_the_hello_frame(server: FakeServer) -> None:
    # protocol.md section 5, "Resume is exact": HELLO with the token, then in the same frame a
    # SUBSCRIBE per ring topic held (epoch, last seq received); snapshot and private are not
    client, conn = await connected(server)
    gaps: list[GapInfo] = []
    seen: list[int] = []
    task = asyncio.ensure_future(
        client.subscribe("r", lambda v, i: seen.append(i.seq), on_gap=gaps.append)
    )
    await conn.subscribed("r", topic=2, epoch=7)
    ring = await task
    task2 = asyncio.ensure_future(client.subscribe("s"))
    await conn.subscribed("s", topic=3, mode=Mode.SNAPSHOT, epoch=7)
    await task2
    task3 = asyncio.ensure_future(client.subscribe("p"))
    await conn.subscribed("p", topic=4, mode=Mode.PRIVATE, epoch=1)
    await task3
    await conn.send(Push(2, 1, js(1)), Push(2, 2, js(2)), Push(2, 3, js(3)), Push(3, 1, js("s")))
    await eventually(lambda: seen == [1, 2, 3])
    await conn.ws.close()

    conn2 = await server.next_conn()
    first = decode_frame(conn2.frames[0])
    assert first[0] == Hello(1, "tok-1") and conn2.resumed
    restated = first[1:]
    assert len(restated) == 1 and isinstance(restated[0], Subscribe)
    r = restated[0]
    assert (r.name, r.epoch, r.since, r.params) == ("r", 7, 3, b"")
    assert r.req in client._sub_reqs
    await client.wait_connected(timeout=WAIT)
    # the answer to the repositioning: same topic, then a GAP for what the ring lost, the
    # replay (3 again: a duplicate the client drops), and what is newer
    await conn2.send(
        Subscribed(r.req, 2, Mode.RING, 0, 7, 6, False, "r"),
        Gap(2, 4, 1),
        Push(2, 3, js(3)),
        Push(2, 5, js(5)),
        Push(2, 6, js(6)),
    )
    await eventually(lambda: seen[-1:] == [6])
    assert seen == [1, 2, 3, 5, 6]
    assert gaps == [GapInfo("r", 4, 1)]
    assert (ring.topic, ring.recovered, ring.head, ring.last_seq) == (2, False, 6, 6)
    assert ring.active and client.stats.duplicates == 1
    assert r.req not in client._sub_reqs
    # no second SUBSCRIBE of anything follows
    await conn2.send(Push(2, 7, js(7)))
    await eventually(lambda: seen[-1:] == [7])
    later = [m for f in conn2.frames[1:] for m in decode_frame(f)]
    assert not any(isinstance(m, Subscribe) for m in later)
    await client.close()


async def test_resume_restatement_after_an_unsubscribe_in_between(server: FakeServer) -> None:
    # an unsubscribe while the restated SUBSCRIBE waits for its answer sends UNSUBSCRIBE once
    client, conn = await connected(server)
    task = asyncio.ensure_future(client.subscribe("r"))
    await conn.subscribed("r", topic=2, epoch=7)
    ring = await task
    await conn.send(Push(2, 1, js(1)))
    await eventually(lambda: ring.last_seq == 1)
    await conn.ws.close()
    conn2 = await server.next_conn()
    r = await conn2.expect(Subscribe)
    assert (r.epoch, r.since) == (7, 1)
    await client.wait_connected(timeout=WAIT)
    done = asyncio.ensure_future(client.unsubscribe(ring))
    assert await conn2.expect(Unsubscribe) == Unsubscribe(2)
    await conn2.send(Subscribed(r.req, 2, Mode.RING, 0, 7, 1, True, "r"), Unsubscribed(2, 0, ""))
    await asyncio.wait_for(done, WAIT)
    assert ring.ended
    await asyncio.sleep(0.05)
    assert conn2.inbox.empty()  # no second UNSUBSCRIBE
    await client.close()


async def test_resume_of_a_ring_with_a_new_epoch_starts_after_head(server: FakeServer) -> None:
    client, conn = await connected(server)
    task = asyncio.ensure_future(client.subscribe("r"))
    await conn.subscribed("r", topic=2, epoch=7)
    ring = await task
    await conn.send(Push(2, 1, js(1)), Push(2, 2, js(2)))
    await eventually(lambda: ring.qsize() == 2)
    await conn.ws.close()
    conn2 = await server.next_conn()
    r = await conn2.expect(Subscribe)
    await conn2.send(Subscribed(r.req, 2, Mode.RING, 0, 8, 40, False, "r"), Push(2, 41, js(41)))
    await eventually(lambda: ring.qsize() == 3)
    assert [(await ring.get())[0] for _ in range(3)] == [1, 2, 41]
    assert (ring.epoch, ring.recovered, ring.last_seq) == (8, False, 41)
    await client.close()


async def test_a_gap_never_names_what_was_received(server: FakeServer) -> None:
    client, conn = await connected(server)
    gaps: list[GapInfo] = []
    task = asyncio.ensure_future(client.subscribe("r", on_gap=gaps.append))
    await conn.subscribed("r", topic=2)
    sub = await task
    await conn.send(Push(2, 1, js(1)), Push(2, 2, js(2)), Push(2, 3, js(3)))
    await conn.send(Gap(2, 2, 2), Gap(2, 3, 3), Push(2, 6, js(6)))
    await eventually(lambda: sub.qsize() == 4)
    assert gaps == [GapInfo("r", 4, 2)] == sub.gaps
    assert sub.last_seq == 6
    await client.close()


async def test_late_joiner_asks_for_last_on_the_first_subscribe_only(server: FakeServer) -> None:
    client, conn = await connected(server)
    with pytest.raises(ValueError):
        await client.subscribe("r", last=0)
    with pytest.raises(ValueError):
        await client.subscribe("r", last=True)
    with pytest.raises(TypeError):
        await client.subscribe("r", params=[1], last=3)
    task = asyncio.ensure_future(client.subscribe("r", params={"a": 1}, last=5))
    s = await conn.expect(Subscribe)
    assert (s.name, s.epoch, s.since) == ("r", 0, 0)
    assert orjson.loads(s.params) == {"a": 1, "last": 5}
    # the ring holds 8..10 only: it replays those (fewer than asked)
    await conn.send(Subscribed(s.req, 2, Mode.RING, 0, 7, 10, False, "r"))
    ring = await task
    assert ring.last_seq == 5  # head - last: a resume now would state 5
    await conn.send(Push(2, 8, js(8)), Push(2, 9, js(9)), Push(2, 10, js(10)), Push(2, 11, js(11)))
    assert [(await ring.get(timeout=WAIT))[0] for _ in range(4)] == [8, 9, 10, 11]
    task2 = asyncio.ensure_future(client.subscribe("q", last=2))
    s2 = await conn.expect(Subscribe)
    assert orjson.loads(s2.params) == {"last": 2}
    await conn.send(Subscribed(s2.req, 3, Mode.RING, 0, 7, 0, False, "q"))
    q = await task2
    assert q.last_seq == 0

    # a new session: the re-subscribe goes on from epoch/since, without `last`
    server.resume_ok = False
    await conn.ws.close()
    conn2 = await server.next_conn()
    again = sorted(
        [m for m in decode_frame(conn2.frames[0])[1:] if isinstance(m, Subscribe)],
        key=lambda m: m.name,
    )
    assert [(m.name, m.epoch, m.since) for m in again] == [("q", 7, 0), ("r", 7, 11)]
    assert orjson.loads(again[1].params) == {"a": 1}
    assert again[0].params == b""
    await client.close()


async def test_last_is_asked_again_when_the_first_answer_never_came(server: FakeServer) -> None:
    client, conn = await connected(server)
    task = asyncio.ensure_future(client.subscribe("r", last=3))
    s = await conn.expect(Subscribe)
    assert orjson.loads(s.params) == {"last": 3}
    server.resume_ok = False
    await conn.ws.close()
    conn2 = await server.next_conn()
    s2 = await conn2.expect(Subscribe)
    assert (s2.name, s2.epoch, s2.since, orjson.loads(s2.params)) == ("r", 0, 0, {"last": 3})
    await conn2.send(Subscribed(s2.req, 5, Mode.RING, 0, 7, 9, False, "r"))
    ring = await asyncio.wait_for(task, WAIT)
    assert ring.last_seq == 6
    await client.close()


# --------------------------------------------------------------------------- long-poll fake


class FakeLongPoll:
    """The server side of protocol.md section 7, in an httpx.MockTransport handler."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []  # frame n is frames[n-1]
        self.acks: list[int] = []
        self.hellos: list[Hello] = []
        self.with_hello: list[list[Message]] = []  # what each HELLO's frame carried after it
        self.posted: list[Message] = []
        self.lose: set[int] = set()  # frame numbers whose first response is lost
        self.empty_polls = 0  # answer this many polls with 204 first
        self.gone_once = False
        self.token = "lp-tok"
        self.data = asyncio.Event()

    def queue(self, *msgs: Message) -> None:
        self.frames.append(encode_frame(msgs))
        self.data.set()

    async def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "POST" and path == "/rubris/lp":
            hello, *with_hello = decode_frame(request.content)
            assert isinstance(hello, Hello)
            self.hellos.append(hello)
            self.with_hello.append(with_hello)
            self.frames = []  # frames are numbered per long-poll session
            resumed = hello.resume == self.token
            body = encode_frame([Welcome("lp1", self.token, 25_000, 1 << 20, resumed)])
            return httpx.Response(200, content=body)
        assert path == "/rubris/lp/lp1"
        if request.method == "POST":
            assert request.headers["content-type"] == "application/octet-stream"
            for m in decode_frame(request.content):
                self.posted.append(m)
                if isinstance(m, Subscribe):
                    self.queue(Subscribed(m.req, 1, Mode.RING, 0, 3, 0, False, m.name))
                elif isinstance(m, Call):
                    self.queue(Result(m.call, 0, m.payload))
            return httpx.Response(202)
        ack = int(request.url.params["ack"])
        self.acks.append(ack)
        if self.gone_once:
            self.gone_once = False
            return httpx.Response(404, text="unknown or ended session")
        if self.empty_polls:
            self.empty_polls -= 1
            return httpx.Response(204)
        if ack >= len(self.frames):
            self.data.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.data.wait(), 0.05)
        if ack < len(self.frames):
            n = ack + 1
            if n in self.lose:
                self.lose.discard(n)
                raise httpx.ReadError("response lost on the way")
            return httpx.Response(200, content=self.frames[n - 1], headers={"Rubris-Frame": str(n)})
        return httpx.Response(204)


async def test_longpoll_session() -> None:
    fake = FakeLongPoll()
    fake.empty_polls = 2
    client = Client(
        "http://rubris.test/rubris/",
        transport="longpoll",
        http_transport=httpx.MockTransport(fake.handler),
        backoff=(0.01, 0.05),
    )
    await client.connect()
    assert client.session_id == "lp1" and client.transport == "longpoll"
    assert fake.hellos == [Hello(1, "")]

    sub = await asyncio.wait_for(client.subscribe("t"), WAIT)  # POST, 204 x 2, then frame 1
    assert sub.topic == 1
    assert fake.acks[:3] == [0, 0, 0]

    fake.lose.add(2)
    fake.queue(Push(1, 1, js("a")), Push(1, 2, js("b")))
    assert (await sub.get(timeout=WAIT))[0] == "a"
    assert (await sub.get(timeout=WAIT))[0] == "b"
    # frame 2's response was lost: the client polled again with ack=1 and got it once
    i = fake.acks.index(1)
    assert fake.acks[i : i + 3] == [1, 1, 2]
    assert client.stats.messages == 4  # WELCOME, SUBSCRIBED, 2 x PUSH

    assert await asyncio.wait_for(client.call("echo", {"k": 1}), WAIT) == {"k": 1}
    kinds = [type(m).__name__ for m in fake.posted]
    assert kinds == ["Subscribe", "Call"]

    # the session is gone (404): a new HELLO with the resume token, numbering starts again
    fake.gone_once = True
    await eventually(lambda: len(fake.hellos) == 2)
    assert fake.hellos[1] == Hello(1, "lp-tok")
    await client.wait_connected(timeout=WAIT)
    assert client.resumed
    fake.queue(Push(1, 3, js("c")))
    assert (await sub.get(timeout=WAIT))[0] == "c"
    assert fake.acks[-1] in (0, 1)
    await client.close()
    assert client.state == "closed"


async def test_longpoll_post_order_is_kept() -> None:
    fake = FakeLongPoll()
    client = Client(
        "http://rubris.test/rubris",
        transport="longpoll",
        http_transport=httpx.MockTransport(fake.handler),
    )
    await client.connect()
    results = await asyncio.wait_for(
        asyncio.gather(*(client.call("echo", i) for i in range(20))), WAIT
    )
    assert results == list(range(20))
    calls = [m for m in fake.posted if isinstance(m, Call)]
    assert [orjson.loads(c.payload) for c in calls] == list(range(20))
    await client.close()


async def test_longpoll_superseded_stops() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(200, content=encode_frame([Welcome("x", "t", 0, 0, False)]))
        return httpx.Response(409, text="superseded by a newer poll")

    client = Client(
        "http://rubris.test/rubris",
        transport="longpoll",
        http_transport=httpx.MockTransport(handler),
    )
    await client.connect()
    await eventually(lambda: client.state == "closed")
    assert client.error is not None
    await client.close()


async def test_longpoll_resume_restates_ring_positions() -> None:
    # a long-poll session that says HELLO again (its poll got 404) restates its rings the same way
    fake = FakeLongPoll()
    client = Client(
        "http://rubris.test/rubris",
        transport="longpoll",
        http_transport=httpx.MockTransport(fake.handler),
        backoff=(0.01, 0.05),
    )
    await client.connect()
    sub = await asyncio.wait_for(client.subscribe("t"), WAIT)  # ring, epoch 3, head 0
    fake.queue(Push(1, 1, js("a")), Push(1, 2, js("b")))
    assert [(await sub.get(timeout=WAIT))[0] for _ in range(2)] == ["a", "b"]
    fake.gone_once = True
    await eventually(lambda: len(fake.hellos) == 2)
    assert fake.hellos[1] == Hello(1, "lp-tok") and fake.with_hello[0] == []
    (r,) = fake.with_hello[1]
    assert isinstance(r, Subscribe) and (r.name, r.epoch, r.since) == ("t", 3, 2)
    await client.wait_connected(timeout=WAIT)
    fake.queue(Subscribed(r.req, 1, Mode.RING, 0, 3, 3, True, "t"), Push(1, 2, js("b")))
    fake.queue(Push(1, 3, js("c")))
    assert (await sub.get(timeout=WAIT))[0] == "c"
    assert sub.recovered and client.stats.duplicates == 1
    await client.close()

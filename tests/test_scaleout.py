"""Several real server processes sharing their topics through a real Redis.

Nodes are ``uvicorn`` processes (tests/cluster_app.py) with ``RUBRIS_REDIS_URL`` set, each on
its own port, or one ``rubris_asgi.serve(..., workers=2)``; clients are the Python client,
directly or through a ``Balancer``. Nothing is shared but Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from rubris_asgi.client import Client

from .cluster_app import TOKEN
from .lbkit import Balancer
from .netkit import free_port
from .rediskit import RedisServer

pytestmark = pytest.mark.redis  # every test here runs a real redis-server

START_S = 20.0


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


async def until(cond: Any, what: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not reached in {timeout} s: {what}")


async def _up(base: str, proc: asyncio.subprocess.Process) -> None:
    async with httpx.AsyncClient(timeout=2) as http:
        for _ in range(int(START_S / 0.05)):
            if proc.returncode is not None:
                raise AssertionError(f"the server exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(base + "/rubris/client.js")).status_code == 200:
                    return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{base} did not come up in {START_S} s")


@contextlib.asynccontextmanager
async def process(
    argv: list[str], url: str, port: int
) -> AsyncIterator[asyncio.subprocess.Process]:
    env = {**os.environ, "RUBRIS_REDIS_URL": url}
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdin=subprocess.DEVNULL)
    try:
        await _up(f"http://127.0.0.1:{port}", proc)
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()


def uvicorn_node(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "tests.cluster_app:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
        "--ws-per-message-deflate",
        "false",
    ]


@contextlib.asynccontextmanager
async def two_nodes(url: str) -> AsyncIterator[list[tuple[asyncio.subprocess.Process, str]]]:
    ports = [free_port(), free_port()]
    async with contextlib.AsyncExitStack() as stack:
        procs = await asyncio.gather(
            *(stack.enter_async_context(process(uvicorn_node(p), url, p)) for p in ports)
        )
        yield [(proc, f"http://127.0.0.1:{p}") for proc, p in zip(procs, ports, strict=True)]


async def publish(http: httpx.AsyncClient, base: str, topic: str, values: list[Any]) -> None:
    r = await http.post(
        base + "/rubris/api/publish",
        json=[{"topic": topic, "data": v} for v in values],
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert r.status_code == 200, r.text


async def collect(c: Client, name: str) -> tuple[Any, list[tuple[int, Any]]]:
    got: list[tuple[int, Any]] = []
    sub = await c.subscribe(name, lambda value, info: got.append((info.seq, value)))
    return sub, got


async def test_a_publish_on_one_process_reaches_clients_of_both(redis: RedisServer) -> None:
    redis.flush()
    async with two_nodes(redis.url) as [(_, base_a), (_, base_b)]:
        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(Client(base + "/rubris"))
                for base in (base_a, base_a, base_a, base_b, base_b, base_b)
            ]
            subs = [await collect(c, "ring.p") for c in clients]
            assert len({await c.call("pid", None) for c in clients}) == 2
            async with httpx.AsyncClient() as http:
                for i in range(10):
                    await publish(http, base_a if i % 2 else base_b, "ring.p", [i, i + 100])
            await until(lambda: all(len(got) == 20 for _, got in subs), "20 on every client")
            first = subs[0][1]
            assert [seq for seq, _ in first] == list(range(1, 21))
            for sub, got in subs:
                assert got == first and sub.epoch == subs[0][0].epoch


async def test_a_killed_process_leaves_the_other_serving_and_its_clients_recover(
    redis: RedisServer,
) -> None:
    redis.flush()
    async with two_nodes(redis.url) as [(proc_a, base_a), (_, base_b)]:
        async with Balancer([base_a, base_b]) as lb, httpx.AsyncClient() as http:
            async with (
                Client(lb.base + "/rubris", backoff=(0.05, 0.3)) as moved,
                Client(base_b + "/rubris") as stays,
            ):
                sub_m, got_m = await collect(moved, "ring.k")
                _, got_s = await collect(stays, "ring.k")
                await publish(http, base_b, "ring.k", list(range(5)))
                await until(lambda: len(got_m) == len(got_s) == 5, "5 before the kill")
                lb.route(1)  # where the load balancer sends reconnections
                proc_a.kill()
                await proc_a.wait()
                await publish(http, base_b, "ring.k", list(range(5, 8)))
                await until(lambda: len(got_s) == 8, "B's client unaffected")
                await until(lambda: len(got_m) == 8, "A's client recovered on B", 15)
                assert not moved.resumed and sub_m.recovered and not sub_m.gaps
                assert got_m == got_s == [(i + 1, i) for i in range(8)]
                assert moved.stats.reconnects >= 1 and stays.stats.reconnects == 0


async def test_a_killed_process_queue_items_go_to_the_consumers_of_the_other(
    redis: RedisServer,
) -> None:
    """Work items held by a worker killed with SIGKILL (its consumer had them, unacked) come
    back to the queue once the worker misses its heartbeat, and the other worker's consumer
    gets them as redeliveries (attempt 2); nothing is lost or done twice by the survivors."""
    redis.flush()
    async with two_nodes(redis.url) as [(proc_a, base_a), (_, base_b)]:
        async with (
            Client(base_a + "/rubris", reconnect=False) as on_a,
            Client(base_b + "/rubris") as on_b,
            httpx.AsyncClient() as http,
        ):
            held = await on_a.consume("work", prefetch=4)
            r = await http.post(
                base_b + "/rubris/api/enqueue",
                json=[{"topic": "work", "data": i} for i in range(10)],
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            assert r.status_code == 200, r.text
            taken = [await held.get(timeout=5) for _ in range(4)]  # A's, never acked
            done: list[Any] = []
            consumer = await on_b.consume("work", prefetch=4)

            async def work() -> None:
                async for item in consumer:
                    done.append((item.value, item.attempt))
                    item.ack()

            task = asyncio.create_task(work())
            await until(lambda: len(done) == 6, "the 6 A did not hold, on B")
            proc_a.kill()
            await proc_a.wait()
            await until(lambda: len(done) == 10, "A's 4 back after its heartbeat lapsed", 15)
            assert sorted(v for v, _ in done) == list(range(10))
            again = {v for v, a in done if a == 2}
            assert again == {item.value for item in taken}  # the redeliveries, marked so
            await consumer.close()
            await asyncio.wait_for(task, 5)


async def test_serve_with_two_workers_shares_topics_and_drains(redis: RedisServer) -> None:
    redis.flush()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    code = (
        "from rubris_asgi import serve; "
        f"serve('tests.cluster_app:app', port={port}, workers=2, log_level='warning')"
    )
    async with process([sys.executable, "-c", code], redis.url, port) as proc:
        async with contextlib.AsyncExitStack() as stack:
            clients: list[Client] = []
            pids: set[int] = set()
            deadline = asyncio.get_running_loop().time() + 20
            while len(pids) < 2:  # the kernel spreads connections over the workers
                # by time, not by count: a worker that starts later (it reads Redis's
                # persistence first) takes no connection until it listens
                assert asyncio.get_running_loop().time() < deadline, f"all went to {pids}"
                c = Client(base + "/rubris", reconnect=False)
                await c.__aenter__()
                pid = await c.call("pid", None)
                if pid in pids:  # one client a worker is enough
                    await c.__aexit__(None, None, None)
                    await asyncio.sleep(0.05)
                    continue
                stack.push_async_exit(c.__aexit__)
                clients.append(c)
                pids.add(pid)
            subs = [await collect(c, "snap.w") for c in clients]
            async with httpx.AsyncClient() as http:
                await publish(http, base, "snap.w", [{"v": 1}])
            await until(lambda: all(got == [(1, {"v": 1})] for _, got in subs), "on both")
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
            # each worker drained its own sessions: every client was told why
            await until(lambda: all(c.stats.goodbye is not None for c in clients), "GOODBYE")
            assert {c.stats.goodbye[0] for c in clients if c.stats.goodbye} == {9}


async def test_serve_with_two_workers_and_no_broker_refuses_to_start() -> None:
    port = free_port()
    code = (
        "from rubris_asgi import serve; "
        f"serve('tests.cluster_app:app', port={port}, workers=2, log_level='warning')"
    )
    env = {k: v for k, v in os.environ.items() if k != "RUBRIS_REDIS_URL"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        env=env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 3
    assert b"workers without a broker" in err and b"RUBRIS_REDIS_URL" in err


async def test_a_websocket_moved_between_processes_loses_nothing_private(
    redis: RedisServer,
) -> None:
    """Reconnected to process B while A lives, a WebSocket client resumes its session on A
    through B; private messages sent to it from B (``send_to``) before, during and after the
    move all arrive, once, in order."""
    redis.flush()
    async with two_nodes(redis.url) as [(_, base_a), (_, base_b)]:
        async with Balancer([base_a, base_b]) as lb:
            async with (
                Client(lb.base + "/rubris", backoff=(0.05, 0.3)) as moved,
                Client(base_b + "/rubris") as sender,
            ):
                _, private = await collect(moved, "inbox")
                sid = moved.session_id
                a_pid = await moved.call("pid", None)
                send = {"sid": sid, "start": 0, "stop": 10}
                assert await sender.call("send_inbox", send) == 10
                await until(lambda: len(private) == 10, "10 before the move")
                lb.route(1)
                lb.cut()
                await sender.call("send_inbox", {**send, "start": 10, "stop": 20})  # away
                await until(lambda: moved.stats.reconnects == 1 and moved.state == "open", "back")
                assert moved.resumed and moved.session_id == sid
                assert await moved.call("pid", None) == a_pid  # its session still lives on A
                await sender.call("send_inbox", {**send, "start": 20, "stop": 30})
                await until(lambda: len(private) == 30, "30 private messages", 15)
                assert [v["n"] for _, v in private] == list(range(30))


async def test_long_poll_alternating_between_processes_loses_nothing(redis: RedisServer) -> None:
    redis.flush()
    async with two_nodes(redis.url) as [(_, base_a), (_, base_b)]:
        async with (
            Balancer([base_a, base_b], rotate=True) as lb,
            httpx.AsyncClient() as http,
        ):
            fresh = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))
            async with Client(lb.base + "/rubris", transport="longpoll", http_transport=fresh) as c:
                _, got = await collect(c, "ring.lp")
                _, private = await collect(c, "inbox")
                send = {"sid": c.session_id, "start": 0, "stop": 0}
                for i in range(20):
                    await publish(http, base_a if i % 2 else base_b, "ring.lp", [i])
                    await c.call("send_inbox", {**send, "start": i, "stop": i + 1})
                await until(lambda: len(got) == 20 and len(private) == 20, "everything", 20)
                assert got == [(i + 1, i) for i in range(20)]
                assert [v["n"] for _, v in private] == list(range(20))
                assert min(lb.connections) >= 10 and c.stats.reconnects == 0

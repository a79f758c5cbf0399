"""A server stopped and started again under each ASGI server: every Python client comes back.

tests/restart_app.py runs as its own process (uvicorn's command line, hypercorn, granian, the
middleware form under uvicorn, and ``rubris_asgi.serve``) with a subscriber, a queue consumer,
a producer and example_app/worker.py connected. The server is stopped (SIGTERM, as a deploy
does) and a new one started on the same port. Each client must be back and working on the new
server within its backoff, having logged one line (a WARNING: what happened, and that it is
reconnecting), and no handshake may have been refused with 403 on the way: a starting or
stopping rubris answers "not now" (close 1012/1013, HTTP 503), which clients retry, never a
refusal for good, which they must not (server/refusals.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rubris_asgi.client import Client, QueueItem

from .netkit import free_port, stop_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parent.parent
BACKOFF = (0.05, 1.0)
"""The in-test clients' backoff: each is back within ``BACKOFF[1]`` of the new server."""
WORKER_BACKOFF = 2.0
"""The example worker's, the client's default."""
SLACK = 2.0
"""What a loaded machine may add to a reconnect (a handshake, a SUBSCRIBE) beyond the backoff."""

COMMANDS: dict[str, Callable[[int], list[str]]] = {
    "uvicorn": lambda port: [
        *("-m", "uvicorn", "tests.restart_app:app", "--host", "127.0.0.1"),
        *("--port", str(port)),
    ],
    "hypercorn": lambda port: [
        *("-m", "hypercorn", "tests.restart_app:app", "--bind", f"127.0.0.1:{port}"),
    ],
    "granian": lambda port: [
        *("-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port)),
        "tests.restart_app:app",
    ],
    "middleware": lambda port: [
        *("-m", "uvicorn", "tests.restart_app:wrapped", "--host", "127.0.0.1"),
        *("--port", str(port)),
    ],
    "serve": lambda port: ["-m", "tests.restart_app", str(port)],
}


class ServerProcess:
    """One run of the app's server: its process and everything it printed."""

    def __init__(self, kind: str, port: int) -> None:
        self.kind = kind
        self.port = port
        self.proc: asyncio.subprocess.Process | None = None
        self.output = bytearray()
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> float:
        """Start it; return when it answers HTTP (the loop's clock then)."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *COMMANDS[self.kind](self.port),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = asyncio.create_task(self._read())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        async with httpx.AsyncClient(timeout=2) as http:
            while loop.time() < deadline:
                assert self.proc.returncode is None, self.text()
                with contextlib.suppress(httpx.TransportError):
                    r = await http.get(f"http://127.0.0.1:{self.port}/rubris/client.js")
                    if r.status_code == 200:
                        return loop.time()
                await asyncio.sleep(0.05)
        raise AssertionError(f"{self.kind} did not start:\n{self.text()}")

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while chunk := await self.proc.stdout.read(65536):
            self.output += chunk

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            await stop_process(self.proc, timeout=20)
        if self._reader is not None:
            await self._reader

    def text(self) -> str:
        return self.output.decode(errors="replace")


@contextlib.asynccontextmanager
async def example_worker(base: str) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "example_app.worker", "--url", base, "--name", "w1", "--work", "0.01"),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


async def until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout:.1f} s: {what}")
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("kind", list(COMMANDS))
async def test_every_client_is_back_after_a_restart_with_one_line_and_no_403(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rubris_asgi.client")
    port = free_port()
    base = f"http://127.0.0.1:{port}/rubris"
    first = ServerProcess(kind, port)
    second = ServerProcess(kind, port)
    ticks: list[Any] = []
    jobs: list[Any] = []
    results: list[Any] = []

    async def job(item: QueueItem) -> None:
        jobs.append(item.value)

    await first.start()
    sub = Client(base, transport="longpoll", backoff=BACKOFF)
    consumer = Client(base, backoff=BACKOFF)
    producer = Client(base, backoff=BACKOFF)
    clients = [sub, consumer, producer]
    try:
        for c in clients:
            await c.connect()
        topics = [
            await sub.subscribe("ticks", lambda value, info: ticks.append(value)),
            await consumer.consume("jobs", job),
            await producer.subscribe("reprice.results", lambda v, info: results.append(v)),
        ]
        async with example_worker(base) as worker:
            assert worker.stdout is not None and worker.stderr is not None
            line = await asyncio.wait_for(worker.stdout.readline(), 20)
            assert b"working reprice jobs" in line, line

            async def round_trip(n: int, timeout: float) -> None:
                """A tick reaches the subscriber, a job the consumer, a reprice job the worker
                (its result comes back on reprice.results)."""
                await producer.publish("ticks", {"n": n})
                await producer.enqueue("jobs", {"n": n})
                await producer.enqueue("reprice", {"job": n, "symbol": "AAPL", "last": 100.0})
                await until(lambda: {"n": n} in ticks, timeout, f"tick {n} on {kind}")
                await until(lambda: {"n": n} in jobs, timeout, f"job {n} on {kind}")
                await until(lambda: any(r["job"] == n for r in results), timeout, f"reprice {n}")

            await round_trip(1, 10)
            caplog.clear()
            stopped = time.monotonic()
            await first.stop()
            ready = await second.start()
            loop = asyncio.get_running_loop()
            # every in-test client is back within its backoff of the new server's start
            for c in clients:
                await until(
                    lambda c=c: c.state == "open" and c.stats.reconnects == 1,
                    ready - loop.time() + BACKOFF[1] + SLACK,
                    f"{c.transport} client back on {kind}",
                )
            # subscribed again (new sessions: a new process remembers none)
            for topic in topics:
                await until(lambda t=topic: t.active, SLACK, f"{topic.name} subscribed again")
            # the worker too: its reprice result comes back
            await round_trip(2, max(0.0, ready - loop.time()) + WORKER_BACKOFF + SLACK + 1)
            took = time.monotonic() - stopped
            assert worker.returncode is None, "the worker gave up"
            worker.terminate()
            _, err = await worker.communicate()
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        lines = [r.getMessage() for r in warnings]
        assert len(lines) == 3, lines  # one per client
        assert all("connection lost" in m and "reconnecting" in m for m in lines), lines
        worker_lines = [x for x in err.decode().splitlines() if x.strip()]
        assert len(worker_lines) == 1 and "reconnecting" in worker_lines[0], worker_lines
        for text in (*lines, *worker_lines, first.text(), second.text()):
            assert " 403" not in text and "403 Forbidden" not in text, text
        assert took < 60, took
    finally:
        for c in clients:
            await c.close()
        await first.stop()
        await second.stop()

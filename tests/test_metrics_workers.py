"""The scrape with two uvicorn workers: either worker answers for both.

A real ``uvicorn --workers 2`` in a subprocess, sharing ``RUBRIS_STATS_DIR``. Sessions are
spread over the workers by the kernel; every scrape, whichever worker takes it, must list both
workers and count every session exactly once. A worker that stops removes its file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rubris_asgi.protocol import Subscribe
from tests.netkit import free_port, stop_process
from tests.wirekit import ws_hello, ws_open
from tests.workers_app import TOKEN

SESSIONS = 12


def _connected(text: str) -> tuple[set[str], float]:
    workers: set[str] = set()
    connected = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "rubris_worker_info":
                workers.add(s.labels["worker"])
            if s.name == "rubris_sessions" and s.labels["state"] == "connected":
                connected += s.value
    return workers, connected


@pytest.mark.slow
async def test_any_worker_answers_for_both(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stats = tmp_path / "stats"
    env = {**os.environ, "RUBRIS_STATS_DIR": str(stats)}
    proc = await asyncio.create_subprocess_exec(
        *[
            sys.executable,
            "-m",
            "uvicorn",
            "tests.workers_app:app",
            "--workers",
            "2",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
            "--ws-per-message-deflate",
            "false",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
    )
    sockets = []
    try:
        fresh = httpx.Limits(max_keepalive_connections=0)  # a new connection, any worker
        async with httpx.AsyncClient(base_url=base, limits=fresh, timeout=5) as http:

            async def up() -> bool:
                with contextlib.suppress(httpx.HTTPError):
                    return (await http.get("/metrics")).status_code == 200
                return False

            for _ in range(300):
                if await up() and len(list(stats.glob("rubris-*.json"))) == 2:
                    break
                await asyncio.sleep(0.1)
            assert len(list(stats.glob("rubris-*.json"))) == 2, "two workers did not start"

            for _ in range(SESSIONS):
                ws = await ws_open(base)
                await ws_hello(ws, Subscribe(1, "ticks", 0, 0, b""))
                sockets.append(ws)

            seen: list[tuple[int, float]] = []
            # another worker's figures are at most a second old: wait for both to have written
            await asyncio.sleep(1.5)
            for _ in range(12):
                workers, connected = _connected((await http.get("/metrics")).text)
                seen.append((len(workers), connected))
                r = await http.get(
                    "/rubris/ops/stats", headers={"Authorization": f"Bearer {TOKEN}"}
                )
                body = orjson.loads(r.content)
                assert [w["self"] for w in body["workers"]] == [True, False]
                total = sum(w["sessions"]["websocket"]["connected"] for w in body["workers"])
                assert total == SESSIONS
            assert seen == [(2, SESSIONS)] * 12
    finally:
        for ws in sockets:
            with contextlib.suppress(Exception):
                await ws.close()
        await stop_process(proc)
    # a worker that stops takes its file with it
    assert list(stats.glob("rubris-*.json")) == []

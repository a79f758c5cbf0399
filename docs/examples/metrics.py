"""Watching rubris: Prometheus metrics at /metrics and the operations page's JSON.

Run it: ``python3 docs/examples/metrics.py`` (``pip install 'rubris-asgi[metrics]'``; it serves
on a free port of 127.0.0.1, subscribes a client, publishes, then reads what an operator sees:
a scrape of /metrics and {mount}/ops/stats, and stops).
"""

from __future__ import annotations

import asyncio
import os
import socket

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.routing import Mount, Route

from rubris_asgi import Rubris, Server, Session
from rubris_asgi.client import Client
from rubris_asgi.ops.metrics import Metrics

TOKEN = os.environ.get("RUBRIS_API_TOKEN", "example-token")  # from your secrets in real life

# ops=True: {mount}/ops and {mount}/ops/stats, behind the API token (Bearer, or Basic password)
rubris = Rubris(api_token=TOKEN, ops=True, batches=False)


@rubris.shared("ticks", ring=64)
async def ticks(session: Session) -> None:
    return None


app = Starlette(
    routes=[Route("/metrics", Metrics(rubris)), Mount("/rubris", rubris)],
    lifespan=rubris.lifespan,
)

SHOWN = (
    "rubris_sessions",
    "rubris_published_messages_total",
    "rubris_publish_to_frame_seconds_count",
)


async def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = Server(uvicorn.Config(app, ws_per_message_deflate=False, log_level="warning"), rubris)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 (uvicorn offers no "started" event)
        await asyncio.sleep(0.01)
    try:
        async with Client(base + "/rubris") as client, httpx.AsyncClient(base_url=base) as http:
            sub = await client.subscribe("ticks")
            for i in range(5):
                rubris.publish("ticks", {"i": i})
            for _ in range(5):
                await sub.get(timeout=5)

            scrape = (await http.get("/metrics")).text
            for family in text_string_to_metric_families(scrape):
                for s in family.samples:
                    if s.name in SHOWN and s.labels.get("state", "connected") == "connected":
                        labels = {k: v for k, v in s.labels.items() if k != "worker"}
                        print(f"{s.name} {labels} {s.value:g}")

            r = await http.get("/rubris/ops/stats")
            print("ops/stats without the token:", r.status_code)
            r = await http.get("/rubris/ops/stats", headers={"Authorization": f"Bearer {TOKEN}"})
            [me] = r.json()["workers"]  # one worker here; each worker's figures with more
            print("ops/stats: this worker", me["self"], me["sessions"]["websocket"])
    finally:
        server.should_exit = True
        await task


if __name__ == "__main__":
    asyncio.run(main())

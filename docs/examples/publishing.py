"""Publishing from other processes: the HTTP API, Publisher, SyncPublisher, and what 'fill' says.

Run it: ``python3 docs/examples/publishing.py`` (it serves on a free port of 127.0.0.1 with the
HTTP API on, publishes into it the three ways another program would, prints what a subscriber
receives, and stops).
"""

from __future__ import annotations

import asyncio
import os
import socket

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from rubris_asgi import Rubris, Server, Session
from rubris_asgi.client import Client, Publisher, SyncPublisher

TOKEN = os.environ.get("RUBRIS_API_TOKEN", "example-token")  # from your secrets in real life

rubris = Rubris(api_token=TOKEN)  # turns on POST /rubris/api/publish


@rubris.shared("trades.{symbol}", ring=256)
async def trades(session: Session, symbol: str) -> None:
    return None


app = Starlette(routes=[Mount("/rubris", rubris)], lifespan=rubris.lifespan)


def sync_job(url: str) -> None:
    """A batch job or a Django view: plain synchronous code."""
    with SyncPublisher(url, token=TOKEN) as pub:
        for i in range(3):
            pub.publish("trades.MSFT", {"px": 410 + i, "via": "SyncPublisher"})


async def publish_side(url: str) -> None:
    # 1. any HTTP client (this is what `curl` does)
    async with httpx.AsyncClient() as http:
        r = await http.post(
            f"{url}/api/publish",
            headers={"Authorization": f"Bearer {TOKEN}"},
            json=[{"topic": "trades.AAPL", "data": {"px": 189.1, "via": "HTTP"}}],
        )
        print("HTTP answer:", r.status_code, r.json(), "Rubris-Fill:", r.headers["rubris-fill"])
    # 2. Publisher: batched, paced by the fill, retrying 429s and connection errors
    async with Publisher(url, token=TOKEN) as pub:
        for i in range(3):
            await pub.publish("trades.AAPL", {"px": 189.2 + i, "via": "Publisher"})
    print("Publisher sent", pub.stats.accepted, "in", pub.stats.requests, "request(s)")
    # 3. SyncPublisher, from a thread
    await asyncio.to_thread(sync_job, url)


async def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/rubris"
    server = Server(uvicorn.Config(app, ws_per_message_deflate=False, log_level="warning"), rubris)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 (uvicorn offers no "started" event)
        await asyncio.sleep(0.01)
    try:
        async with Client(url) as client:
            aapl = await client.subscribe("trades.AAPL")
            msft = await client.subscribe("trades.MSFT")
            await publish_side(url)
            for sub, n in ((aapl, 4), (msft, 3)):
                for _ in range(n):
                    value, info = await sub.get(timeout=5)
                    print(f"{sub.name} #{info.seq}: {value}")
    finally:
        server.should_exit = True
        await task


if __name__ == "__main__":
    asyncio.run(main())

"""Batch tracking: one catalog fanned out into work items, and knowing when all are done.

Run it: ``python3 docs/examples/batches.py`` (it serves on a free port of 127.0.0.1 with a SQLite
batch store in a temporary directory; a producer opens a batch over the HTTP API, adds 20
items, enqueues one work item for each with its ``batch_item`` and seals the batch; two
workers process the items, one of which always fails and is dead-lettered; a third client
watches the batch and prints its progress and the completion; then it stops).
"""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from rubris_asgi import Rubris, Server, Session
from rubris_asgi.batches import SQLiteBatchStore
from rubris_asgi.client import Client, QueueItem

TOKEN = os.environ.get("RUBRIS_API_TOKEN", "example-token")
store = Path(tempfile.mkdtemp()) / "batches.sqlite3"
rubris = Rubris(api_token=TOKEN, batches=SQLiteBatchStore(store))


# one work item per catalog item; an item that fails twice goes to "catalog.failed"
@rubris.queue("catalog.items", delivery_limit=2, dead_letter="catalog.failed")
async def catalog_items(session: Session) -> None:
    return None


@rubris.queue("catalog.failed")
async def catalog_failed(session: Session) -> None:
    return None


app = Starlette(routes=[Mount("/rubris", rubris)], lifespan=rubris.lifespan)


async def produce(url: str) -> str:
    """ProcessCatalog: open a batch, add the catalog's items, enqueue them, seal."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=auth) as http:
        batch = (await http.post("/api/batches")).json()["batch"]
        group = (await http.post(f"/api/batches/{batch}/items", json={"count": 20})).json()
        print("opened", batch, "with", group)
        entries = [
            {
                "topic": "catalog.items",
                "data": {"sku": f"SKU-{i}"},
                "id": f"{batch}:{i}",  # the queue's idempotency key: a retried POST is harmless
                "batch_item": f"{batch}:{group['group']}:{i}",
            }
            for i in range(group["count"])
        ]
        r = await http.post("/api/enqueue", json=entries)
        print("enqueued:", r.json())
        sealed = (await http.post(f"/api/batches/{batch}/seal")).json()
        print("sealed:", sealed)
        return batch


def process(item: QueueItem) -> None:
    if item.value["sku"] == "SKU-13":  # has no price: given back, dead-lettered on attempt 2
        item.nack(requeue=True)
    # returning ACKs the item (unless it was settled above): its batch item is done


async def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", ws_per_message_deflate=False)
    server = Server(config, rubris)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 (uvicorn has no event for it)
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{port}/rubris"
    try:
        async with Client(url) as watcher, Client(url) as w1, Client(url) as w2:
            batch = await produce(url)
            await w1.consume("catalog.items", process)
            await w2.consume("catalog.items", process)
            final = await watcher.watch_batch(
                batch,
                on_update=lambda s: print(f"progress: {s['done']} done, {s['failed']} failed"),
                timeout=30,
            )
            print("final:", final)
        # the in-process API says the same: its state is "complete". Its "completed" is left
        # out: that flag is True in one answer only, the one of the ack (or fail, or seal) that
        # completed the batch (the watcher's final push above), and False in every later one
        status = (await rubris.batches.status(batch)).to_json()
        print("status:", {k: v for k, v in status.items() if k != "completed"})
    finally:
        server.should_exit = True
        await serving


if __name__ == "__main__":
    asyncio.run(main())

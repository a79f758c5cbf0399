"""Live tables and presence: a keyed topic changed by the server, a client holding it, and who
is watching a room.

Run it: ``python3 docs/examples/tables.py`` (it serves on a free port of 127.0.0.1, talks to
itself over a real WebSocket, prints what it sees, and stops).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import HTTPConnection
from starlette.routing import Mount

from rubris_asgi import Rubris, Server, Session
from rubris_asgi.client import Change, Client


def who(conn: HTTPConnection) -> str | None:
    return conn.headers.get("x-user")  # a stand-in for your login: one user per header


rubris = Rubris(authenticate=who)


@rubris.shared("book.{sym}", keyed=True)
async def book(session: Session, sym: str) -> dict[str, Any]:
    return {"101.25": {"size": 300, "orders": 4, "venue": "XNAS"}}  # the topic's first table


@rubris.shared("room.{rid}", snapshot=True, presence=True, presence_info=lambda s: {"desk": "FX"})
async def room(session: Session, rid: str) -> None:
    return None


app = Starlette(routes=[Mount("/rubris", rubris)], lifespan=rubris.lifespan)


async def client_side(url: str) -> None:
    async with Client(url, headers={"x-user": "carol"}) as client:

        def on_change(change: Change) -> None:
            print("change:", change.op, change.key or "-", change.value)

        table = await client.subscribe_table("book.AAPL", on_change)
        await table.wait_synced(timeout=5)
        print("table:", dict(table.table))
        rubris.patch("book.AAPL", "101.25", {"size": 400})  # a PATCH on the wire
        await asyncio.sleep(0.1)
        rubris.set("book.AAPL", "101.50", {"size": 100, "orders": 1, "venue": "XNAS"})
        rubris.delete("book.AAPL", "101.25")
        await asyncio.sleep(0.1)
        print(
            "table:",
            dict(table.table),
            "== server's:",
            dict(table.table) == rubris.entries("book.AAPL"),
        )

        here = await client.presence(
            "room.1",
            on_join=lambda member, value: print("join:", member, value),
            on_leave=lambda member, value: print("leave:", member),
        )
        await here.wait_synced(timeout=5)
        async with Client(url, headers={"x-user": "alice"}) as alice:
            sub = await alice.subscribe("room.1")
            await asyncio.sleep(0.2)
            print("members:", sorted(here.members), "count:", here.count)
            await alice.unsubscribe(sub)
            await asyncio.sleep(0.2)
        print("members:", sorted(here.members))


async def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, ws_per_message_deflate=False, log_level="warning")
    server = Server(config, rubris)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 (uvicorn offers no "started" event)
        await asyncio.sleep(0.01)
    try:
        await client_side(f"http://127.0.0.1:{port}/rubris")
    finally:
        server.should_exit = True
        await task


if __name__ == "__main__":
    asyncio.run(main())

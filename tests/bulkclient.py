"""Many raw WebSocket subscribers in a process of their own, so a test can measure the server's
memory without the clients' in it.

    python3 -m tests.bulkclient WS_URL TOPIC CLIENTS MESSAGES

Prints ``ready`` once every client is subscribed, then, when each has received MESSAGES pushes
of TOPIC, one JSON line: the SHA-256 of every payload, per client.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys

from websockets.asyncio.client import connect

from rubris_asgi.protocol import Hello, Push, Subscribe, Subscribed, decode_frame, encode_frame


async def main(url: str, topic: str, clients: int, messages: int) -> None:
    conns = []
    for _ in range(clients):
        ws = await connect(url, subprotocols=["rubris.v1"], compression=None, max_size=None)  # type: ignore[list-item]
        await ws.send(encode_frame([Hello(1, ""), Subscribe(1, topic, 0, 0, b"")]))
        conns.append(ws)
    got: list[list[str]] = [[] for _ in conns]

    async def subscribed(ws: object) -> None:
        while True:
            frame = await ws.recv()  # type: ignore[attr-defined]
            if any(isinstance(m, Subscribed) for m in decode_frame(frame)):
                return

    await asyncio.gather(*(subscribed(ws) for ws in conns))
    print("ready", flush=True)

    async def read(i: int) -> None:
        while len(got[i]) < messages:
            for m in decode_frame(await conns[i].recv()):  # type: ignore[arg-type]
                if isinstance(m, Push):
                    got[i].append(hashlib.sha256(m.payload).hexdigest())

    await asyncio.wait_for(asyncio.gather(*(read(i) for i in range(clients))), 60)
    print(json.dumps(got), flush=True)
    for ws in conns:
        await ws.close()


if __name__ == "__main__":
    url, topic, n, m = sys.argv[1:5]
    asyncio.run(main(url, topic, int(n), int(m)))

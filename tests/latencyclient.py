"""Many WebSocket subscribers in a process of their own that measure delivery latency.

    python3 -m tests.latencyclient WS_URL TOPIC CLIENTS

Each published value is ``{"t": time.monotonic() at publish, "p": phase}``, or
``{"end": phase}`` to close a phase, or ``{"quit": 1}``. CLOCK_MONOTONIC is one clock for every
process on the machine, so ``time.monotonic() - t`` on receipt is the publish-to-receive latency.
Prints ``ready`` once every client is subscribed, then for each phase, once every client has its
end marker, one JSON line: ``{"phase", "samples", "per_client_min", "p50", "p99", "max",
"gaps"}`` (seconds).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import defaultdict

import orjson
from websockets.asyncio.client import ClientConnection, connect

from rubris_asgi.protocol import Gap, Hello, Push, Subscribe, Subscribed, decode_frame, encode_frame


def quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def main(url: str, topic: str, clients: int) -> None:
    conns: list[ClientConnection] = []
    for _ in range(clients):
        ws = await connect(url, subprotocols=["rubris.v1"], compression=None)  # type: ignore[list-item]
        await ws.send(encode_frame([Hello(1, ""), Subscribe(1, topic, 0, 0, b"")]))
        conns.append(ws)

    async def subscribed(ws: ClientConnection) -> None:
        while True:
            if any(isinstance(m, Subscribed) for m in decode_frame(await ws.recv())):  # type: ignore[arg-type]
                return

    await asyncio.gather(*(subscribed(ws) for ws in conns))
    print("ready", flush=True)

    latencies: dict[str, list[float]] = defaultdict(list)

    counts: dict[str, list[int]] = defaultdict(lambda: [0] * clients)
    gaps: dict[str, int] = defaultdict(int)
    ended: dict[str, int] = defaultdict(int)
    phase = "?"

    def report(name: str) -> None:
        lat = sorted(latencies.pop(name, []))
        line = {
            "phase": name,
            "samples": len(lat),
            "per_client_min": min(counts[name]),
            "p50": quantile(lat, 0.50),
            "p99": quantile(lat, 0.99),
            "max": lat[-1] if lat else float("nan"),
            "gaps": gaps[name],
        }
        print(json.dumps(line), flush=True)

    async def read(i: int, ws: ClientConnection) -> None:
        nonlocal phase
        while True:
            frame = await ws.recv()
            now = time.monotonic()
            for m in decode_frame(frame):  # type: ignore[arg-type]
                if isinstance(m, Gap):
                    gaps[phase] += m.count
                if not isinstance(m, Push):
                    continue
                v = orjson.loads(m.payload)
                if "t" in v:
                    phase = v["p"]
                    latencies[phase].append(now - v["t"])
                    counts[phase][i] += 1
                elif "end" in v:
                    ended[v["end"]] += 1
                    if ended[v["end"]] == clients:
                        report(v["end"])
                elif "quit" in v:
                    return

    await asyncio.gather(*(read(i, ws) for i, ws in enumerate(conns)))
    for ws in conns:
        await ws.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))

"""Batch tracking benchmark: bytes per item, acks per second, and completion to push.

Not a test. Three parts:

Stores (this process, no HTTP): for ``SQLiteBatchStore`` (a fresh file in a temporary
directory) and ``RedisBatchStore`` (a redis-server this bench starts on a free port of
127.0.0.1, with no persistence), through ``Batches`` as ``Rubris.batches`` is: open one batch,
add 1,000,000 items in one add, then the bytes the store holds for it (SQLite: used pages of the
database file after a checkpoint; Redis: ``MEMORY USAGE`` of its keys) ÷ items; seal, then ack
every item in requests of 1,000 string ids (parsed, as the HTTP API hands them over), in order,
one request at a time, and time it. Median of ``--repeats`` (3) batches, each on a fresh store.
With two cores this process is pinned to core 1 and redis-server to core 0, so each store's
acks cost one core of Python. Targets: <= 0.2 bytes an item, >= 200,000 acks/s on each.

HTTP (real sockets, 127.0.0.1): uvicorn serving Rubris with the SQLite store, in this process
and event loop, and an httpx client posting ``{"items": [1,000 ids]}`` to
``/api/batches/ack`` one request after the other: acks/s with JSON, HTTP and auth included,
client and server sharing one core (so a pessimistic figure).

Completion to push: on that server a Python client (WebSocket) watches ``batch.{id}``; a batch
of 1,000 items is sealed, 999 are acked, then the last ack is posted and the time until the
client has the push saying ``completed`` is measured. Median and 90th percentile of
``--rounds`` (30) batches.

The last line is ``sqlite_acks_per_s=N redis_acks_per_s=N sqlite_bytes_per_item=B
redis_bytes_per_item=B``.

    python3 bench/batches.py            # about a minute
    python3 bench/batches.py --quick    # 200,000 items, one repeat
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rubris_asgi import Rubris  # noqa: E402
from rubris_asgi.batches import BatchStore, SQLiteBatchStore, item_ids  # noqa: E402
from rubris_asgi.batches.service import Batches  # noqa: E402
from rubris_asgi.client import Client  # noqa: E402
from rubris_asgi.cluster.redis.batch_store import RedisBatchStore  # noqa: E402
from tests.rediskit import RedisServer  # noqa: E402

TOKEN = "bench"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REQUEST = 1000


def pin(pid: int, core: int) -> None:
    if (os.cpu_count() or 1) >= 2 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(pid, {core})


async def one_batch(store: BatchStore, items: int) -> dict[str, float]:
    """Open, add ``items``, measure the footprint, seal, ack everything; the figures."""
    batches = Batches(store)
    await store.start()
    batch = await batches.open()
    await batches.add(batch, items)
    footprint = await store.footprint()
    await batches.seal(batch)
    ids = list(item_ids(batch, 0, items))
    t0 = time.perf_counter()
    for k in range(0, items, REQUEST):
        out = await batches.ack(ids[k : k + REQUEST])
    elapsed = time.perf_counter() - t0
    st = out[batch]
    assert st.completed and st.done == items, st
    await store.close()
    return {"acks_per_s": items / elapsed, "bytes_per_item": footprint / items}


async def stores(args: argparse.Namespace, tmp: Path, redis: RedisServer) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in ("sqlite", "redis"):
        runs = []
        for r in range(args.repeats):
            if name == "sqlite":
                store: BatchStore = SQLiteBatchStore(tmp / f"bench-{r}.sqlite3")
            else:
                redis.flush()
                store = RedisBatchStore(redis.url)
            runs.append(await one_batch(store, args.items))
        results[name] = {
            "acks_per_s": statistics.median(x["acks_per_s"] for x in runs),
            "bytes_per_item": statistics.median(x["bytes_per_item"] for x in runs),
            "runs": runs,
        }
        print(
            f"{name:6}  {args.items:,} items: "
            f"{results[name]['bytes_per_item']:.3f} bytes/item, "
            f"{results[name]['acks_per_s']:,.0f} acks/s (median of {args.repeats}: "
            + ", ".join(f"{x['acks_per_s']:,.0f}" for x in runs)
            + ")",
            flush=True,
        )
    return results


async def over_http(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    rubris = Rubris(api_token=TOKEN, batches=SQLiteBatchStore(tmp / "http.sqlite3"))
    app = Starlette(routes=[Mount("/rubris", rubris)], lifespan=rubris.lifespan)
    # IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only when the proto says TCP
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", ws="websockets-sansio", ws_per_message_deflate=False
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 (uvicorn has no event for it)
        await asyncio.sleep(0.01)
    base = f"http://127.0.0.1:{port}/rubris"
    try:
        async with httpx.AsyncClient(base_url=base, headers=AUTH) as http:
            # acks/s over HTTP
            n = args.http_items
            batch = (await http.post("/api/batches")).json()["batch"]
            await http.post(f"/api/batches/{batch}/items", json={"count": n})
            await http.post(f"/api/batches/{batch}/seal")
            ids = list(item_ids(batch, 0, n))
            t0 = time.perf_counter()
            for k in range(0, n, REQUEST):
                r = await http.post("/api/batches/ack", json={"items": ids[k : k + REQUEST]})
                assert r.status_code == 200, r.text
            http_rate = n / (time.perf_counter() - t0)
            assert r.json()["batches"][batch]["completed"]
            print(f"http    {n:,} items in requests of {REQUEST}: {http_rate:,.0f} acks/s")
            # the last ack to the completion push
            latencies = []
            async with Client(base, transport="websocket") as client:
                for _ in range(args.rounds):
                    batch = (await http.post("/api/batches")).json()["batch"]
                    await http.post(f"/api/batches/{batch}/items", json={"count": 1000})
                    await http.post(f"/api/batches/{batch}/seal")
                    done = asyncio.Event()
                    got: dict[str, float] = {}

                    def seen(
                        value: Any, info: Any, got: dict[str, float] = got, done: Any = done
                    ) -> None:
                        if value.get("completed"):
                            got["t"] = time.perf_counter()
                            done.set()

                    sub = await client.subscribe(f"batch.{batch}", seen)
                    ids = list(item_ids(batch, 0, 1000))
                    await http.post("/api/batches/ack", json={"items": ids[:-1]})
                    t0 = time.perf_counter()
                    await http.post("/api/batches/ack", json={"items": ids[-1:]})
                    await asyncio.wait_for(done.wait(), 10)
                    latencies.append((got["t"] - t0) * 1000)
                    await client.unsubscribe(sub)
            latencies.sort()
            p50 = statistics.median(latencies)
            p90 = latencies[int(0.9 * (len(latencies) - 1))]
            print(
                f"push    last ack posted -> completion at the watcher: median {p50:.2f} ms, "
                f"p90 {p90:.2f} ms ({args.rounds} batches)"
            )
    finally:
        server.should_exit = True
        await task
    return {"http_acks_per_s": http_rate, "push_ms_median": p50, "push_ms_p90": p90}


async def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="200,000 items, one repeat")
    ap.add_argument("--items", type=int, default=None, help="items in the batch (1,000,000)")
    ap.add_argument("--repeats", type=int, default=None, help="batches per store (3)")
    ap.add_argument("--http-items", type=int, default=200_000, help="items acked over HTTP")
    ap.add_argument("--rounds", type=int, default=30, help="batches timed to the push")
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()
    if args.items is None:
        args.items = 200_000 if args.quick else 1_000_000
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    print(f"batches bench: {os.cpu_count()} cores, {args.items:,} items a batch", flush=True)
    pin(0, 1)
    with tempfile.TemporaryDirectory() as d, RedisServer() as redis:
        assert redis.pid is not None
        pin(redis.pid, 0)
        figures = await stores(args, Path(d), redis)
        figures.update(await over_http(args, Path(d)))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    print(
        f"sqlite_acks_per_s={figures['sqlite']['acks_per_s']:.0f} "
        f"redis_acks_per_s={figures['redis']['acks_per_s']:.0f} "
        f"sqlite_bytes_per_item={figures['sqlite']['bytes_per_item']:.3f} "
        f"redis_bytes_per_item={figures['redis']['bytes_per_item']:.3f}"
    )


if __name__ == "__main__":
    asyncio.run(main())

"""A Redis failover under load, measured: for bench/faults.py (its failover rows) and the tests.

:func:`measure` starts a master, two replicas and three Sentinels (tests/sentinelkit.py), one
node (a ``Rubris`` on uvicorn in this loop) given the Sentinels' URL, and a client consuming a
work queue and following a ring topic. Work items are enqueued at a steady rate (each with its
number), ring messages published; the master is killed (SIGKILL) in the middle, and the load
goes on until as many items again have been accepted. Then it counts: items accepted and never
delivered (lost), deliveries beyond the first (each must carry a higher ``attempt``), and the
seconds from the kill until an item enqueued after it reached the consumer (service back).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from rubris_asgi import BrokerUnavailable, Session
from rubris_asgi.client import Client
from rubris_asgi.cluster import RedisBroker

from .apps import make_rubris, starlette_app
from .sentinelkit import SentinelSet
from .server import run_server


@dataclass
class Failover:
    wait_replicas: int
    accepted: int = 0
    refused: int = 0
    lost: int = 0
    doubled: int = 0
    unmarked: int = 0
    seconds: float = 0.0
    """From the kill until an item enqueued after it was delivered."""
    publishes: int = 0
    latency_ms: float = 0.0
    """Median enqueue-to-delivery time before the kill (what ``WAIT`` costs shows here)."""
    latency_p99_ms: float = 0.0
    ring_restarts: int = 0
    """New epochs the client was told of (Redis lost numbered messages)."""
    notes: list[str] = field(default_factory=list)


async def measure(wait_replicas: int, items: int = 1000, rate: float = 200.0) -> Failover:
    f = Failover(wait_replicas)
    with SentinelSet(replicas=2) as sentinels:
        broker = RedisBroker(sentinels.url, connect_timeout=1.0, wait_replicas=wait_replicas)
        rubris = make_rubris(broker=broker, batches=False)

        @rubris.queue("jobs.{kind}", codel_target=None)
        async def jobs(session: Session, kind: str) -> None:
            return None

        async with run_server(starlette_app(rubris)) as base:
            async with Client(base + "/rubris") as c:
                seen: dict[int, list[int]] = {}
                delivered_at: dict[int, float] = {}
                epochs: set[int] = set()

                async def handle(item: Any) -> None:
                    n = int(item.value)
                    seen.setdefault(n, []).append(item.attempt)
                    delivered_at.setdefault(n, time.monotonic())

                await c.consume("jobs.ha", handle, prefetch=16)
                sub = await c.subscribe("ring.ha", lambda v, i: epochs.add(sub.epoch))
                accepted: dict[int, float] = {}
                crashed = 0.0
                n = 0
                tick = 1.0 / rate
                began = time.monotonic()
                while len(accepted) < items and time.monotonic() - began < 120:
                    if not crashed and len(accepted) >= items // 2:
                        await asyncio.to_thread(sentinels.crash_master)
                        crashed = time.monotonic()
                    try:
                        rubris.enqueue("jobs.ha", n)
                        accepted[n] = time.monotonic()
                    except BrokerUnavailable:
                        f.refused += 1
                    if n % 10 == 0:
                        try:
                            rubris.publish("ring.ha", n)
                            f.publishes += 1
                        except BrokerUnavailable:
                            pass
                    n += 1
                    await asyncio.sleep(tick)
                for _ in range(600):  # 30 s at most for the last deliveries
                    if set(accepted) <= set(seen):
                        break
                    await asyncio.sleep(0.05)
                f.accepted = len(accepted)
                f.lost = len(set(accepted) - set(seen))
                for attempts in seen.values():
                    f.doubled += len(attempts) - 1
                    f.unmarked += len(attempts) - len(set(attempts))
                after = [
                    delivered_at[i]
                    for i, t in accepted.items()
                    if t > crashed and i in delivered_at
                ]
                f.seconds = (min(after) - crashed) if after else -1.0
                f.ring_restarts = max(0, len(epochs) - 1)
                before = sorted(
                    delivered_at[i] - t
                    for i, t in accepted.items()
                    if t < crashed and i in delivered_at
                )
                if before:
                    f.latency_ms = 1000 * before[len(before) // 2]
                    f.latency_p99_ms = 1000 * before[int(len(before) * 0.99)]
                f.notes.append(
                    f"wait_replicas={wait_replicas}: {f.accepted} items accepted, {f.refused} "
                    f"refused while no master answered, {f.lost} lost, {f.doubled} delivered "
                    f"again ({f.unmarked} unmarked); service back {f.seconds:.1f} s after the "
                    f"kill; {f.publishes} ring publishes, {f.ring_restarts} restarts told; "
                    f"enqueue to delivery before it: median {f.latency_ms:.1f} ms, "
                    f"p99 {f.latency_p99_ms:.1f} ms"
                )
    return f

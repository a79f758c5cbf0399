"""The server half of bench/queues.py: uvicorn + Starlette + Rubris with one work queue, a producer.

Started by bench/queues.py as a subprocess, pinned to one core; not meant to be run by hand
(though ``python3 bench/_queues_server.py`` works and prints ``PORT n``).

The queue channel is ``jobs`` (max_length 100,000, ``client_publish=True`` so that a client
producer may PUBLISH items, the other settings the package defaults); ``--no-codel`` registers
it with ``codel_target=None`` (server-side CoDel off). Items are
``{"i": <id>, "t": <CLOCK_MONOTONIC ns at enqueue>}``: ``i`` numbers them from 0 in enqueue
order, so the load can count duplicates and losses by id, and ``t`` lets it measure latency
against its own ``time.monotonic_ns()`` (one clock for every process of the machine). A client
producer (bench/_queues_producer.py) sends items of the same shape, numbered and stamped by it.

Control endpoints (127.0.0.1 only, used by the load process):

    POST /control/start?mode=backlog&depth=B     keep B items waiting (checked every 1 ms;
                                                 ``waiting`` counts the queue and the lanes)
    POST /control/start?mode=paced&rate=R        enqueue R items/s on a fixed schedule
    POST /control/start?mode=client              enqueue nothing (a client producer does),
                                                 only sample the consumers
    POST /control/stop                           stop the producer
    GET  /control/stats                          CPU seconds, queue_stats("jobs"), the producer,
                                                 every consumer's prefetch state, and the
                                                 sampler's rows since the last start, and
                                                 the REJECTEDs the server sent (``rejected``:
                                                 its telemetry's count, by protocol code)

RPC ``waiting`` (over the WebSocket, for the client producer): the queue's ``waiting`` (the
queue and the lanes), what ``mode=backlog`` tops up. A client's CALL is handled after the
PUBLISHes it sent before it, so the answer counts every item that client sent until then.

The sampler records every consumer's state every 100 ms while the producer runs: session id,
prefetch in force, the estimator's value, round trip and processing time, outstanding items,
whether server-side CoDel holds it capped. That is how the bench sees what the estimator did.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import sys
import time
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _fanout_server import (  # noqa: E402
    cpu_seconds,
    orphan_watchdog,
    raise_nofile,
    serve_on_free_port,
)

from rubris_asgi import Config, Rubris, Session, Timing  # noqa: E402
from rubris_asgi.engine.queues import QueueSub  # noqa: E402
from rubris_asgi.errors import QueueFull  # noqa: E402

QUEUE = "jobs"
SAMPLE_S = 0.1


class Producer:
    """Enqueues ``{"i", "t"}`` items into ``jobs``: a standing backlog, or a paced rate."""

    def __init__(self, rubris: Rubris) -> None:
        self.rubris = rubris
        self.task: asyncio.Task[None] | None = None
        self.next_id = 0
        self.full = 0  # QueueFull refusals (the id is not used: ids stay dense)
        self.mode = ""
        self.max_late_ms = 0.0

    def _put(self) -> bool:
        try:
            self.rubris.enqueue(QUEUE, {"i": self.next_id, "t": time.monotonic_ns()})
        except QueueFull:
            self.full += 1
            return False
        self.next_id += 1
        return True

    def start(self, mode: str, depth: int, rate: float) -> None:
        self.stop()
        self.mode = mode
        self.max_late_ms = 0.0
        if mode == "client":
            coro = asyncio.Event().wait()  # no producer here; the sampler runs meanwhile
        elif mode == "backlog":
            coro = self._backlog(depth)
        else:
            coro = self._paced(rate)
        self.task = asyncio.get_running_loop().create_task(coro)

    def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self.task = None

    async def _backlog(self, depth: int) -> None:
        if QUEUE not in self.rubris.engine.queues:
            self._put()  # creates the queue topic
        q = self.rubris.engine.queues[QUEUE]
        while True:
            # the queue's and the lanes' (and with Redis, what waits there or on its way)
            waiting = q.snapshot().waiting
            for _ in range(depth - waiting):
                if not self._put():
                    break
            await asyncio.sleep(0.001)

    async def _paced(self, rate: float) -> None:
        interval_ns = int(1e9 / rate)
        due = time.monotonic_ns()
        while True:
            now = time.monotonic_ns()
            while due <= now:
                late = (now - due) / 1e6
                if late > self.max_late_ms:
                    self.max_late_ms = late
                self._put()
                due += interval_ns
            await asyncio.sleep(max(0.0, (due - time.monotonic_ns()) / 1e9))

    def info(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "running": self.task is not None and not self.task.done(),
            "next_id": self.next_id,
            "full": self.full,
            "max_late_ms": self.max_late_ms,
        }


def consumer_state(c: QueueSub, now: float) -> dict[str, Any]:
    est = c.estimator
    sess: Session = c.session  # type: ignore[assignment]
    rtt = est.round_trip
    return {
        "session": sess.id,
        "prefetch": c.prefetch,
        "fixed": c.fixed,
        "estimate": est.value,
        "allowance": est.allowance,
        "probing": bool(est.probe_from),
        "rtt_ms": None if rtt is None else round(rtt * 1000, 2),
        "sojourn_ms": None if est.sojourn == math.inf else round(est.sojourn * 1000, 2),
        "processing_ms": round(est.processing * 1000, 3),
        "outstanding": len(c.outstanding),
        "lane": len(c.lane),
        "capped": c.capped_until > now,
        "codel_dropping": bool(c.codel is not None and c.codel.dropping),
    }


def build(codel: bool) -> tuple[Starlette, Rubris]:
    rubris = Rubris(Config(timing=Timing(heartbeat=60.0)), compress_at=None)

    @rubris.queue(
        QUEUE, max_length=100_000, codel_target=0.020 if codel else None, client_publish=True
    )
    def jobs(session: Session) -> None:
        return None

    @rubris.rpc("waiting")
    def waiting(session: Session, args: Any) -> int:
        q = rubris.engine.queues.get(QUEUE)
        return q.snapshot().waiting if q is not None else 0

    producer = Producer(rubris)
    samples: list[list[Any]] = []

    def consumers() -> list[QueueSub]:
        q = rubris.engine.queues.get(QUEUE)
        return list(q.consumers) if q is not None else []

    async def sampler() -> None:
        while True:
            await asyncio.sleep(SAMPLE_S)
            if producer.task is not None:
                now = time.monotonic()
                samples.append([time.monotonic_ns(), [consumer_state(c, now) for c in consumers()]])

    async def start(request: Request) -> Response:
        q = request.query_params
        samples.clear()
        producer.start(
            q.get("mode", "backlog"), int(q.get("depth", "20")), float(q.get("rate", "0"))
        )
        return Response(orjson.dumps(producer.info()), media_type="application/json")

    async def stop(request: Request) -> Response:
        producer.stop()
        return Response(orjson.dumps(producer.info()), media_type="application/json")

    async def stats(request: Request) -> Response:
        user, system = cpu_seconds()
        st = rubris.stats()
        q = rubris.engine.queues.get(QUEUE)
        now = time.monotonic()
        body = {
            "cpu_user": user,
            "cpu_sys": system,
            "connected": st.connected,
            "cycle": dataclasses.asdict(st.cycle),
            "queue": dataclasses.asdict(q.snapshot()) if q is not None else None,
            "producer": producer.info(),
            "consumers": [consumer_state(c, now) for c in consumers()],
            "samples": samples if request.query_params.get("samples") else [],
            "rejected": {
                str(code): n
                for (kind, code), n in rubris.engine.telemetry.errors.items()
                if kind == "rejected"
            },
            "now_ns": time.monotonic_ns(),
        }
        return Response(orjson.dumps(body), media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
        async with rubris:
            tasks = [asyncio.create_task(orphan_watchdog()), asyncio.create_task(sampler())]
            try:
                yield
            finally:
                producer.stop()
                for t in tasks:
                    t.cancel()

    app = Starlette(
        routes=[
            Route("/control/start", start, methods=["POST"]),
            Route("/control/stop", stop, methods=["POST"]),
            Route("/control/stats", stats, methods=["GET"]),
            Mount("/rubris", rubris),
        ],
        lifespan=lifespan,
    )
    return app, rubris


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-codel", action="store_true", help="server-side CoDel off")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this core")
    args = ap.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    raise_nofile()
    app, _ = build(codel=not args.no_codel)
    serve_on_free_port(app)


if __name__ == "__main__":
    main()

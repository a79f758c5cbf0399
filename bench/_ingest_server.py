"""The server half of bench/ingest.py: uvicorn + Starlette + Rubris with the HTTP API on.

Started by bench/ingest.py as a subprocess, pinned to one core; not meant to be run by hand
(though ``python3 bench/_ingest_server.py --topics 1000`` works and prints ``PORT n``).

Channels: ``bench.{n}``, ring channels. Outside publishers POST to ``/rubris/api/publish`` with
``Authorization: Bearer <--token>``; the intake moves one message per ring topic per cycle.

Control endpoints (127.0.0.1 only, used by the load process; they are the bench's, not the
package's):

    GET  /control/stats[?heads=1][&gc=1]   CPU seconds, RSS, rubris.stats() (intake, cycle),
                                           GC, and with heads=1 every topic's head seq
    GET  /control/samples?since=NS         the sampler's rows since NS: [now_ns, fill,
                                           accepted, published, refused, pending], one every
                                           ``--sample-ms`` (the intake over time, independent
                                           of when the load asks)
    POST /control/intake?messages=N        set the intake's message bound (a bench knob: the
                                           engine reads ``Intake.max_messages`` on every offer)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import sys
import time
from collections import deque

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _fanout_load import GcTimer  # noqa: E402
from _fanout_server import (  # noqa: E402
    cpu_seconds,
    orphan_watchdog,
    raise_nofile,
    rss_bytes,
    serve_on_free_port,
)

from rubris_asgi import Config, Limits, Rubris, Session, Timing  # noqa: E402

GC = GcTimer()


def build(
    ring: int, intake_messages: int, token: str, sample_ms: float
) -> tuple[Starlette, Rubris]:
    config = Config(timing=Timing(heartbeat=60.0), limits=Limits(intake_messages=intake_messages))
    rubris = Rubris(config, compress_at=None, api_token=token)

    @rubris.shared("bench.{n}", ring=ring)
    async def bench_topic(session: Session, n: str) -> None:
        return None

    intake = rubris.engine.intake
    samples: deque[list[int]] = deque(maxlen=20_000)

    async def sampler() -> None:
        interval = sample_ms / 1000
        while True:
            st = intake.stats
            samples.append(
                [
                    time.monotonic_ns(),
                    intake.fill,
                    st.accepted,
                    st.published,
                    st.refused,
                    intake.count,
                ]
            )
            await asyncio.sleep(interval)

    async def stats(request: Request) -> Response:
        q = request.query_params
        if q.get("gc"):
            GC.collect()
        user, system = cpu_seconds()
        st = rubris.stats()
        body = {
            "cpu_user": user,
            "cpu_sys": system,
            "rss": rss_bytes(),
            "connected": st.connected,
            "topics": st.topics,
            "cycle": dataclasses.asdict(st.cycle),
            "intake": dataclasses.asdict(st.intake),
            "intake_max": intake.max_messages,
            "gc": GC.info(),
            "now_ns": time.monotonic_ns(),
        }
        if q.get("heads"):
            body["heads"] = {name: t.seq for name, t in rubris.engine.topics.items()}
        return Response(orjson.dumps(body), media_type="application/json")

    async def get_samples(request: Request) -> Response:
        since = int(request.query_params.get("since", "0"))
        rows = [r for r in samples if r[0] >= since]
        return Response(orjson.dumps(rows), media_type="application/json")

    async def set_intake(request: Request) -> Response:
        intake.max_messages = int(request.query_params["messages"])
        return Response(orjson.dumps({"intake_max": intake.max_messages}))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
        async with rubris:
            tasks = [asyncio.create_task(orphan_watchdog()), asyncio.create_task(sampler())]
            try:
                yield
            finally:
                for t in tasks:
                    t.cancel()

    app = Starlette(
        routes=[
            Route("/control/stats", stats, methods=["GET"]),
            Route("/control/samples", get_samples, methods=["GET"]),
            Route("/control/intake", set_intake, methods=["POST"]),
            Mount("/rubris", rubris),
        ],
        lifespan=lifespan,
    )
    return app, rubris


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ring", type=int, default=1024)
    ap.add_argument("--intake-messages", type=int, default=Limits().intake_messages)
    ap.add_argument("--token", default="bench-token")
    ap.add_argument("--sample-ms", type=float, default=50.0)
    ap.add_argument("--cpu", type=int, default=None, help="pin to this core")
    args = ap.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    raise_nofile()
    app, _ = build(args.ring, args.intake_messages, args.token, args.sample_ms)
    serve_on_free_port(app)


if __name__ == "__main__":
    main()

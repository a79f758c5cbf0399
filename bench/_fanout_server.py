"""The server half of bench/fanout.py: a Starlette app with Rubris at /rubris, and a publisher.

Started by bench/fanout.py as a subprocess, pinned to one core (``--cpu``); not meant to be run
by hand (though ``python3 bench/_fanout_server.py --topics 10`` works and prints ``PORT n``).
``--server uvicorn|hypercorn|granian`` (default uvicorn) picks the ASGI server; how each is set
up is in bench/_servers.py. Under granian the app runs in granian's worker process, a child of
this one: the figures below (CPU, RSS, GC) are that worker's, its Rust threads included.

Channels: ``bench.{n}``, ring channels (no conflation: every publish is delivered to every
subscriber unless it laps the ring, which the load side sees as a GAP); with ``--ring 0``
snapshot channels (a subscriber gets the latest value: what it missed is conflated).

Control endpoints (127.0.0.1 only, used by the load process between phases):

    POST /control/start?mode=open&rate=R&seconds=S   publish R rounds/s for S seconds
    POST /control/start?mode=closed&window=W&seconds=S
                                                     publish as fast as the server delivers:
                                                     a round goes out while fewer than W rounds'
                                                     deliveries are still waiting to be framed
    POST /control/stop                               stop the publisher
    GET  /control/stats[?gc=1][&gc_mode=M][&mark=1]  CPU seconds, RSS, rubris.stats(), publisher,
                                                     GC counts and pauses; gc=1 collects first;
                                                     gc_mode=freeze|off (an experiment) then
                                                     calls gc.freeze() or gc.disable(); mark=1
                                                     restarts the longest-pause figure

A *round* is one message published to each of the T topics, one after the other, in one step
of the event loop; every client subscribes to all T topics, so a round is T x clients
deliveries (or K of them, bench/fanout.py ``--per-client K``: then a round is K x clients
deliveries; the publisher counts the subscriptions, whichever they are, when a run starts). The
process raises its open-file limit to the hard limit (10,000 clients and more).

Open-loop rounds are paced by a schedule and stamped with their *scheduled* time,
so a server that falls behind (and so delays its own publisher) shows up as latency instead of
silently publishing less (no coordinated omission).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import gc
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _fanout_load import GcTimer  # noqa: E402
from _servers import SERVERS, orphan_watchdog, serve, serve_uvicorn  # noqa: E402

from rubris_asgi import Config, Limits, Rubris, Session, Timing  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def cpu_seconds() -> tuple[float, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime


GC = GcTimer()


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Publisher:
    """Publishes rounds to ``bench.0`` .. ``bench.{T-1}``; one run at a time."""

    def __init__(self, rubris: Rubris, topics: int, pad: int) -> None:
        self.rubris = rubris
        self.names = [f"bench.{i}" for i in range(topics)]
        self.pad = "x" * pad
        self.task: asyncio.Task[None] | None = None
        self.rounds = 0  # all rounds ever published (the payload's "i")
        self.run_rounds = 0
        self.run_mode = ""
        self.max_late_ms = 0.0
        self.started_ns = 0
        self.ended_ns = 0
        self.subscribers = 0  # deliveries per round, fixed at the start of a run

    def publish_round(self, stamp_ns: int) -> None:
        publish = self.rubris.publish
        i = self.rounds
        payload = {"t": stamp_ns, "i": i, "pad": self.pad}
        for name in self.names:
            publish(name, payload)
        self.rounds = i + 1
        self.run_rounds += 1

    def start(self, mode: str, rate: float, window: float, seconds: float) -> None:
        self.stop()
        engine = self.rubris.engine
        self.subscribers = sum(len(t.subs) for t in engine.topics.values())
        self.run_rounds = 0
        self.run_mode = mode
        self.max_late_ms = 0.0
        self.started_ns = time.monotonic_ns()
        self.ended_ns = 0
        coro = self._open(rate, seconds) if mode == "open" else self._closed(window, seconds)
        self.task = asyncio.get_running_loop().create_task(coro)

    def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            self.ended_ns = time.monotonic_ns()
        self.task = None

    async def _open(self, rate: float, seconds: float) -> None:
        interval_ns = int(1e9 / rate)
        start = time.monotonic_ns()
        stop_at = start + int(seconds * 1e9)
        due = start
        now = start
        while due < stop_at:
            # publish every round whose time has come, stamped with its scheduled time
            while due <= now and due < stop_at:
                late = (now - due) / 1e6
                if late > self.max_late_ms:
                    self.max_late_ms = late
                self.publish_round(due)
                due += interval_ns
            now = time.monotonic_ns()
            wait = (due - now) / 1e9
            if wait > 0:
                await asyncio.sleep(wait)
                now = time.monotonic_ns()
        self.ended_ns = time.monotonic_ns()

    async def _closed(self, window: float, seconds: float) -> None:
        stats = self.rubris.engine.scheduler.stats
        per_round = max(1, self.subscribers)
        framed0 = stats.messages
        stop_at = time.monotonic_ns() + int(seconds * 1e9)
        limit = window * per_round
        while True:
            now = time.monotonic_ns()
            if now >= stop_at:
                break
            # deliveries published but not yet put into a frame by the scheduler
            while self.run_rounds * per_round - (stats.messages - framed0) < limit:
                self.publish_round(time.monotonic_ns())
            await asyncio.sleep(0.0005)
        self.ended_ns = time.monotonic_ns()

    def info(self) -> dict[str, object]:
        return {
            "mode": self.run_mode,
            "running": self.task is not None and not self.task.done(),
            "rounds": self.rounds,
            "run_rounds": self.run_rounds,
            "deliveries_per_round": self.subscribers,
            "max_late_ms": self.max_late_ms,
            "started_ns": self.started_ns,
            "ended_ns": self.ended_ns,
        }


class Publishing(Protocol):
    """What the control endpoints drive: this module's Publisher, or the plain loop's."""

    def start(self, mode: str, rate: float, window: float, seconds: float) -> None: ...

    def stop(self) -> None: ...

    def info(self) -> dict[str, object]: ...


def control_routes(publisher: Publishing, figures: Callable[[], dict[str, Any]]) -> list[Route]:
    """``/control/start``, ``/control/stop`` and ``/control/stats``; ``figures()`` adds the
    app's own counters (sessions, connected, topics, cycle, ...) to the stats."""

    async def start(request: Request) -> Response:
        q = request.query_params
        publisher.start(
            q.get("mode", "open"),
            float(q.get("rate", "10")),
            float(q.get("window", "4")),
            float(q.get("seconds", "5")),
        )
        return Response(orjson.dumps(publisher.info()), media_type="application/json")

    async def stop(request: Request) -> Response:
        publisher.stop()
        return Response(orjson.dumps(publisher.info()), media_type="application/json")

    async def stats(request: Request) -> Response:
        q = request.query_params
        if q.get("gc"):
            GC.collect()
        if q.get("gc_mode") == "freeze":
            gc.freeze()  # an experiment (fanout.py --server-gc freeze), not the default
        elif q.get("gc_mode") == "off":
            gc.disable()  # an experiment (fanout.py --server-gc off), not the default
        user, system = cpu_seconds()
        body = {
            "cpu_user": user,
            "cpu_sys": system,
            "rss": rss_bytes(),
            **figures(),
            "publisher": publisher.info(),
            "gc": GC.info(mark=bool(q.get("mark"))),
            "now_ns": time.monotonic_ns(),
        }
        return Response(orjson.dumps(body), media_type="application/json")

    return [
        Route("/control/start", start, methods=["POST"]),
        Route("/control/stop", stop, methods=["POST"]),
        Route("/control/stats", stats, methods=["GET"]),
    ]


def build(
    topics: int,
    ring: int,
    pad: int,
    publisher_cls: type[Publisher] = Publisher,
    batches: bool = True,
) -> tuple[Starlette, Rubris, Publisher]:
    """The app, its Rubris and its publisher; ``publisher_cls`` lets a bench publish its own way
    (bench/_scaleout_server.py); ``batches=False`` for a Redis Cluster, which keeps none yet."""
    # heartbeat: the load's clients PING at half of it; long enough that a 5,000-client case
    # sends few PINGs while it measures
    timing = Timing(heartbeat=60.0)
    # every client of the load comes from 127.0.0.1: the cap on anonymous sessions per address
    # (1,000, against one client taking what all share) would refuse the rest
    limits = Limits(max_sessions_per_address=1_000_000)
    rubris = Rubris(Config(timing=timing, limits=limits), compress_at=None, batches=batches)

    kind: dict[str, Any] = {"snapshot": True} if ring == 0 else {"ring": ring}

    @rubris.shared("bench.{n}", **kind)
    async def bench_topic(session: Session, n: str) -> None:
        return None

    publisher = publisher_cls(rubris, topics, pad)

    def figures() -> dict[str, Any]:
        st = rubris.stats()
        sessions = list(rubris.engine.sessions.values())
        return {
            "sessions": st.sessions,
            "connected": st.connected,
            "topics": st.topics,
            "cycle": dataclasses.asdict(st.cycle),
            # the slow-client penalty (engine/flow.py): held back now, worst failed-send count
            "held": sum(1 for x in sessions if x.held),
            "failed_sends_max": max((x.failed_sends for x in sessions), default=0),
            "pool": dataclasses.asdict(st.pool),
        }

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
        async with rubris:
            watchdog = asyncio.create_task(orphan_watchdog())
            try:
                yield
            finally:
                publisher.stop()
                watchdog.cancel()

    app = Starlette(
        routes=[*control_routes(publisher, figures), Mount("/rubris", rubris)],
        lifespan=lifespan,
    )
    return app, rubris, publisher


def make_app(topics: int, ring: int, pad: int) -> Starlette:
    """The app alone: what the server process (granian: its worker) builds and serves."""
    return build(topics, ring, pad)[0]


def server_args(description: str) -> argparse.ArgumentParser:
    """The options every fan-out server script takes (this one, bench/_fanout_plain.py)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--topics", type=int, default=10)
    ap.add_argument("--ring", type=int, default=1024, help="ring size; 0: snapshot topics")
    ap.add_argument("--pad", type=int, default=40)
    ap.add_argument("--cpu", type=int, default=None, help="pin to this core")
    ap.add_argument("--server", choices=SERVERS, default="uvicorn")
    return ap


def main() -> None:
    args = server_args(__doc__ or "").parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})  # inherited by granian's worker and its threads
    raise_nofile()
    serve(functools.partial(make_app, args.topics, args.ring, args.pad), args.server)


def serve_on_free_port(app: Any) -> None:
    """Run ``app`` under uvicorn (uvloop, httptools, websockets-sansio, no permessage-deflate)
    on a free port of 127.0.0.1, announced as ``PORT n`` on stdout; shared by the benches."""
    serve_uvicorn(app)


if __name__ == "__main__":
    main()

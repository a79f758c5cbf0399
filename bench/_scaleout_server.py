"""The server half of bench/scaleout.py: bench/_fanout_server.py's app with a publisher for nodes.

Started by bench/scaleout.py as a subprocess (one per node), pinned with ``--cpu``; not meant
to be run by hand (``python3 bench/_scaleout_server.py --topics 10`` works and prints ``PORT n``).
Always uvicorn (bench/_servers.py): one node is one process, so its CPU is getrusage's.

``--redis URL`` sets ``RUBRIS_REDIS_URL`` before the app builds its ``Rubris()``, exactly as a
user starting workers does: the node then shares its topics through that Redis (RedisBroker);
without it the node is alone, the app being bench/_fanout_server.py's byte for byte.

The publisher (:class:`NodePublisher`) adds two ways of publishing to fanout's ``open`` and
``closed``, through the same ``/control/start``:

    mode=spread&rate=R   open loop at R rounds/s, one message at a time: topic after topic,
                         each stamped with its own scheduled time (R x T messages/s). Real
                         topics do not publish in lockstep, and a round of 20,000 deliveries
                         in one burst takes a node ~40 ms to write whatever the rate, so a
                         burst's p99 says how big a round is rather than how loaded the node is
    mode=credit          closed loop driven by the load: nothing is published until
                         ``POST /control/rounds?n=K`` publishes K rounds at once (stamped now).
                         The load grants rounds while fewer than W rounds' deliveries are on
                         their way to *all* nodes' clients, so the slowest node and the trip
                         through Redis hold the publisher back, and the broker's outbox
                         (10,000 publishes) holds at most W x T of them

A publish that Redis cannot take (``BrokerUnavailable``: unreachable, or the outbox full) is
counted (``refused``) and skipped, never raised into the publisher. ``/control/stats`` reports,
in ``publisher``, the publishes accepted and refused in the run and the node's broker counters.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import sys
import time
from collections.abc import Coroutine
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _fanout_server import Publisher, build, raise_nofile, server_args  # noqa: E402
from _servers import serve  # noqa: E402

from rubris_asgi import BrokerUnavailable  # noqa: E402
from rubris_asgi.cluster import ENV  # noqa: E402


class NodePublisher(Publisher):
    """fanout's publisher, plus ``spread`` and ``credit`` runs and refused publishes counted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kind = ""
        self.turn = 0  # spread: the topic whose message is next
        self.accepted = 0
        self.refused = 0

    def start(self, mode: str, rate: float, window: float, seconds: float) -> None:
        self.kind = mode
        self.turn = 0
        self.accepted = self.refused = 0
        if mode == "spread":  # fanout's open loop, one message a tick, T ticks a round
            super().start("open", rate * len(self.names), window, seconds)
        elif mode == "credit":  # fanout's closed loop, whose task _closed replaces
            super().start("closed", 0.0, window, seconds)
        else:
            super().start(mode, rate, window, seconds)
        self.run_mode = mode

    def _closed(self, window: float, seconds: float) -> Coroutine[Any, Any, None]:
        if self.kind == "credit":
            return self._granted(seconds)
        return super()._closed(window, seconds)

    async def _granted(self, seconds: float) -> None:
        # the rounds come from /control/rounds; this task only marks the run as going on
        await asyncio.sleep(seconds)
        self.ended_ns = time.monotonic_ns()

    def publish_round(self, stamp_ns: int) -> None:
        payload = {"t": stamp_ns, "i": self.rounds, "pad": self.pad}
        if self.kind == "spread":
            self._publish(self.names[self.turn], payload)
            self.turn += 1
            if self.turn < len(self.names):
                return
            self.turn = 0
        else:
            for name in self.names:
                self._publish(name, payload)
        self.rounds += 1
        self.run_rounds += 1

    def _publish(self, name: str, payload: dict[str, Any]) -> None:
        try:
            self.rubris.publish(name, payload)
        except BrokerUnavailable:
            self.refused += 1
        else:
            self.accepted += 1

    def info(self) -> dict[str, object]:
        return {
            **super().info(),
            "accepted": self.accepted,
            "refused": self.refused,
            "broker": dataclasses.asdict(self.rubris.stats().broker),
        }


def make_app(topics: int, ring: int, pad: int, batches: bool = True) -> Starlette:
    app, _, publisher = build(topics, ring, pad, NodePublisher, batches)
    assert isinstance(publisher, NodePublisher)

    async def rounds(request: Request) -> Response:
        n = int(request.query_params.get("n", "1"))
        now = time.monotonic_ns()
        for _ in range(n):
            publisher.publish_round(now)
        body = {"accepted": publisher.accepted, "refused": publisher.refused}
        return Response(orjson.dumps(body), media_type="application/json")

    app.add_route("/control/rounds", rounds, methods=["POST"])
    return app


def main() -> None:
    ap = server_args(__doc__ or "")
    ap.add_argument("--redis", default="", help=f"share topics through this Redis (sets {ENV})")
    ap.add_argument(
        "--no-batches",
        action="store_true",
        help="Rubris(batches=False): a Redis Cluster keeps no batches yet",
    )
    args = ap.parse_args()
    if args.redis:
        os.environ[ENV] = args.redis
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    raise_nofile()
    serve(
        functools.partial(make_app, args.topics, args.ring, args.pad, not args.no_batches),
        "uvicorn",
    )


if __name__ == "__main__":
    main()

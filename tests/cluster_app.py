"""The app tests/test_scaleout.py runs as real processes: each imports this module and builds
its own ``Rubris``; ``RUBRIS_REDIS_URL`` (set by the test) makes them share their topics."""

from __future__ import annotations

import os

from starlette.applications import Starlette
from starlette.routing import Mount

from rubris_asgi import Config, Rubris, Session, Timing
from rubris_asgi.cluster import ENV, RedisBroker

TOKEN = "cluster-test"
NODE_TIMEOUT = 3.0
"""Seconds before the others take a silent worker for dead (10 by default): tests wait less."""

rubris = Rubris(
    Config(timing=Timing(poll_timeout=1.0, session_timeout=5.0, shutdown_drain=2.0)),
    api_token=TOKEN,
    batches=False,
    broker=RedisBroker(os.environ[ENV], node_timeout=NODE_TIMEOUT) if os.environ.get(ENV) else None,
)


@rubris.shared("ring.{name}", ring=16)
async def ring(session: Session, name: str) -> None:
    return None


@rubris.shared("snap.{name}", snapshot=True)
async def snap(session: Session, name: str) -> None:
    return None


@rubris.queue("work", codel_target=None)  # a REVOKE of a started item would be a repeat
async def work(session: Session) -> None:
    return None


@rubris.private("inbox", queue=16)
async def inbox(session: Session) -> None:
    return None


@rubris.rpc("send_inbox")
async def send_inbox(session: Session, args: dict[str, int | str]) -> int:
    """Private messages ``{"n": i}`` for ``start`` <= i < ``stop`` to the session ``sid``,
    wherever it lives (``send_to``): what a worker does for a user on another worker."""
    for i in range(int(args["start"]), int(args["stop"])):
        await rubris.send_to(str(args["sid"]), "inbox", {"n": i})
    return int(args["stop"]) - int(args["start"])


@rubris.rpc("pid")
async def pid(session: Session, args: object) -> int:
    """Which worker process serves this session."""
    return os.getpid()


app = Starlette(routes=[Mount("/rubris", rubris)], lifespan=rubris.lifespan)

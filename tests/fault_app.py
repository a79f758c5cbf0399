"""The app tests/test_faults.py and bench/faults.py run as two real uvicorn nodes on one Redis.

Each node imports this module and builds its own ``Rubris`` on ``RUBRIS_REDIS_URL``. Besides
the channels the scenarios use (ring topics, a private inbox, a work queue), one HTTP route:

    POST /fault/send   {"sends": [[session_id, n], ...]}: ``Rubris.send_to(session_id,
                       "inbox", {"n": n})`` for each, all at once (as many concurrent calls
                       as pairs), answering each call's outcome in order: "ok", or the name of
                       the exception it raised (the test sorts them into refused and unknown)
    POST /fault/own    {"n": n}: ``Rubris.publish("ring.own", n)``, the application's own
                       publish (as a handler of the app's makes), answering "ok" or the
                       exception's name and text
    GET  /fault/ping   this node's pid at once: whether its event loop answers (a frozen
                       node does not)

It is a route of the node rather than an RPC of a client so that a send's caller is the node
itself, as in an application's own handler, and so that a client's call timeout or its own
connection faults never decide an outcome.
"""

from __future__ import annotations

import asyncio
import os

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from rubris_asgi import Config, Rubris, Session, Timing
from rubris_asgi.cluster import ENV, RedisBroker

TOKEN = "fault-test"
NODE_TIMEOUT = 3.0
"""Seconds before the others take a silent node for dead (the broker's least: 3)."""
HEARTBEAT = 1.0
"""Seconds between a client's PINGs (WELCOME.heartbeat_ms): the client drops a connection
silent for twice that, so a dead path is noticed after 2 to 3 s."""
RING = 256
"""Ring size: deep enough that the scenarios' outages (a few seconds at their rates) never
need a GAP, so any GAP or hole the suite counts is the fault's, not the ring's."""
INBOX = 256

rubris = Rubris(
    Config(
        timing=Timing(
            poll_timeout=1.0, session_timeout=20.0, heartbeat=HEARTBEAT, shutdown_drain=1.0
        )
    ),
    api_token=TOKEN,
    batches=False,
    # without the variable (tests/faultkit.py importing the constants above) no broker: the
    # nodes always have it
    broker=RedisBroker(os.environ[ENV], node_timeout=NODE_TIMEOUT) if os.environ.get(ENV) else None,
)


@rubris.shared("ring.{name}", ring=RING)
async def ring(session: Session, name: str) -> None:
    return None


@rubris.queue("work", codel_target=None)  # a REVOKE of a started item would be a repeat
async def work(session: Session) -> None:
    return None


@rubris.private("inbox", queue=INBOX)
async def inbox(session: Session) -> None:
    return None


@rubris.rpc("pid")
async def pid(session: Session, args: object) -> int:
    """Which node process serves this session (its home)."""
    return os.getpid()


async def _one(sid: str, n: int) -> str:
    try:
        await rubris.send_to(sid, "inbox", {"n": n})
    except Exception as exc:  # every outcome is data here: the test judges it by name
        return type(exc).__name__
    return "ok"


async def send(request: Request) -> Response:
    pairs = orjson.loads(await request.body())["sends"]
    outcomes = await asyncio.gather(*(_one(str(sid), int(n)) for sid, n in pairs))
    return Response(orjson.dumps(outcomes), media_type="application/json")


async def own(request: Request) -> Response:
    n = int(orjson.loads(await request.body())["n"])
    try:
        rubris.publish("ring.own", n)
    except Exception as exc:
        return Response(orjson.dumps(f"{type(exc).__name__}: {exc}"), media_type="application/json")
    return Response(b'"ok"', media_type="application/json")


async def ping(request: Request) -> Response:
    return Response(str(os.getpid()).encode(), media_type="text/plain")


async def debug(request: Request) -> Response:
    """GET /fault/debug: this node's figures for a scenario's post-mortem: ``rubris.stats()``,
    each ring topic's head here and the ring cursors of the sessions following it (how far
    behind the head the slowest are), and the relayed connections of both ends."""
    import dataclasses

    topics = {}
    for name, t in rubris.engine.topics.items():
        if not name.startswith("ring."):
            continue
        cursors = sorted(sub.cursor for sub in t.subs)
        topics[name] = {
            "seq": t.seq,
            "subs": len(cursors),
            "cursor_min": cursors[0] if cursors else None,
            "cursor_median": cursors[len(cursors) // 2] if cursors else None,
            "behind": sum(t.seq + 1 - c for c in cursors),
        }
    body = {
        "pid": os.getpid(),
        "stats": dataclasses.asdict(rubris.stats()),
        "topics": topics,
        "relay_homes": len(rubris.relays.homes),
        "relay_entries": len(rubris.relays.entries),
        "telemetry": {
            k: getattr(rubris.engine.telemetry, k)
            for k in (
                "sessions_opened",
                "sessions_resumed",
                "blocked_writes",
                "closed_blocked",
                "closed_backlog",
            )
        },
    }
    return Response(orjson.dumps(body, default=str), media_type="application/json")


app = Starlette(
    routes=[
        Route("/fault/send", send, methods=["POST"]),
        Route("/fault/own", own, methods=["POST"]),
        Route("/fault/ping", ping, methods=["GET"]),
        Route("/fault/debug", debug, methods=["GET"]),
        Mount("/rubris", rubris),
    ],
    lifespan=rubris.lifespan,
)

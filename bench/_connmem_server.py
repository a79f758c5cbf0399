"""The server half of bench/connmem.py: what one WebSocket connection costs in memory.

Started by bench/connmem.py as a subprocess; prints ``PORT n`` (bench/_servers.py serves it on
uvicorn with the bench's configuration: uvloop, httptools, websockets-sansio, no deflate).

``--app rubris``: a Starlette app with Rubris at /rubris, shared ring topics ``bench.{n}``
(as bench/_fanout_server.py builds it). ``--app plain``: the plain Starlette loop of
bench/_fanout_plain.py (a copy of its ``PlainLoop``, at /rubris/ws).

``--tracemalloc``: tracemalloc is started at process start (``--frames`` frames a traceback),
before any connection, so every allocation a connection makes is traced.

Control endpoints (127.0.0.1 only, used by the bench between steps):

    GET  /control/mem?label=L[&base=B&n=N][&trim=1]
            gc.collect(); RSS; objects per type (gc.get_objects: count and sys.getsizeof sum);
            with tracemalloc, the traced allocations grouped by file, by file:line and by
            owner (the innermost frame of uvicorn / websockets / starlette / rubris / bench
            that led to the allocation). Stored under ``label``; with ``base`` and ``n``, the
            answer also holds the difference from the step ``base``, divided by ``n``.
    POST /control/publish?topic=bench.0
            publish one message (rubris: ``Rubris.publish``; plain: one round of the loop)
    GET  /control/stats   connected sessions / clients
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import os
import resource
import secrets
import sys
import time
import tracemalloc
from collections import Counter
from typing import Any

if __name__ == "__main__" and "--tracemalloc" in sys.argv:
    _frames = 16
    if "--frames" in sys.argv:
        _frames = int(sys.argv[sys.argv.index("--frames") + 1])
    tracemalloc.start(_frames)  # before anything else: every later allocation is traced

import orjson  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402
from starlette.routing import Mount, Route, WebSocketRoute  # noqa: E402
from starlette.websockets import WebSocket, WebSocketDisconnect  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

from _servers import orphan_watchdog, serve_uvicorn  # noqa: E402

from rubris_asgi.protocol import (  # noqa: E402
    SUBPROTOCOL,
    Codec,
    Mode,
    Push,
    Subscribe,
    Subscribed,
    Welcome,
    encode,
    encode_frame,
    iter_messages,
)

PAGE = os.sysconf("SC_PAGE_SIZE")

# an allocation's owner: the innermost frame whose file path holds one of these
OWNERS = (
    ("/rubris_asgi/", "rubris_asgi"),
    ("/uvicorn/", "uvicorn"),
    ("/websockets/", "websockets"),
    ("/starlette/", "starlette"),
    ("/bench/", "bench"),
)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def malloc_trim() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def short(path: str) -> str:
    """A file path from its package on (site-packages and the stdlib prefix dropped)."""
    for marker in ("site-packages/", "/lib/python3.11/", "/work/main/"):
        i = path.rfind(marker)
        if i >= 0:
            return path[i + len(marker) :]
    return path


def type_name(t: type) -> str:
    mod = t.__module__
    return t.__qualname__ if mod == "builtins" else f"{mod}.{t.__qualname__}"


def object_census() -> dict[str, list[int]]:
    """gc-tracked objects per type: [count, sum of sys.getsizeof]."""
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    getsizeof = sys.getsizeof
    names: dict[type, str] = {}
    for o in gc.get_objects():
        t = type(o)
        name = names.get(t)
        if name is None:
            name = names[t] = type_name(t)
        counts[name] += 1
        try:
            sizes[name] += getsizeof(o)
        except Exception:
            pass
    return {k: [counts[k], sizes[k]] for k in counts}


def _owner_key(frames: tuple[tuple[str, int], ...]) -> str:
    """``owner | innermost file:line of that owner`` (``-> file`` of the innermost frame when
    that one is outside every owner, e.g. ``asyncio/tasks.py``). ``frames``: the raw
    traceback of a trace, most recent first."""
    inner_file = short(frames[0][0])
    for i, (filename, lineno) in enumerate(frames):
        for marker, owner in OWNERS:
            if marker in filename:
                site = f"{short(filename)}:{lineno}"
                return f"{owner} | {site}" if i == 0 else f"{owner} | {site} -> {inner_file}"
    return f"(none) | {inner_file}:{frames[0][1]}"


def traced_groups() -> dict[str, dict[str, list[int]]]:
    """Traced allocations grouped by file, by file:line (innermost frame) and by owner:
    {group: {key: [bytes, blocks]}}. The snapshot is dropped before returning."""
    snap = tracemalloc.take_snapshot()
    by_file: dict[str, list[int]] = {}
    by_line: dict[str, list[int]] = {}
    by_owner: dict[str, list[int]] = {}
    keys: dict[int, tuple[str, str, str]] = {}
    skip = (tracemalloc.__file__, "<frozen importlib._bootstrap>")
    # raw traces: (domain, size, frames most recent first, total frames); the frames tuple of
    # one allocation site is shared by all its traces, so it is grouped once
    for trace in snap.traces._traces:  # type: ignore[attr-defined]
        frames = trace[2]
        k = keys.get(id(frames))
        if k is None:
            f0 = frames[0]
            fk = short(f0[0])
            k = keys[id(frames)] = (
                "" if f0[0] in skip else fk,
                f"{fk}:{f0[1]}",
                _owner_key(frames),
            )
        if not k[0]:
            continue
        size = trace[1]
        for group, key in ((by_file, k[0]), (by_line, k[1]), (by_owner, k[2])):
            e = group.get(key)
            if e is None:
                group[key] = [size, 1]
            else:
                e[0] += size
                e[1] += 1
    del snap, keys
    return {"file": by_file, "line": by_line, "owner": by_owner}


def diff_groups(
    now: dict[str, list[int]], base: dict[str, list[int]], n: int, top: int, min_bytes: float
) -> list[list[Any]]:
    """[key, bytes per n, blocks per n] for keys whose difference is at least ``min_bytes``
    per n (absolute), largest first, at most ``top``."""
    out = []
    for k in set(now) | set(base):
        a = now.get(k, [0, 0])
        b = base.get(k, [0, 0])
        db = (a[0] - b[0]) / n
        if abs(db) >= min_bytes:
            out.append([k, round(db, 1), round((a[1] - b[1]) / n, 3)])
    out.sort(key=lambda e: -abs(e[1]))
    return out[:top]


class Steps:
    """The measurements taken so far, by label."""

    def __init__(self) -> None:
        self.rss: dict[str, int] = {}
        self.census: dict[str, dict[str, list[int]]] = {}
        self.traced: dict[str, dict[str, dict[str, list[int]]]] = {}
        self.traced_total: dict[str, int] = {}

    def compare(self, label: str, base: str, n: int) -> dict[str, Any]:
        """Step ``label`` minus step ``base``, per connection (``n``)."""
        out: dict[str, Any] = {"rss_per_conn": (self.rss[label] - self.rss[base]) / n}
        census, b = self.census[label], self.census[base]
        rows = []
        for k in set(census) | set(b):
            c1, s1 = census.get(k, [0, 0])
            c0, s0 = b.get(k, [0, 0])
            dc = (c1 - c0) / n
            if abs(dc) >= 0.05:
                rows.append([k, round(dc, 3), round((s1 - s0) / n, 1)])
        rows.sort(key=lambda r: -abs(r[2]))
        out["objects_per_conn"] = rows[:60]
        out["objects_bytes_per_conn"] = round(sum(r[2] for r in rows), 1)
        if label in self.traced and base in self.traced:
            t1, t0 = self.traced[label], self.traced[base]
            out["traced_per_conn"] = (self.traced_total[label] - self.traced_total[base]) / n
            out["by_file"] = diff_groups(t1["file"], t0["file"], n, 40, 1.0)
            out["by_line"] = diff_groups(t1["line"], t0["line"], n, 25, 1.0)
            out["by_owner"] = diff_groups(t1["owner"], t0["owner"], n, 60, 1.0)
        return out

    def measure(self, label: str, base: str | None, n: int, trim: bool) -> dict[str, Any]:
        gc.collect()
        gc.collect()
        if trim:
            malloc_trim()
        rss = rss_bytes()  # before anything this step allocates for itself
        self.rss[label] = rss
        out: dict[str, Any] = {"label": label, "rss": rss}
        if tracemalloc.is_tracing():
            groups = traced_groups()
            self.traced[label] = groups
            total = sum(v[0] for v in groups["file"].values())
            self.traced_total[label] = total
            out["traced"] = total
        census = object_census()
        self.census[label] = census
        for name in (base or "").split(","):
            if name in self.rss and n > 0:
                out.setdefault("vs", {})[name] = self.compare(label, name, n)
        gc.collect()
        return out


def build_rubris(ring: int) -> tuple[list[Any], Any, Any, Any]:
    """Rubris at /rubris with ring topics ``bench.{n}``, as bench/_fanout_server.py builds it."""
    from rubris_asgi import Config, Rubris, Session, Timing

    rubris = Rubris(Config(timing=Timing(heartbeat=60.0)), compress_at=None)

    @rubris.shared("bench.{n}", ring=ring)
    async def bench_topic(session: Session, n: str) -> None:
        return None

    async def publish(topic: str) -> int:
        return rubris.publish(topic, {"t": time.monotonic_ns(), "i": 0, "pad": "x" * 40})

    def connected() -> int:
        return int(rubris.stats().connected)

    return [Mount("/rubris", rubris)], rubris, publish, connected


class PlainLoop:
    """bench/_fanout_plain.py's loop, reduced to what this bench's clients do (kept apart:
    there a round goes to a topic's subscribers, here to every socket, as these clients send
    HELLO alone; and a memory figure's subject should not move with the fan-out bench):
    accept (``rubris.v1``), read the first frame (HELLO), answer WELCOME (and a SUBSCRIBED per
    SUBSCRIBE of that frame), keep the socket in a set, then read and ignore what the client
    sends until it goes. A round is one PUSH frame awaited client by client (Starlette's
    ``WebSocket.send_bytes``)."""

    def __init__(self, pad: int = 40) -> None:
        self.seq = 0
        self.pad = "x" * pad
        self.clients: set[WebSocket] = set()

    async def publish_round(self, stamp_ns: int) -> int:
        self.seq += 1
        payload = orjson.dumps({"t": stamp_ns, "i": self.seq, "pad": self.pad})
        frame = encode(Push(1, self.seq, payload))
        for ws in list(self.clients):
            try:
                await ws.send_bytes(frame)
            except Exception:
                self.clients.discard(ws)
        return self.seq

    async def endpoint(self, ws: WebSocket) -> None:
        await ws.accept(subprotocol=SUBPROTOCOL)
        try:
            first = await ws.receive_bytes()
        except WebSocketDisconnect:
            return
        replies: list[Any] = [Welcome(secrets.token_hex(8), "", 60_000, 256 * 1024, False)]
        for m in iter_messages(first):
            if type(m) is Subscribe:
                replies.append(
                    Subscribed(m.req, 1, Mode.RING, Codec.JSON, 1, self.seq, False, m.name)
                )
        await ws.send_bytes(encode_frame(replies))
        self.clients.add(ws)
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
        finally:
            self.clients.discard(ws)


def build_plain() -> tuple[list[Any], Any, Any, Any]:
    """The plain loop's endpoint at /rubris/ws."""
    loop = PlainLoop()

    async def publish(topic: str) -> int:
        return await loop.publish_round(time.monotonic_ns())

    def connected() -> int:
        return len(loop.clients)

    return [WebSocketRoute("/rubris/ws", loop.endpoint)], None, publish, connected


def make_app(app: str, ring: int) -> Starlette:
    routes, rubris, publish, connected = build_rubris(ring) if app == "rubris" else build_plain()
    steps = Steps()

    async def mem(request: Request) -> Response:
        q = request.query_params
        out = steps.measure(
            q.get("label", "?"), q.get("base"), int(q.get("n", "0")), bool(q.get("trim"))
        )
        return Response(orjson.dumps(out), media_type="application/json")

    async def do_publish(request: Request) -> Response:
        seq = await publish(request.query_params.get("topic", "bench.0"))
        return Response(orjson.dumps({"seq": seq}), media_type="application/json")

    async def stats(request: Request) -> Response:
        body = {"connected": connected(), "rss": rss_bytes(), "tracing": tracemalloc.is_tracing()}
        return Response(orjson.dumps(body), media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
        cm = rubris if rubris is not None else contextlib.nullcontext()
        async with cm:
            watchdog = asyncio.create_task(orphan_watchdog())
            try:
                yield
            finally:
                watchdog.cancel()

    return Starlette(
        routes=[
            Route("/control/mem", mem, methods=["GET"]),
            Route("/control/publish", do_publish, methods=["POST"]),
            Route("/control/stats", stats, methods=["GET"]),
            *routes,
        ],
        lifespan=lifespan,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--app", choices=("rubris", "plain"), default="rubris")
    ap.add_argument("--ring", type=int, default=64)
    ap.add_argument("--cpu", type=int, default=None, help="pin to this core")
    ap.add_argument("--tracemalloc", action="store_true", help="trace allocations (see above)")
    ap.add_argument("--frames", type=int, default=16, help="tracemalloc frames a traceback")
    args = ap.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    raise_nofile()
    serve_uvicorn(make_app(args.app, args.ring))


if __name__ == "__main__":
    main()

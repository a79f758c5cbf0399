"""What one WebSocket connection costs in server memory: Rubris (or the plain loop) on uvicorn.

    python3 bench/connmem.py [--n 10000] [--app rubris|plain|both] [--tracemalloc]

The server (bench/_connmem_server.py: uvicorn with uvloop, httptools, websockets-sansio, no
permessage-deflate, as bench/_servers.py serves every bench) runs on 127.0.0.1, pinned to core
``--cpu`` (0); the N clients run in this process (``websockets.asyncio.client``, pinned to
``--load-cpu``, 1). RLIMIT_NOFILE is raised (soft to hard) in both.

Steps, each measured in the server after ``gc.collect()`` (RSS from /proc/self/statm):

    zero        no connection (after a warm-up of ``--warmup`` connections opened and closed,
                so one-time costs, imports and caches, are not charged to connections)
    idle        N connected sessions: HELLO answered by WELCOME, nothing subscribed
    subscribed  the same N, each subscribed to the ring topic ``bench.0`` (SUBSCRIBE in a
                second frame, SUBSCRIBED received) and sent one PUSH (so every per-session
                structure that appears on first delivery exists)

For ``--app plain`` (bench/_fanout_plain.py's loop, which answers HELLO and ignores later
frames) the second step is ``delivered``: one round sent to each client.

Each step reports RSS per connection in KiB (difference from ``zero`` / N, and from the step
before); the server's gc-tracked objects per type per connection (count and sys.getsizeof
bytes). With ``--tracemalloc`` the server traces allocations from its start (RSS is then
inflated by tracemalloc's own bookkeeping: use the figures of a run without it for RSS), and
each step reports the traced bytes per connection grouped by file, by file:line (top 25) and by
owner (the innermost uvicorn / websockets / starlette / rubris_asgi frame that made it).

Last line: ``idle_kib_per_conn=N subscribed_kib_per_conn=N [plain_kib_per_conn=N]`` (plain:
after its delivery step; only when measured). ``--json FILE`` writes everything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
import urllib.request
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from rubris_asgi.protocol import (  # noqa: E402
    Hello,
    Push,
    Subscribe,
    Subscribed,
    Welcome,
    encode_frame,
    iter_messages,
)

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "_connmem_server.py")
TOPIC = "bench.0"
KIB = 1024


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Counts:
    __slots__ = ("subscribed", "pushes", "closed")

    def __init__(self) -> None:
        self.subscribed = 0
        self.pushes = 0
        self.closed = 0


class Client:
    __slots__ = ("ws", "task")

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.task: asyncio.Task[None] | None = None


async def reader(ws: ClientConnection, counts: Counts) -> None:
    try:
        while True:
            frame = await ws.recv()
            if not isinstance(frame, bytes):
                continue
            for m in iter_messages(frame):
                if type(m) is Push:
                    counts.pushes += 1
                elif type(m) is Subscribed:
                    counts.subscribed += 1
    except ConnectionClosed:
        counts.closed += 1


async def open_client(url: str, counts: Counts) -> Client:
    ws = await connect(
        url,
        subprotocols=["rubris.v1"],  # type: ignore[list-item]
        compression=None,
        max_size=None,
        proxy=None,
        ping_interval=None,
        open_timeout=120,
        close_timeout=5,
        user_agent_header=None,
    )
    await ws.send(encode_frame([Hello(1, "")]))
    while True:
        frame = await asyncio.wait_for(ws.recv(), 120)
        assert isinstance(frame, bytes)
        if any(isinstance(m, Welcome) for m in iter_messages(frame)):
            break
    client = Client(ws)
    client.task = asyncio.get_running_loop().create_task(reader(ws, counts))
    return client


async def open_clients(url: str, n: int, counts: Counts, concurrency: int) -> list[Client]:
    sem = asyncio.Semaphore(concurrency)

    async def one() -> Client:
        async with sem:
            return await open_client(url, counts)

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def close_clients(clients: list[Client], concurrency: int = 500) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(c: Client) -> None:
        async with sem:
            try:
                await asyncio.wait_for(c.ws.close(), 5)
            except Exception:
                c.ws.transport.abort()
        if c.task is not None:
            c.task.cancel()

    await asyncio.gather(*(one(c) for c in clients), return_exceptions=True)
    tasks: list[Any] = [c.task for c in clients if c.task is not None]
    await asyncio.gather(*tasks, return_exceptions=True)


class Server:
    """The server subprocess and its control endpoints."""

    def __init__(self, app: str, cpu: int | None, trace: bool, frames: int) -> None:
        cmd = [sys.executable, SERVER, "--app", app]
        if cpu is not None:
            cmd += ["--cpu", str(cpu)]
        if trace:
            cmd += ["--tracemalloc", "--frames", str(frames)]
        env = dict(os.environ, RUBRIS_BENCH_PID=str(os.getpid()))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, cwd=HERE)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"the server did not start: {line!r}")
        self.port = int(line.split()[1])
        self.base = f"http://127.0.0.1:{self.port}"

    def _call(self, method: str, path: str, timeout: float = 600) -> dict[str, Any]:
        req = urllib.request.Request(self.base + path, method=method)
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    async def call(self, method: str, path: str) -> dict[str, Any]:
        return await asyncio.to_thread(self._call, method, path)

    async def ready(self) -> None:
        for _ in range(300):
            try:
                await self.call("GET", "/control/stats")
                return
            except OSError:
                await asyncio.sleep(0.1)
        raise RuntimeError("the server does not answer")

    async def wait_connected(self, n: int, timeout: float = 120) -> None:
        stop = time.monotonic() + timeout
        while True:
            got = (await self.call("GET", "/control/stats"))["connected"]
            if got == n:
                return
            if time.monotonic() > stop:
                raise RuntimeError(f"{got} connected, expected {n}")
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def wait_for(what: str, cond: Any, timeout: float = 120) -> None:
    stop = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > stop:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def show_step(app: str, step: dict[str, Any], n: int, top_objects: int) -> None:
    label = step["label"]
    print(f"\n== {app} / {label}: RSS {step['rss'] / 2**20:.1f} MiB", flush=True)
    for base, d in step.get("vs", {}).items():
        per = d["rss_per_conn"]
        line = f"   vs {base}: RSS {per / KIB:.2f} KiB/conn ({per:.0f} B)"
        if "traced_per_conn" in d:
            line += f", traced {d['traced_per_conn']:.0f} B/conn"
        line += f", gc objects {d['objects_bytes_per_conn']:.0f} B/conn (getsizeof)"
        print(line)
        print(f"   objects per conn vs {base} (type: count, getsizeof bytes):")
        for name, count, size in d["objects_per_conn"][:top_objects]:
            print(f"      {count:7.2f}  {size:8.1f} B  {name}")
        if "by_file" in d:
            print(f"   traced per conn vs {base}, by file (bytes, blocks):")
            for k, b, blocks in d["by_file"]:
                print(f"      {b:8.1f} B {blocks:7.2f}  {k}")
            print(f"   traced per conn vs {base}, top 25 by file:line:")
            for k, b, blocks in d["by_line"]:
                print(f"      {b:8.1f} B {blocks:7.2f}  {k}")
            print(f"   traced per conn vs {base}, by owner (innermost owner frame -> file):")
            for k, b, blocks in d["by_owner"]:
                print(f"      {b:8.1f} B {blocks:7.2f}  {k}")


async def run_app(app: str, args: argparse.Namespace) -> dict[str, Any]:
    n = args.n
    server = Server(app, args.cpu, args.tracemalloc, args.frames)
    out: dict[str, Any] = {"app": app, "n": n, "steps": []}
    clients: list[Client] = []
    try:
        await server.ready()
        url = f"ws://127.0.0.1:{server.port}/rubris/ws"
        trim = "&trim=1" if args.trim else ""
        # warm-up: one-time costs (imports, caches, first-use allocations) are not per connection
        if args.warmup:
            warm = await open_clients(url, args.warmup, Counts(), args.concurrency)
            await close_clients(warm)
            del warm
            await server.wait_connected(0)
        zero = await server.call("GET", f"/control/mem?label=zero{trim}")
        out["steps"].append(zero)
        print(f"== {app} / zero: RSS {zero['rss'] / 2**20:.1f} MiB", flush=True)

        counts = Counts()
        t0 = time.monotonic()
        clients = await open_clients(url, n, counts, args.concurrency)
        await server.wait_connected(n)
        print(f"   {n} clients connected in {time.monotonic() - t0:.1f} s", flush=True)
        await asyncio.sleep(args.settle)
        idle = await server.call("GET", f"/control/mem?label=idle&base=zero&n={n}{trim}")
        out["steps"].append(idle)
        show_step(app, idle, n, args.top_objects)

        if app == "rubris":
            sub = encode_frame([Subscribe(2, TOPIC, 0, 0, b"")])
            sem = asyncio.Semaphore(args.concurrency)

            async def subscribe(c: Client) -> None:
                async with sem:
                    await c.ws.send(sub)

            await asyncio.gather(*(subscribe(c) for c in clients))
            await wait_for("SUBSCRIBED", lambda: counts.subscribed >= n)
            label = "subscribed"
        else:
            label = "delivered"
        await server.call("POST", f"/control/publish?topic={TOPIC}")
        await wait_for("one PUSH each", lambda: counts.pushes >= n)
        await asyncio.sleep(args.settle)
        step = await server.call("GET", f"/control/mem?label={label}&base=zero,idle&n={n}{trim}")
        out["steps"].append(step)
        show_step(app, step, n, args.top_objects)
        out["idle_kib"] = idle["vs"]["zero"]["rss_per_conn"] / KIB
        out["second_kib"] = step["vs"]["zero"]["rss_per_conn"] / KIB
        out["second_label"] = label
        if counts.closed:
            print(f"   !! {counts.closed} clients were closed by the server", flush=True)
    finally:
        if clients:
            await close_clients(clients)
        server.stop()
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    apps = ["rubris", "plain"] if args.app == "both" else [args.app]
    results = {}
    for app in apps:
        results[app] = await run_app(app, args)
    return results


def summary(results: dict[str, Any]) -> None:
    print()
    for app, r in results.items():
        print(
            f"{app}: idle {r['idle_kib']:.2f} KiB/conn, "
            f"{r['second_label']} {r['second_kib']:.2f} KiB/conn (N={r['n']})"
        )
    parts = []
    if "rubris" in results:
        r = results["rubris"]
        parts.append(f"idle_kib_per_conn={r['idle_kib']:.2f}")
        parts.append(f"subscribed_kib_per_conn={r['second_kib']:.2f}")
    if "plain" in results:
        parts.append(f"plain_kib_per_conn={results['plain']['second_kib']:.2f}")
    print(" ".join(parts), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000, help="connections (default 10,000)")
    ap.add_argument("--app", choices=("rubris", "plain", "both"), default="rubris")
    ap.add_argument("--tracemalloc", action="store_true", help="trace the server's allocations")
    ap.add_argument("--frames", type=int, default=16, help="tracemalloc frames a traceback")
    ap.add_argument("--cpu", type=int, default=0, help="the server's core (default 0)")
    ap.add_argument("--load-cpu", type=int, default=1, help="this process's core (-1: none)")
    ap.add_argument("--concurrency", type=int, default=200, help="connects at once")
    ap.add_argument("--warmup", type=int, default=200, help="connections before step zero")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds before each measure")
    ap.add_argument("--trim", action="store_true", help="malloc_trim(0) before each RSS")
    ap.add_argument("--top-objects", type=int, default=30)
    ap.add_argument("--json", default="", help="write every figure to this file")
    args = ap.parse_args()
    raise_nofile()
    if args.load_cpu >= 0 and args.load_cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {args.load_cpu})
    results = asyncio.run(main_async(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    summary(results)


if __name__ == "__main__":
    main()

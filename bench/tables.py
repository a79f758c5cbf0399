"""Keyed topics (live tables, protocol.md section 5b): what the deltas save, and their bounds.

Not a test. The demo's order book (example_app/market.py's ``Book``: 100 levels, a few of which
change at each step, as real books do) is sent to the same clients twice, side by side in one
run and from the same update stream: as today's snapshot topic (the whole book at every step,
deflated) and as a keyed topic (one entry per level, a PATCH of a changed size). Sans-IO where
the figure is the engine's; over a real server (uvicorn on 127.0.0.1) where it is the wire's.

    python3 bench/tables.py            # ends with the issue's one key=value line
    python3 bench/tables.py --quick

Figures (the last line):
- ``bytes_vs_snapshot``: bytes on the wire per client per second, keyed with PATCH over
  snapshot with deflate (target <= 0.2);
- ``cpu_vs_snapshot``: the server's CPU per step of the book (publish + the cycles that deliver
  it to every client), keyed over snapshot (target <= 1.0);
- ``stale_keys_after_catchup``: 1,000 subscribers of which 100 read at a tenth of the publish
  rate: keys differing from the server's once each has read to the head (target 0);
- ``slow_sub_kib``: memory per subscriber that stopped reading, on a 10,000-key table that
  then changes whole (bounded by the table, not by the changes);
- ``presence_converge_ms``: 1,000 sessions joining and leaving across 2 nodes on Redis, until
  both nodes' presence tables equal the truth (target <= 1000; needs redis-server);
- ``max_rate_err``: subscribers asking 2/s of a topic changed 100 times a second: relative error
  of the rate they receive (target <= 0.1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import random
import socket
import statistics
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import orjson  # noqa: E402

from example_app.market import Book, Market  # noqa: E402
from rubris_asgi.client.table import Table  # noqa: E402
from rubris_asgi.config import Config  # noqa: E402
from rubris_asgi.engine.buffers import FrameBuffer  # noqa: E402
from rubris_asgi.engine.engine import Engine  # noqa: E402
from rubris_asgi.engine.keyed.topic import KeyedTopic  # noqa: E402
from rubris_asgi.engine.session import Session  # noqa: E402
from rubris_asgi.protocol import Entry, Mode, decode_frame  # noqa: E402

STEP = 0.1
"""Seconds between two steps of the book (the demo's tick)."""
SERVER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tables_server.py")


class Sink:
    """A transport that counts bytes; ``every`` > 1: a slow reader, whose write completes only
    every ``every``-th cycle (it reads at that fraction of the rate); ``keep``: its frames."""

    writing_since = 0.0

    def __init__(self, engine: Engine, session: Session, every: int = 1, keep: bool = False):
        self.engine = engine
        self.session = session
        self.every = every
        self.keep = keep
        self.bytes = 0
        self.frames: list[bytes] = []
        self.held: list[FrameBuffer] = []

    def write_now(self, frame: bytes) -> bool:
        if self.every != 1:
            return False
        self.bytes += len(frame)
        if self.keep:
            self.frames.append(frame)
        return True

    def send_frame(self, frame: bytes, lease: FrameBuffer) -> None:
        self.bytes += len(frame)
        if self.keep:
            self.frames.append(frame)
        if self.every == 1:
            self.engine.frame_done(self.session, lease)
        else:
            self.held.append(lease)

    def tick(self, cycle: int) -> None:
        if self.held and cycle % self.every == 0:
            held, self.held = self.held, []
            for lease in held:
                self.engine.frame_done(self.session, lease)


def stream(steps: int, seed: int = 11) -> tuple[Book, list[list[Any]], list[dict[str, Any]]]:
    """The book's first table, each step's changes and each step's whole book (computed ahead,
    so neither side's figure includes the simulation)."""
    market = Market(seed)
    book = market.book("AAPL")
    first = Book("AAPL", market.quotes["AAPL"].bid, random.Random(seed))
    first.levels = book.table()
    changes, snapshots = [], []
    rng = random.Random(seed)
    for _ in range(steps):
        if rng.random() < 0.6:
            market.step("AAPL")
        changes.append(book.step(market.quotes["AAPL"].bid))
        snapshots.append(book.snapshot())
    return first, changes, snapshots


def wire_case(keyed: bool, clients: int, steps: int, repeat: int) -> dict[str, float]:
    """One side: ``clients`` subscribers, the stream applied step by step, a cycle after each."""
    first, changes, snapshots = stream(steps)
    cpu: list[float] = []
    per_client = 0.0
    for _ in range(repeat):
        e = Engine(Config(compress_at=256))  # the demo's book channel had compress_at=256
        if keyed:
            t = e.topic("book.AAPL", Mode.KEYED)
            assert isinstance(t, KeyedTopic)
            e.replace_table(t, first.levels)
        else:
            t = e.topic("book.AAPL", Mode.SNAPSHOT, compress_at=256)
            e.publish(t, first.snapshot())
        sinks = []
        for _ in range(clients):
            s = e.open_session()
            sink = Sink(e, s)
            e.attach(s, sink)
            e.subscribe(s, t, 1, 0, 0)
            sinks.append(sink)
        for _ in range(5):
            e.scheduler.run_cycle()
        for sink in sinks:
            sink.bytes = 0  # the first state is the same kind of cost for both: not counted
        gc.collect()
        gc.disable()
        t0 = time.process_time()
        cycle = e.scheduler.run_cycle
        if keyed:
            set_entry, delete_entry = e.set_entry, e.delete_entry
            for step in changes:
                for op, key, level in step:
                    if op == "set":
                        set_entry(t, key, level)  # type: ignore[arg-type]
                    else:
                        delete_entry(t, key)  # type: ignore[arg-type]
                cycle()
        else:
            publish = e.publish
            for snap in snapshots:
                publish(t, snap)
                cycle()
        cpu.append((time.process_time() - t0) / steps)
        gc.enable()
        per_client = statistics.mean(s.bytes for s in sinks) / (steps * STEP)
    return {"bytes_per_client_s": per_client, "cpu_per_step": statistics.median(cpu)}


async def server_cpu_case(keyed: bool, clients: int, steps: int, rate: float) -> float:
    """A real server (bench/_tables_server.py, uvicorn in its own process): ``clients``
    WebSockets subscribed to the book, the stream applied at ``rate`` steps a second; the
    server's CPU seconds per step, deliveries included (WebSocket framing, the socket writes)."""
    import httpx
    from websockets.asyncio.client import connect

    from rubris_asgi.protocol import Hello, Subscribe, encode_frame

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        SERVER_SCRIPT,
        "--mode",
        "keyed" if keyed else "snapshot",
        "--steps",
        str(steps),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "RUBRIS_BENCH_PID": str(os.getpid())},
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        port = int(line.split()[1])
        base = f"http://127.0.0.1:{port}"
        socks = []
        for _ in range(clients):
            ws = await connect(
                base.replace("http", "ws") + "/rubris/ws",
                subprotocols=["rubris.v1"],  # type: ignore[list-item]
                compression=None,
                max_size=None,
            )
            await ws.send(encode_frame([Hello(1, ""), Subscribe(1, "book.AAPL", 0, 0, b"")]))
            socks.append(ws)

        async def drain(ws: Any) -> None:
            with contextlib.suppress(Exception):
                async for _ in ws:
                    pass

        readers = [asyncio.create_task(drain(ws)) for ws in socks]
        async with httpx.AsyncClient(base_url=base, timeout=300) as http:
            while (await http.get("/control/subscribers")).json() < clients:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # (a server's count, polled: no event to wait on)
            await asyncio.sleep(0.5)  # the first state delivered: not part of the figure
            answer = (await http.post(f"/control/run?steps={steps}&rate={rate}")).json()
        for ws in socks:
            await ws.close()
        for r in readers:
            r.cancel()
        return float(answer["cpu"]) / steps
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        await proc.wait()


def catchup_case(clients: int, slow: int, steps: int) -> dict[str, float]:
    """``clients`` subscribers, ``slow`` of them reading at a tenth of the rate, each folding
    what it receives into a client ``Table``; stale keys once every one read to the head."""
    first, changes, _ = stream(steps, seed=3)
    e = Engine()
    t = e.topic("book.AAPL", Mode.KEYED)
    assert isinstance(t, KeyedTopic)
    e.replace_table(t, first.levels)
    readers: list[tuple[Sink, Table]] = []
    for i in range(clients):
        s = e.open_session()
        sink = Sink(e, s, every=10 if i < slow else 1, keep=True)
        e.attach(s, sink)
        e.subscribe(s, t, 1, 0, 0)
        readers.append((sink, Table("book.AAPL")))

    def fold() -> None:
        for sink, table in readers:
            for frame in sink.frames:
                for m in decode_frame(frame):
                    if isinstance(m, Entry):
                        table.apply(
                            m.seq, m.op, m.key, orjson.loads(m.payload) if m.payload else None
                        )
            sink.frames.clear()

    for n, step in enumerate(changes):
        for op, key, level in step:
            if op == "set":
                e.set_entry(t, key, level)  # type: ignore[arg-type]
            else:
                e.delete_entry(t, key)  # type: ignore[arg-type]
        e.scheduler.run_cycle()
        for sink, _ in readers:
            sink.tick(n)
        fold()
    cycles = 0
    while any(table.seq != t.seq for _, table in readers) and cycles < 1000:
        e.scheduler.run_cycle()
        for sink, _ in readers:
            sink.tick(0)
        fold()
        cycles += 1
    truth = {k: orjson.loads(v) for k, v in t.items()}
    stale = sum(
        sum(1 for k in truth.keys() | table.keys() if table.get(k) != truth.get(k))
        for _, table in readers
    )
    behind = sum(1 for _, table in readers if table.seq != t.seq)
    return {"stale_keys": stale + behind, "catchup_cycles": cycles}


def slow_memory_case(keys: int, subscribers: int) -> dict[str, float]:
    """Memory per subscriber that stopped reading after its first frame, on a ``keys``-key
    table that then changes whole (every key set again, twice): what the same changes cost
    with no subscriber at all is taken off (the table's own growth), the rest divided."""

    def run(subs: int) -> int:
        e = Engine()
        t = e.topic("big", Mode.KEYED)
        assert isinstance(t, KeyedTopic)
        e.replace_table(t, {f"k{i:05d}": {"v": i, "pad": "x" * 40} for i in range(keys)})
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(subs):
            s = e.open_session()
            sink = Sink(e, s, every=10**9)  # never completes a write: a reader that stopped
            e.attach(s, sink)
            e.subscribe(s, t, 1, 0, 0)
        e.scheduler.run_cycle()  # each takes its first frame (the lease it keeps) and stops
        for rnd in (1, 2):
            for i in range(keys):
                e.set_entry(t, f"k{i:05d}", {"v": i * rnd, "pad": "y" * 40})
            e.scheduler.run_cycle()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return after - before

    base = run(0)
    return {"kib_per_slow_sub": (run(subscribers) - base) / subscribers / 1024}


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """``app`` on uvicorn, in this process, on a free port of 127.0.0.1; its base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, lifespan="on", log_level="warning", ws_per_message_deflate=False)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def max_rate_case(clients: int, seconds: float) -> float:
    """Real server: ``clients`` WebSockets ask ``max_rate`` 2 of a snapshot topic published 100
    times a second; the relative error of the rate they receive (median over clients)."""
    from rubris_asgi import Rubris
    from rubris_asgi.protocol import Hello, Push, Subscribe, encode_frame

    rubris = Rubris()

    @rubris.shared("px", snapshot=True)
    def px(session: Any) -> int:
        return 0

    from websockets.asyncio.client import connect

    async with serving(rubris) as base:
        url = base.replace("http://", "ws://") + "/ws"
        arrivals: list[list[float]] = [[] for _ in range(clients)]

        async def client(i: int) -> None:
            async with connect(url, subprotocols=["rubris.v1"], compression=None) as ws:  # type: ignore[list-item]
                await ws.send(
                    encode_frame([Hello(1, ""), Subscribe(1, "px", 0, 0, b'{"max_rate": 2}')])
                )
                end = time.monotonic() + seconds + 1
                while time.monotonic() < end:
                    try:
                        frame = await asyncio.wait_for(ws.recv(), end - time.monotonic())
                    except (asyncio.TimeoutError, TimeoutError):
                        break
                    if any(isinstance(m, Push) for m in decode_frame(frame)):  # type: ignore[arg-type]
                        arrivals[i].append(time.monotonic())

        async def publisher() -> None:
            n = 0
            start = time.monotonic()
            while time.monotonic() - start < seconds + 1:
                n += 1
                rubris.publish("px", n)
                await asyncio.sleep(max(0.0, start + n * 0.01 - time.monotonic()))

        await asyncio.gather(publisher(), *(client(i) for i in range(clients)))
    errors = []
    for times in arrivals:
        rated = times[1:]  # after the first value, which is not rate-limited
        if len(rated) >= 2:
            rate = (len(rated) - 1) / (rated[-1] - rated[0])
            errors.append(abs(rate - 2.0) / 2.0)
    return statistics.median(errors) if errors else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--served", type=int, default=200, help="WebSockets of the CPU figure")
    ap.add_argument("--no-redis", action="store_true", help="skip presence_converge_ms")
    args = ap.parse_args()
    steps = 200 if args.quick else 600
    repeat = 3 if args.quick else 5
    print(f"cores={os.cpu_count()} python={sys.version.split()[0]} clients={args.clients}")
    snap = wire_case(False, args.clients, steps, repeat)
    keyed = wire_case(True, args.clients, steps, repeat)
    print(
        f"engine alone, {args.clients} clients: snapshot+deflate "
        f"{snap['bytes_per_client_s']:.0f} B/client/s, {snap['cpu_per_step'] * 1e3:.3f} ms CPU a "
        f"step; keyed+PATCH {keyed['bytes_per_client_s']:.0f} B/client/s, "
        f"{keyed['cpu_per_step'] * 1e3:.3f} ms CPU a step "
        f"(ratio {keyed['cpu_per_step'] / snap['cpu_per_step']:.2f})"
    )
    served = args.served
    cpus: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(3 if args.quick else 5):  # side by side, alternating
        for k in (False, True):
            cpus[k].append(asyncio.run(server_cpu_case(k, served, steps, 50.0)))
    cpu_snap, cpu_keyed = statistics.median(cpus[False]), statistics.median(cpus[True])
    print(
        f"real server (uvicorn), {served} WebSockets, 50 steps/s: snapshot "
        f"{cpu_snap * 1e6:.0f} us CPU a step, keyed {cpu_keyed * 1e6:.0f} us "
        f"(medians of {len(cpus[True])})"
    )
    catch = catchup_case(1000, 100, 100 if args.quick else 300)
    print(f"catch-up: {catch['stale_keys']} stale keys after {catch['catchup_cycles']} cycles")
    mem = slow_memory_case(10_000, 100 if args.quick else 200)
    print(f"slow subscriber on a 10,000-key table: {mem['kib_per_slow_sub']:.1f} KiB each")
    err = asyncio.run(max_rate_case(20 if args.quick else 50, 3.0 if args.quick else 6.0))
    print(f"max_rate 2/s of 100/s: median relative error {err:.3f}")
    presence = float("nan")
    if not args.no_redis:
        from _presence import converge_ms

        presence = asyncio.run(converge_ms(1000))
    print(
        f"bytes_vs_snapshot={keyed['bytes_per_client_s'] / snap['bytes_per_client_s']:.3f} "
        f"cpu_vs_snapshot={cpu_keyed / cpu_snap:.3f} "
        f"stale_keys_after_catchup={catch['stale_keys']} "
        f"slow_sub_kib={mem['kib_per_slow_sub']:.1f} "
        f"presence_converge_ms={presence:.0f} "
        f"max_rate_err={err:.3f}"
    )


if __name__ == "__main__":
    main()

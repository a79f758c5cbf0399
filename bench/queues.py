"""Work-queue benchmark: throughput, and the seed's slow-consumer scenario (prefetch vs CoDel).

Not a test. Three parts, each with its own figure on the last line.

Engine (sans-IO, in this process, no sockets): a queue channel with the package defaults (batch
64) and 1 or 4 consumers whose transport "writes" at once. Items (``{"i", "t"}``) are enqueued
1,000 at a time, then scheduler cycles run until all of them are acknowledged; after every cycle
each consumer ACKs the frame it got, in one ACK (tags from the last acked to the last issued),
and ``queue_tick`` (server-side CoDel, probes) runs every 5 ms as the runtime does. The
consumers fix their prefetch at 64 (one frame's worth: each ACK frees exactly a frame); a row
with the estimator's own prefetch is shown too, over a quarter of the items (with instant ACKs
there is no round trip to cover, so it settles at 1 item a frame: a diagnostic, not the
figure). Median of the repeats (``--repeats``, 3).
Target: >= 200,000 items/s (4 consumers).

End to end (real sockets, 127.0.0.1): the server (bench/_queues_server.py: uvicorn with uvloop,
httptools and ``websockets-sansio``, no permessage-deflate, Rubris at /rubris with the queue
``jobs``) runs in a subprocess pinned to core 0; this process, the load, is pinned to core 1:
4 ``rubris_asgi.client.Client`` consumers (WebSocket, ``client.consume("jobs")`` with the
defaults: the server's estimator sizes the prefetch, CoDel on both sides) in one uvloop event
loop, each ACKing every item at once, no work. The server's producer keeps 5,000 items waiting.
Items acknowledged per second by the server's count (``queue_stats().acked``), median of the
windows. Target: >= 20,000 items/s.

The seed's scenario (../shared/seeds/004: RabbitMQ's "prefetch and CoDel" note): 4 consumers,
each behind a ``DelayLine`` (bench/_queues_load.py) that delays every byte 50 ms in each
direction, so items arrive 50 ms after the server sends them, ACKs arrive 50 ms after the
client sends them, and REVOKE, PING and PONG are delayed alike; the client's own buffer (and its
CoDel) is where items wait after arrival. Processing is ``asyncio.sleep(0.004)`` per item (4
ms; the four share a core, so a busy-wait would serialise them; the measured mean is printed);
consumers ACK as each item is done. After the warm-up (5 s) consumer 0 slows to 40 ms per item
for the rest of the run (10 s). Configurations, each on a fresh server:

    prefetch 1     consume(prefetch=1), CoDel off on both sides
    prefetch 51    consume(prefetch=51), CoDel off on both sides (the seed's "doubled" buffer)
    auto           consume() (the server's estimator), CoDel off on both sides
    auto+CoDel     consume() with the client's CoDel (20 ms / 100 ms) and the server's CoDel on

The producer keeps a standing backlog: the server tops the queue up to 20 waiting items every
millisecond (``--backlog``), so there is always work for a consumer with free prefetch and the
enqueue rate follows what the consumers take. That is what makes utilisation mean what the seed
means (are the consumers kept busy when there is work?) instead of being bounded by an offered
rate; and 20 items is a small queue (about 26 ms at the post-slowdown capacity of 3 x 250 + 25
= 775 items/s), so the latency is dominated by where items wait inside the consumers, which is
what differs between configurations. A consumer that cannot keep up makes the server queue's
wait longer too (prefetch 1: 20 items at its ~38 items/s), and that is counted: the latency is
honest from the producer's point of view.

Figures per configuration (a table, one row each, comes before the last line):

- utilisation: processing time / wall time per consumer and their mean, in the second half of
  the warm-up ("before") and over the slowdown ("after");
- item latency: enqueue (the server's ``time.monotonic_ns()`` in the payload) to the end of its
  processing and ``ack()`` in the consumer (the load's ``time.monotonic_ns()``: CLOCK_MONOTONIC
  is one clock for the machine), for the items *enqueued* after the slowdown began, by id, so
  the slowest are not cut off at the end of the window: they finish in the drain, and one that
  never does counts with its wait so far. An item processed twice counts at its last
  completion. p50/p99 over all of them, and p99 of those the fast consumers and the slow one
  did; the ACK's own 50 ms back to the server is not included;
- lost: after the producer stops and the queue drains (up to ``--drain`` s), enqueued - acked -
  still waiting - still outstanding, by the server's counters (an item dead-lettered without a
  dead-letter queue is lost); cross-checked by the ids the consumers completed;
- duplicates: completions beyond an item's first, by the id in the payload (delivery is at least
  once: an item taken back after a consumer started it is done twice);
- the server's prefetch per consumer after the slowdown (median of its 100 ms samples, and the
  slow consumer's largest), the slow consumer's round trip and processing time as the server
  estimated them, CoDel's give-backs (client ``codel_returned``) and REVOKEs (server
  ``revoked``), and whether other processes used our cores meanwhile (``NOISY``: the figures
  then say as much about the machine as about the queue).

Reading it. The slow consumer does about 3 % of the items after the slowdown, so the overall
p99 sits at the edge of its share: "slow p99" is where the configurations differ most. With a
prefetch of 51 every item the slow consumer takes waits behind ~50 others at 40 ms (~2 s, the
seed's 1,880 ms). The estimator cuts the slow consumer's prefetch to ~4 within a few items, but
what it already held at the slowdown (a prefetch's worth, ~26 items) still waits ~1 s: only
CoDel (the client giving back what waited, the server taking back with REVOKE) moves those to
the fast consumers. The estimator times processing by the spacing of ACKs, summed over a round
trip, so ACKs that arrive in bursts (a stalled event loop in the load or the server, a noisy
machine) do not make items look cheap; the samples (``--json``) show the estimates over time.

Target: auto+CoDel keeps utilisation >= 90 % and its p99 latency after the slowdown at most
half of prefetch 51's, with nothing lost.

    python bench/queues.py            # full run, about 1.5 minutes
    python bench/queues.py --quick    # shorter phases, under 1 minute
    python bench/queues.py --skip-engine --skip-e2e --setups auto,auto+CoDel --json out.json

The last line is
``items_per_s=N engine_items_per_s=N codel_p99_vs_prefetch51=R lost=N duplicates=N``
(lost and duplicates: totals over the end-to-end and scenario runs; the ratio is nan when
either configuration was not run).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import uvloop

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from _queues_load import Counter, DelayLine, Ledger, Worker  # noqa: E402
from fanout import Server as FanoutServer  # noqa: E402
from fanout import (  # noqa: E402
    core_usage,
    cpu_ticks,
    http,
    load_cpu,
    prepare_load,
    quick_or_full,
    wait_quiet,
)

from rubris_asgi.buffers import FrameBuffer  # noqa: E402
from rubris_asgi.channels import Registry  # noqa: E402
from rubris_asgi.client import Client, Consumer  # noqa: E402
from rubris_asgi.engine import Engine  # noqa: E402
from rubris_asgi.protocol import Ack  # noqa: E402
from rubris_asgi.queues import QueueSettings, QueueSub  # noqa: E402
from rubris_asgi.session import Session  # noqa: E402

SERVER = os.path.join(HERE, "_queues_server.py")
SERVER_CORE = 0
LOAD_CORE = 1
QUEUE = "jobs"
CONSUMERS = 4
ENGINE_TARGET = 200_000
E2E_TARGET = 20_000
UTIL_TARGET = 0.90


@dataclass(frozen=True)
class Setup:
    """One configuration of the seed's scenario."""

    name: str
    prefetch: int | None
    codel: bool


SETUPS = [
    Setup("prefetch 1", 1, False),
    Setup("prefetch 51", 51, False),
    Setup("auto", None, False),
    Setup("auto+CoDel", None, True),
]


class Server(FanoutServer):
    """The queue server subprocess (bench/_queues_server.py)."""

    def __init__(self, args: list[str], pin: bool) -> None:
        super().__init__(args, pin, SERVER)

    async def stats(self, samples: bool = False) -> Any:
        return await http(self.port, "GET", "/control/stats" + ("?samples=1" if samples else ""))


def cpu_of(s: dict[str, Any]) -> float:
    return float(s["cpu_user"] + s["cpu_sys"])


def noise(k0: dict[str, list[int]], k1: dict[str, list[int]], server: float, load: float) -> str:
    """Busy % of our two cores beyond what our processes used: other work on the machine."""
    machine = core_usage(k0, k1)
    extra = {
        f"cpu{SERVER_CORE}": machine.get(f"cpu{SERVER_CORE}_busy_pct", 0.0) - server,
        f"cpu{LOAD_CORE}": machine.get(f"cpu{LOAD_CORE}_busy_pct", 0.0) - load,
    }
    noisy = {k: v for k, v in extra.items() if v > 15}
    return " NOISY: " + ", ".join(f"{k} +{v:.0f}%" for k, v in noisy.items()) if noisy else ""


# --------------------------------------------------------------------------- engine (sans-IO)


class NullSink:
    """A transport whose writes complete at once; counts frames."""

    __slots__ = ("engine", "session", "frames")

    def __init__(self, engine: Engine, session: Session) -> None:
        self.engine = engine
        self.session = session
        self.frames = 0

    def send_frame(self, frame: bytes, lease: FrameBuffer) -> None:
        self.frames += 1
        self.engine.frame_done(self.session, lease)

    def superseded(self) -> None:
        pass


def engine_case(consumers: int, prefetch: int | None, batch: int, total: int) -> dict[str, Any]:
    """``total`` items through ``consumers`` consumers; items/s over enqueue, cycles and ACKs."""
    e = Engine()
    registry = Registry()
    registry.queue(QUEUE, QueueSettings(max_length=1_000_000))(lambda s: None)
    registry.freeze()
    found = registry.match(QUEUE)
    assert found is not None
    q = e.queue_of(QUEUE, found[0], registry)
    subs: list[tuple[Session, QueueSub, NullSink]] = []
    for _ in range(consumers):
        s = e.open_session()
        sink = NullSink(e, s)
        e.attach(s, sink)
        subs.append((s, e.subscribe_queue(s, q, 1, prefetch), sink))
    e.scheduler.run_cycle()  # SUBSCRIBED
    acked_upto = [0] * consumers
    value = {"i": 0, "t": time.monotonic_ns()}
    run_cycle = e.scheduler.run_cycle
    enqueue = e.enqueue
    number = q.number
    stats = q.stats
    cycles = 0
    gc.collect()
    gc.disable()
    try:
        t0 = tick = time.perf_counter()
        while stats.acked < total:
            for i in range(batch):
                value = {"i": i, "t": 0}
                enqueue(q, value)
            target = stats.acked + batch
            while stats.acked < target:
                run_cycle()
                cycles += 1
                for k, (s, sub, _) in enumerate(subs):
                    last = sub.tag
                    if last > acked_upto[k]:
                        e.ack(s, Ack.items(number, range(acked_upto[k] + 1, last + 1)))
                        acked_upto[k] = last
                now = time.perf_counter()
                if now - tick >= 0.005:
                    e.queue_tick()
                    tick = now
        elapsed = time.perf_counter() - t0
    finally:
        gc.enable()
    frames = sum(x[2].frames for x in subs)
    return {
        "items_per_s": stats.acked / elapsed,
        "items_per_frame": stats.acked / frames if frames else 0.0,
        "cycles": cycles,
        "prefetch": [x[1].prefetch for x in subs],
    }


def run_engine(args: argparse.Namespace) -> dict[str, Any]:
    total = 50_000 if args.quick else 200_000
    rows = []
    print(
        f"engine (sans-IO, one process): batches of {args.engine_batch:,} enqueued, cycles run, "
        f"one ACK per frame; {total:,} items per run, median of {args.repeats} runs",
        flush=True,
    )
    for consumers, prefetch in ((1, 64), (CONSUMERS, 64), (1, None), (CONSUMERS, None)):
        runs = [
            engine_case(consumers, prefetch, args.engine_batch, total if prefetch else total // 4)
            for _ in range(args.repeats)
        ]
        rates = [r["items_per_s"] for r in runs]
        row = {
            "consumers": consumers,
            "prefetch": prefetch or "auto",
            "items_per_s": statistics.median(rates),
            "min": min(rates),
            "max": max(rates),
            "items_per_frame": runs[-1]["items_per_frame"],
            "prefetch_end": runs[-1]["prefetch"],
        }
        rows.append(row)
        print(
            f"    {consumers} consumer{'s' if consumers > 1 else ' '} prefetch "
            f"{str(row['prefetch']):>4}: {row['items_per_s']:>9,.0f} items/s (runs "
            f"{row['min']:,.0f} .. {row['max']:,.0f}), {row['items_per_frame']:.1f} items a "
            f"frame, prefetch at the end {row['prefetch_end']}",
            flush=True,
        )
    main = rows[1]
    met = "MET" if main["items_per_s"] >= ENGINE_TARGET else "MISSED"
    print(f"    target >= {ENGINE_TARGET:,}/s (4 consumers, prefetch 64): {met}", flush=True)
    return {"rows": rows, "items_per_s": main["items_per_s"]}


# --------------------------------------------------------------------------- helpers


async def open_consumers(
    urls: list[str], prefetch: int | None, codel: bool
) -> tuple[list[Client], list[Consumer]]:
    clients = [Client(u) for u in urls]
    await asyncio.gather(*(c.connect() for c in clients))
    consumers = list(
        await asyncio.gather(
            *(
                c.consume(QUEUE, prefetch=prefetch, codel_target=0.020 if codel else None)
                for c in clients
            )
        )
    )
    return clients, consumers


async def close_consumers(clients: list[Client], consumers: list[Consumer]) -> None:
    async def one(client: Client, consumer: Consumer) -> None:
        try:
            await asyncio.wait_for(consumer.close(), 5)
        except Exception:  # noqa: BLE001 - the bench's figures are taken already
            pass
        try:
            await asyncio.wait_for(client.close(), 5)
        except Exception:  # noqa: BLE001
            pass

    await asyncio.gather(*(one(c, k) for c, k in zip(clients, consumers, strict=True)))


async def drain(server: Server, limit: float) -> tuple[dict[str, Any], float]:
    """Wait until nothing is waiting or outstanding (or ``limit`` s); the last stats."""
    t = time.monotonic()
    while True:
        s = await server.stats()
        q = s["queue"]
        if (q["waiting"] == 0 and q["outstanding"] == 0) or time.monotonic() - t > limit:
            return s, time.monotonic() - t
        await asyncio.sleep(0.05)


def lost_of(q: dict[str, Any]) -> int:
    return int(q["enqueued"] - q["acked"] - q["waiting"] - q["outstanding"])


# --------------------------------------------------------------------------- end to end


async def run_throughput(args: argparse.Namespace, pin: bool) -> dict[str, Any]:
    server = Server([], pin)
    clients: list[Client] = []
    consumers: list[Consumer] = []
    counter = Counter()
    tasks: list[asyncio.Task[None]] = []
    try:
        await server.start()
        url = f"http://127.0.0.1:{server.port}/rubris"
        clients, consumers = await open_consumers([url] * CONSUMERS, None, True)
        tasks = [asyncio.create_task(counter.run(c)) for c in consumers]
        await wait_quiet(args.quiet_wait)
        await http(server.port, "POST", f"/control/start?mode=backlog&depth={args.e2e_backlog}")
        await asyncio.sleep(args.e2e_warmup)
        windows = []
        for _ in range(args.repeats):
            s0 = await server.stats()
            c0, k0, t0 = load_cpu(), cpu_ticks(), time.monotonic()
            await asyncio.sleep(args.e2e_window)
            c1, k1, t1 = load_cpu(), cpu_ticks(), time.monotonic()
            s1 = await server.stats()
            wall = (s1["now_ns"] - s0["now_ns"]) / 1e9
            acked = s1["queue"]["acked"] - s0["queue"]["acked"]
            server_pct = (cpu_of(s1) - cpu_of(s0)) / wall * 100
            load_pct = (c1 - c0) / (t1 - t0) * 100
            frames = s1["cycle"]["frames"] - s0["cycle"]["frames"]
            delivered = s1["queue"]["delivered"] - s0["queue"]["delivered"]
            windows.append(
                {
                    "items_per_s": acked / wall,
                    "server_cpu_pct": server_pct,
                    "load_cpu_pct": load_pct,
                    "items_per_frame": delivered / frames if frames else 0.0,
                    "noise": noise(k0, k1, server_pct, load_pct),
                    "prefetch": [c["prefetch"] for c in s1["consumers"]],
                }
            )
        await http(server.port, "POST", "/control/stop")
        end, drain_s = await drain(server, args.drain)
    finally:
        for t in tasks:
            t.cancel()
        await close_consumers(clients, consumers)
        await server.stop()
    q = end["queue"]
    cstats = [c.stats for c in consumers]
    out = {
        "items_per_s": statistics.median(w["items_per_s"] for w in windows),
        "windows": windows,
        "lost": lost_of(q),
        "duplicates": counter.duplicates(),
        "queue": q,
        "codel_returned": sum(s.codel_returned for s in cstats),
        "revoked": q["revoked"],
        "drain_s": drain_s,
    }
    print(
        f"end to end: {CONSUMERS} Python clients (WebSocket, auto prefetch, CoDel both sides) "
        f"ACKing at once, {args.e2e_backlog:,} items kept waiting; {args.repeats} windows of "
        f"{args.e2e_window:g} s",
        flush=True,
    )
    for w in windows:
        print(
            f"    {w['items_per_s']:>9,.0f} items/s | {w['items_per_frame']:.1f} items a frame | "
            f"server {w['server_cpu_pct']:.0f}% CPU | load {w['load_cpu_pct']:.0f}% CPU | "
            f"prefetch {w['prefetch']}{w['noise']}",
            flush=True,
        )
    met = "MET" if out["items_per_s"] >= E2E_TARGET else "MISSED"
    print(
        f"    median {out['items_per_s']:,.0f} items/s (target >= {E2E_TARGET:,}: {met}) | "
        f"enqueued {q['enqueued']:,}, acked {q['acked']:,}, lost {out['lost']}, duplicates "
        f"{out['duplicates']}, client CoDel give-backs {out['codel_returned']}, server REVOKEs "
        f"{q['revoked']}, requeued {q['requeued']}, dead-lettered {q['dead_lettered']} "
        f"(drained in {drain_s:.1f} s)",
        flush=True,
    )
    return out


# --------------------------------------------------------------------------- the seed's scenario


def latency_ms(ledger: Ledger, first: int, end: int, until_ns: int) -> tuple[list[float], int]:
    """Latencies (ms, sorted) of the items with ids in [first, end) (enqueued in that order),
    each at its last completion, and how many were never completed. Those count too, with a
    lower bound: ``until_ns`` (when the drain gave up) minus the enqueue stamp of the next
    completed id (enqueued after them), so a queue that never drained cannot flatter p99."""
    lat = []
    missing = 0
    done, enqueued = ledger.done, ledger.enqueued
    later = until_ns
    for i in range(end - 1, first - 1, -1):
        d = done.get(i)
        if d is None:
            missing += 1
            lat.append(max(0.0, (until_ns - later) / 1e6))
        else:
            later = enqueued[i]
            lat.append((d - later) / 1e6)
    lat.sort()
    return lat, missing


def by_worker(ledger: Ledger, first: int, end: int, fast: bool) -> list[float]:
    """Latencies (ms, sorted) of the completed items in [first, end) whose last completion was
    by a fast consumer (``fast``) or by the slow one (consumer 0)."""
    done, enqueued, by = ledger.done, ledger.enqueued, ledger.by
    return sorted(
        (done[i] - enqueued[i]) / 1e6
        for i in range(first, end)
        if i in done and (by[i] != 0) == fast
    )


def median_prefetch(
    samples: list[list[Any]], session: str | None, a_ns: int, b_ns: int
) -> float | None:
    vals = [
        c["prefetch"]
        for t, cs in samples
        if a_ns <= t < b_ns
        for c in cs
        if c["session"] == session
    ]
    return statistics.median(vals) if vals else None


def max_prefetch(samples: list[list[Any]], session: str | None, a_ns: int, b_ns: int) -> int:
    return max(
        (
            c["prefetch"]
            for t, cs in samples
            if a_ns <= t < b_ns
            for c in cs
            if c["session"] == session
        ),
        default=0,
    )


async def run_seed(setup: Setup, args: argparse.Namespace, pin: bool) -> dict[str, Any]:
    server = Server([] if setup.codel else ["--no-codel"], pin)
    lines: list[DelayLine] = []
    clients: list[Client] = []
    consumers: list[Consumer] = []
    ledger = Ledger()
    workers = [Worker(i, args.work, ledger) for i in range(CONSUMERS)]
    tasks: list[asyncio.Task[None]] = []
    try:
        await server.start()
        lines = [DelayLine(server.port, args.delay) for _ in range(CONSUMERS)]
        ports = [await line.start() for line in lines]
        urls = [f"http://127.0.0.1:{p}/rubris" for p in ports]
        clients, consumers = await open_consumers(urls, setup.prefetch, setup.codel)
        sessions = [c.session_id for c in clients]
        await wait_quiet(args.quiet_wait)
        tasks = [asyncio.create_task(w.run(c)) for w, c in zip(workers, consumers, strict=True)]
        await http(server.port, "POST", f"/control/start?mode=backlog&depth={args.backlog}")
        t0 = time.monotonic()
        s0 = await server.stats()
        c0, k0 = load_cpu(), cpu_ticks()
        await asyncio.sleep(args.warmup / 2)
        t_half = time.monotonic()
        s_half = await server.stats()
        await asyncio.sleep(args.warmup / 2)
        t_slow = time.monotonic()
        workers[0].work = args.slow_work
        s_slow = await server.stats()
        await asyncio.sleep(args.slow)
        t_end = time.monotonic()
        c1, k1 = load_cpu(), cpu_ticks()
        s_end = await server.stats(samples=True)
        await http(server.port, "POST", "/control/stop")
        final, drain_s = await drain(server, args.drain)
        drained_ns = time.monotonic_ns()
        cstats = [c.stats for c in consumers]
    finally:
        for t in tasks:
            t.cancel()
        await close_consumers(clients, consumers)
        for line in lines:
            await line.close()
        await server.stop()

    q = final["queue"]
    wall = (s_end["now_ns"] - s0["now_ns"]) / 1e9
    server_pct = (cpu_of(s_end) - cpu_of(s0)) / wall * 100
    load_pct = (c1 - c0) / (t_end - t0) * 100
    before = (t_half, t_slow)
    after = (t_slow, t_end)
    util_before = [w.busy_within(*before) / (before[1] - before[0]) for w in workers]
    util_after = [w.busy_within(*after) / (after[1] - after[0]) for w in workers]
    # items by id (the producer numbers them in enqueue order): the second half of the warm-up,
    # and everything enqueued after the slowdown began
    id_half, id_slow, id_end = (x["producer"]["next_id"] for x in (s_half, s_slow, s_end))
    lat_before, _ = latency_ms(ledger, id_half, id_slow, drained_ns)
    lat_after, missing_after = latency_ms(ledger, id_slow, id_end, drained_ns)
    a_ns, s_ns, e_ns = (int(t * 1e9) for t in (t_half, t_slow, t_end))
    samples = s_end["samples"]
    acked_after = s_end["queue"]["acked"] - s_slow["queue"]["acked"]
    r = {
        "setup": setup.name,
        "prefetch": setup.prefetch,
        "codel": setup.codel,
        "util_before": util_before,
        "util_after": util_after,
        "util_before_mean": sum(util_before) / CONSUMERS,
        "util_after_mean": sum(util_after) / CONSUMERS,
        "p50_before_ms": pct_ms(lat_before, 0.5),
        "p99_before_ms": pct_ms(lat_before, 0.99),
        "p50_ms": pct_ms(lat_after, 0.5),
        "p99_ms": pct_ms(lat_after, 0.99),
        "p99_fast_ms": pct_ms(by_worker(ledger, id_slow, id_end, fast=True), 0.99),
        "p99_slow_ms": pct_ms(by_worker(ledger, id_slow, id_end, fast=False), 0.99),
        "max_ms": pct_ms(lat_after, 1.0),
        "latency_items": len(lat_after),
        "missing_after": missing_after,
        "acked_per_s_after": acked_after / (after[1] - after[0]),
        "slow_share_after": sum(1 for i in range(id_slow, id_end) if ledger.by.get(i) == 0)
        / max(1, len(lat_after)),
        "slow_estimator": next(
            (c for c in s_end["consumers"] if c["session"] == sessions[0]), None
        ),
        "work_ms": [w.mean_work_within(*before) * 1000 for w in workers],
        "slow_work_ms": workers[0].mean_work_within(*after) * 1000,
        "prefetch_after": [median_prefetch(samples, s, s_ns, e_ns) for s in sessions],
        "prefetch_max_after": [max_prefetch(samples, s, s_ns, e_ns) for s in sessions],
        "sessions": sessions,
        "items_after": [
            [ledger.done[i] - ledger.enqueued[i], ledger.by[i], ledger.attempt[i]]
            for i in range(id_slow, id_end)
            if i in ledger.done
        ],
        "t_slow_ns": s_ns,
        "samples": samples,
        "prefetch_before": [median_prefetch(samples, s, a_ns, s_ns) for s in sessions],
        "codel_returned": sum(s.codel_returned for s in cstats),
        "client_revoked": sum(s.revoked for s in cstats),
        "queue": q,
        "lost": lost_of(q),
        "completed_ids": len(ledger.count),
        "duplicates": ledger.duplicates,
        "items_twice": ledger.items_twice,
        "drain_s": drain_s,
        "server_cpu_pct": server_pct,
        "load_cpu_pct": load_pct,
        "noise": noise(k0, k1, server_pct, load_pct),
    }
    # the load's cross-check: ids enqueued, minus ids completed, minus what is still queued
    r["lost_by_ids"] = q["enqueued"] - r["completed_ids"] - q["waiting"] - q["outstanding"]
    describe_seed(r)
    return r


def pct_ms(sorted_ms: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values (nearest rank); nan when there are none."""
    if not sorted_ms:
        return math.nan
    return sorted_ms[min(len(sorted_ms) - 1, max(0, round(q * (len(sorted_ms) - 1))))]


def fmt_prefetch(v: list[float | None]) -> str:
    return "/".join("-" if x is None else f"{x:g}" for x in v)


def describe_seed(r: dict[str, Any]) -> None:
    q = r["queue"]
    print(
        f"    {r['setup']:<12} util before {r['util_before_mean']:.0%} after "
        f"{r['util_after_mean']:.0%} (per consumer, slow first: "
        f"{' '.join(f'{u:.0%}' for u in r['util_after'])}) | latency after p50 "
        f"{r['p50_ms']:.0f} p99 {r['p99_ms']:.0f} max {r['max_ms']:.0f} ms (before p50 "
        f"{r['p50_before_ms']:.0f} p99 {r['p99_before_ms']:.0f}) | {r['acked_per_s_after']:.0f} "
        f"acked/s after, {r['slow_share_after']:.1%} of them by the slow consumer"
        + (
            f", {r['missing_after']} never completed (counted at their wait so far)"
            if r["missing_after"]
            else ""
        ),
        flush=True,
    )
    est = r["slow_estimator"]
    slow = (
        f"slow consumer's estimate at the end: round trip {est['rtt_ms']} ms, processing "
        f"{est['processing_ms']} ms, prefetch {est['estimate']} (in force {est['prefetch']}"
        f"{', probing' if est['probing'] else ''}{', capped' if est['capped'] else ''})"
        if est
        else ""
    )
    print(
        f"                 prefetch before {fmt_prefetch(r['prefetch_before'])} after "
        f"{fmt_prefetch(r['prefetch_after'])} | work {r['work_ms'][1]:.2f} ms (slow "
        f"{r['slow_work_ms']:.1f} ms) | client CoDel give-backs {r['codel_returned']}, server "
        f"REVOKEs {q['revoked']} (dropped unstarted by the client {r['client_revoked']}), "
        f"requeued {q['requeued']}, dead-lettered {q['dead_lettered']} | enqueued "
        f"{q['enqueued']:,} acked {q['acked']:,} left {q['waiting'] + q['outstanding']} "
        f"(drain {r['drain_s']:.1f} s) lost {r['lost']} (by ids {r['lost_by_ids']}) | "
        f"duplicates {r['duplicates']} ({r['items_twice']} items) | server "
        f"{r['server_cpu_pct']:.0f}% CPU, load {r['load_cpu_pct']:.0f}% CPU{r['noise']}",
        flush=True,
    )
    if slow and r["prefetch"] is None:
        print(f"                 {slow}", flush=True)


def table(rows: list[dict[str, Any]]) -> None:
    print(
        "after the slowdown: utilisation = processing time / wall time (mean, then per consumer,"
        " the slow one first);\nlatency = enqueue to ack() (all items, then those the fast and"
        " the slow consumers did); prefetch = the server's,\nmedian per consumer (and the slow"
        " one's largest); CoDel = client give-backs, REVOKE = server take-backs"
    )
    head = (
        f"{'configuration':<13} {'util before':>11} {'util after':>10} {'per consumer':>15} "
        f"{'p50 ms':>6} {'p99 ms':>6} {'fast p99':>8} {'slow p99':>8} {'acked/s':>7} "
        f"{'prefetch (max)':>19} {'CoDel':>5} {'REVOKE':>6} {'lost':>4} {'dups':>4}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        per = " ".join(f"{u * 100:.0f}" for u in r["util_after"])
        prefetch = f"{fmt_prefetch(r['prefetch_after'])} ({r['prefetch_max_after'][0]})"
        print(
            f"{r['setup']:<13} {r['util_before_mean']:>11.1%} {r['util_after_mean']:>10.1%} "
            f"{per:>15} {r['p50_ms']:>6.0f} {r['p99_ms']:>6.0f} {r['p99_fast_ms']:>8.0f} "
            f"{r['p99_slow_ms']:>8.0f} {r['acked_per_s_after']:>7.0f} {prefetch:>19} "
            f"{r['codel_returned']:>5} {r['queue']['revoked']:>6} {r['lost']:>4} "
            f"{r['duplicates']:>4}{'  NOISY' if r['noise'] else ''}"
        )


def verdict(rows: dict[str, dict[str, Any]]) -> list[str]:
    codel, p51 = rows["auto+CoDel"], rows["prefetch 51"]
    ratio = codel["p99_ms"] / p51["p99_ms"]
    checks = [
        (
            f"auto+CoDel utilisation >= {UTIL_TARGET:.0%}",
            codel["util_after_mean"] >= UTIL_TARGET,
            f"{codel['util_after_mean']:.1%}",
        ),
        (
            "auto+CoDel p99 <= half of prefetch 51's",
            ratio <= 0.5,
            f"{codel['p99_ms']:.0f} / {p51['p99_ms']:.0f} ms = {ratio:.2f}",
        ),
        ("nothing lost", all(r["lost"] == 0 for r in rows.values()), "see lost"),
    ]
    return [f"{what}: {'met' if ok else 'MISSED'} ({fig})" for what, ok, fig in checks]


# --------------------------------------------------------------------------- main


async def amain(args: argparse.Namespace, pin: bool) -> dict[str, Any]:
    if args.skip_e2e:
        e2e: dict[str, Any] = {"items_per_s": 0.0, "lost": 0, "duplicates": 0}
    else:
        e2e = await run_throughput(args, pin)
    print(
        f"seed scenario: {CONSUMERS} consumers behind {args.delay * 1000:.0f} ms one-way delay "
        f"lines, {args.work * 1000:g} ms an item (asyncio.sleep); consumer 0 slows to "
        f"{args.slow_work * 1000:g} ms after {args.warmup:g} s, for {args.slow:g} s; backlog "
        f"of {args.backlog} items kept in the server queue",
        flush=True,
    )
    seed: dict[str, dict[str, Any]] = {}
    for setup in SETUPS:
        if args.setups and setup.name not in args.setups.split(","):
            continue
        seed[setup.name] = await run_seed(setup, args, pin)
    return {"e2e": e2e, "seed": seed}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="shorter phases")
    ap.add_argument("--repeats", type=int, default=None, help="engine runs / e2e windows")
    ap.add_argument("--engine-batch", type=int, default=1000, help="items enqueued at a time")
    ap.add_argument("--e2e-backlog", type=int, default=5000)
    ap.add_argument("--e2e-warmup", type=float, default=None)
    ap.add_argument("--e2e-window", type=float, default=None)
    ap.add_argument("--delay", type=float, default=0.050, help="one-way delay, seconds")
    ap.add_argument("--work", type=float, default=0.004, help="seconds of work an item")
    ap.add_argument("--slow-work", type=float, default=0.040, help="the slow consumer's")
    ap.add_argument("--backlog", type=int, default=20, help="items kept waiting (scenario)")
    ap.add_argument("--warmup", type=float, default=None, help="seconds before the slowdown")
    ap.add_argument("--slow", type=float, default=None, help="seconds after it")
    ap.add_argument("--drain", type=float, default=10.0, help="seconds allowed to drain")
    ap.add_argument("--quiet-wait", type=float, default=2.0)
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--skip-e2e", action="store_true", help="no end-to-end throughput run")
    ap.add_argument(
        "--setups", default="", help="comma-separated scenario configurations (default: all)"
    )
    ap.add_argument("--json", default="", help="write every figure (and the samples) here")
    args = ap.parse_args()
    defaults = {
        "repeats": (3, 3),
        "e2e_warmup": (1.0, 1.5),
        "e2e_window": (1.0, 2.0),
        "warmup": (3.0, 5.0),
        "slow": (5.0, 10.0),
    }
    quick_or_full(args, defaults)

    pin = prepare_load(
        f"queues: cores={os.cpu_count()} python={sys.version.split()[0]} server core "
        f"{SERVER_CORE}, load core {LOAD_CORE}{' (quick)' if args.quick else ''}"
    )
    started = time.monotonic()
    engine = {"items_per_s": 0.0} if args.skip_engine else run_engine(args)
    try:
        res = uvloop.run(amain(args, pin))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    e2e, seed = res["e2e"], res["seed"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"engine": engine, "e2e": e2e, "seed": seed}, f)
    print()
    table(list(seed.values()))
    ratio = math.nan
    if "auto+CoDel" in seed and "prefetch 51" in seed:
        print("targets: " + "; ".join(verdict(seed)), flush=True)
        ratio = seed["auto+CoDel"]["p99_ms"] / seed["prefetch 51"]["p99_ms"]
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)
    lost = e2e["lost"] + sum(r["lost"] for r in seed.values())
    dups = e2e["duplicates"] + sum(r["duplicates"] for r in seed.values())
    print(
        f"items_per_s={e2e['items_per_s']:.0f} engine_items_per_s={engine['items_per_s']:.0f} "
        f"codel_p99_vs_prefetch51={ratio:.3f} lost={lost} duplicates={dups}",
        flush=True,
    )


if __name__ == "__main__":
    main()

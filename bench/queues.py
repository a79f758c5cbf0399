"""Work-queue benchmark: throughput, and the seed's slow-consumer scenario (prefetch vs CoDel).

Not a test. Five parts (each can be skipped: ``--skip-engine``, ``--skip-e2e``,
``--skip-client-e2e``, ``--skip-seed``, ``--skip-disturbed``).

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

Client producer throughput (issue 26): the same, but the items come from a
``rubris_asgi.client.Client`` in this process (bench/_queues_producer.py) PUBLISHing to
``jobs`` (``client_publish=True``) over WebSocket on loopback, no delay line, on the same event
loop as the 4 consumers: ``Client.enqueue_many`` in runs of 256 (at most ``--window``, 256,
items in flight, each run returning when the server took or refused its items), at most
``--e2e-backlog`` items taken and not yet completed by the consumers. Figure: the server's
acked items per second, median of the windows (``items_per_s_client_producer``). Target:
>= 30,000 items/s. ``--e2e-prefetch N`` fixes the consumers' prefetch in this part and the end
to end one (default: the server's estimator). ``--profile`` prints a cProfile of the load
process over the windows (where the load core's time goes).

The seed's scenario (../shared/seeds/004: RabbitMQ's "prefetch and CoDel" note): 4 consumers,
each behind a ``DelayLine`` (tests/delaykit.py) that delays every byte 50 ms in each
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

The producer keeps a standing backlog of 20 waiting items (``--backlog``), so there is always
work for a consumer with free prefetch and the enqueue rate follows what the consumers take.
Who produces (``--producer``): by default a client producer for auto+CoDel (issue 26: a
``Client`` in this process, not behind a delay line, PUBLISHing over WebSocket: it asks the
server how many items wait, by the RPC ``waiting``, which counts every PUBLISH it sent before,
sends what is missing, waits until the server took them and asks again 1 ms later) and the
server's own producer for the other three (it tops the queue up every millisecond);
``--producer server`` / ``client`` use that one for every configuration. The client producer
stamps ``t`` itself, so its latency includes the loopback hop to the server. The backlog is
what makes utilisation mean what the seed means (are the consumers kept busy when there is
work?) instead of being bounded by an offered rate; and 20 items is a small queue (about
26 ms at the post-slowdown capacity of 3 x 250 + 25 = 775 items/s), so the latency is
dominated by where items wait inside the consumers, which is what differs between
configurations. A consumer that cannot keep up makes the server queue's
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
half of prefetch 51's, with nothing lost; with the client producer, its p99 after the slowdown
(``p99_after_slowdown_ms``) <= 150 ms.

The disturbed variant (issue 26): the scenario's 4 consumers behind the 50 ms delay lines, 4 ms
an item, the defaults (auto prefetch, CoDel on both sides), no slowdown; a client producer
offers a fixed 600 items/s (``--rate``) and the consumers' event loop is blocked 300 ms
(``--block``, ``time.sleep`` from a ``loop.call_at`` chain) every 3 s (``--block-every``),
the first block 1.5 s into the window. The delay lines and the producer run on an event loop of
their own in a thread of this process (``ProducerThread``: the network never stalls). The
producer runs on the consumers' loop, so the block stalls it too (one worker process that both
makes and does work, as a garbage collection or a blocking call stalls it): an item's latency
runs from when it was made. A third row, "auto, apart", runs the producer on the delay lines'
loop, so only the consumers stall. 15 s measured (``--dist-window``; ``--quick`` 9 s) after a 3 s
warm-up. Figures: latency (enqueue to ``ack()``, as in the scenario) of the items offered in
the window, p50/p99/max (``p99_disturbed_ms``: the auto row's p99), items/s acked against
offered, the server's prefetch and processing estimates per consumer in 1 s bins (from the
100 ms samples), CoDel give-backs, REVOKEs, duplicates, lost. A second row fixes the prefetch
at 26 (``--fixed``) for comparison. Target: p99 <= 250 ms (the first row). In the "apart" row
every consumer stalls at once while items keep coming, so an item offered in the first ~100 ms
of a block waits at least the rest of it plus the 50 ms to a consumer: that is ~3 % of the
items, above 1 %, so its p99 is above the block's length whatever the queue does.

Refusals (client producer runs): ``told`` = refusals the producer was told about
(``ItemRefused`` from ``enqueue``; with ``publish``, REJECTEDs counted in
``client.stats.rejected``); the server's count is the REJECTEDs its telemetry counted
(``Engine.telemetry.errors``, every code: QueueStats has no count of refused PUBLISHes, and
nothing else in these runs is refused), shown beside "offered - enqueued" (ids offered minus the
queue's ``enqueued``) as a cross-check. ``refused_untold`` = server's count - told, summed.

    python3 bench/queues.py            # full run, about 3 minutes
    python3 bench/queues.py --quick    # shorter phases, scenario: prefetch 51 and auto+CoDel
    python3 bench/queues.py --skip-engine --skip-e2e --setups auto,auto+CoDel --json out.json

Before the last line: the scenario's table, the disturbed table, the targets, and the earlier
figures as ``previous figures: items_per_s=N engine_items_per_s=N codel_p99_vs_prefetch51=R``.
The last line is
``p99_after_slowdown_ms=N p99_disturbed_ms=N items_per_s_client_producer=N doubles=N
refused_untold=N lost=N`` (integers; -1 for a part not run). ``doubles``: completions beyond an
item's first, by id, and ``lost``: enqueued - acked - waiting - outstanding by the server's
counters after the drain, both summed over every run (throughput, scenario, disturbed) in which
no consumer's connection was lost. Targets: doubles 0, refused_untold 0, lost 0.
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
from _queues_producer import RUN, ClientProducer, ProducerThread  # noqa: E402
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

from rubris_asgi.client import Client, Consumer  # noqa: E402
from rubris_asgi.engine.buffers import FrameBuffer  # noqa: E402
from rubris_asgi.engine.channels import Registry  # noqa: E402
from rubris_asgi.engine.engine import Engine  # noqa: E402
from rubris_asgi.engine.queues import QueueSettings, QueueSub  # noqa: E402
from rubris_asgi.engine.session import Session  # noqa: E402
from rubris_asgi.protocol import Ack  # noqa: E402

SERVER = os.path.join(HERE, "_queues_server.py")
SERVER_CORE = 0
LOAD_CORE = 1
QUEUE = "jobs"
CONSUMERS = 4
ENGINE_TARGET = 200_000
E2E_TARGET = 20_000
UTIL_TARGET = 0.90


CLIENT_E2E_TARGET = 30_000
P99_SLOWDOWN_TARGET = 150.0
P99_DISTURBED_TARGET = 250.0


@dataclass(frozen=True)
class Setup:
    """One configuration of the seed's scenario; ``client``: a client producer (else the
    server's own) by default."""

    name: str
    prefetch: int | None
    codel: bool
    client: bool = False


SETUPS = [
    Setup("prefetch 1", 1, False),
    Setup("prefetch 51", 51, False),
    Setup("auto", None, False),
    Setup("auto+CoDel", None, True, client=True),
]


def client_producer(setup: Setup, args: argparse.Namespace) -> bool:
    return args.producer == "client" or (args.producer == "default" and setup.client)


def consumers_died(clients: list[Client], consumers: list[Consumer]) -> bool:
    """Whether a consumer's connection was lost during the run (its items went back: the
    doubles and losses of such a run are not the queue's)."""
    return any(c.stats.reconnects or c.error is not None for c in clients) or any(
        k.stats.cleared for k in consumers
    )


def rejected_of(s: dict[str, Any]) -> int:
    """REJECTEDs the server sent (its telemetry), every code."""
    return int(sum(s.get("rejected", {}).values()))


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
    writing_since = 0.0  # FrameSink's: never a write in progress

    def __init__(self, engine: Engine, session: Session) -> None:
        self.engine = engine
        self.session = session
        self.frames = 0

    def write_now(self, frame: bytes) -> bool:
        self.frames += 1  # written at once, as a socket with room takes it
        return True

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


async def run_throughput(args: argparse.Namespace, pin: bool, client: bool) -> dict[str, Any]:
    """Items/s through 4 consumers ACKing at once; the items come from the server's own
    producer (a standing backlog) or, with ``client``, from a client producer in this process
    (PUBLISH over WebSocket, no delay line) keeping at most ``--e2e-backlog`` items taken and
    not yet completed."""
    server = Server([], pin)
    clients: list[Client] = []
    consumers: list[Consumer] = []
    counter = Counter()
    tasks: list[asyncio.Task[None]] = []
    producer: ClientProducer | None = None
    try:
        await server.start()
        url = f"http://127.0.0.1:{server.port}/rubris"
        clients, consumers = await open_consumers([url] * CONSUMERS, args.e2e_prefetch, True)
        tasks = [asyncio.create_task(counter.run(c)) for c in consumers]
        if client:
            producer = ClientProducer(url, QUEUE, args.window)
            await producer.connect()
        await wait_quiet(args.quiet_wait)
        if producer is not None:
            await http(server.port, "POST", "/control/start?mode=client")
            producer.start(producer.flood(args.e2e_backlog, lambda: counter.acked))
        else:
            await http(server.port, "POST", f"/control/start?mode=backlog&depth={args.e2e_backlog}")
        await asyncio.sleep(args.e2e_warmup)
        if args.profile and producer is not None:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
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
        if args.profile and producer is not None:
            import pstats

            prof.disable()
            print("    load process profile (cProfile, the windows above, top 25 by tottime):")
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
        if producer is not None:
            await producer.stop()
        await http(server.port, "POST", "/control/stop")
        end, drain_s = await drain(server, args.drain)
        await asyncio.sleep(0.2)  # the last REJECTEDs on their way to the producer
        end = await server.stats()
        died = consumers_died(clients, consumers)
    finally:
        for t in tasks:
            t.cancel()
        await close_consumers(clients, consumers)
        if producer is not None:
            await producer.close()
        await server.stop()
    q = end["queue"]
    cstats = [c.stats for c in consumers]
    out = {
        "producer": "client" if client else "server",
        "items_per_s": statistics.median(w["items_per_s"] for w in windows),
        "windows": windows,
        "lost": lost_of(q),
        "duplicates": counter.duplicates(),
        "died": died,
        "queue": q,
        "codel_returned": sum(s.codel_returned for s in cstats),
        "revoked": q["revoked"],
        "drain_s": drain_s,
        "rejected": rejected_of(end),
    }
    if producer is not None:
        out["client_producer"] = producer.info()
        out["told"] = producer.told
        # what the producer handed over and the server did not enqueue: refused (or lost)
        out["refused_by_count"] = producer.next_id - q["enqueued"]
    if client:
        assert producer is not None
        print(
            f"client producer: a Client in this process PUBLISHing to {QUEUE} over WebSocket "
            f"(enqueue_many() in runs of {RUN}, {args.window} in flight, "
            f"at most {args.e2e_backlog:,} items taken and not completed), {CONSUMERS} "
            f"consumers as below; {args.repeats} windows of {args.e2e_window:g} s",
            flush=True,
        )
    else:
        print(
            f"end to end: {CONSUMERS} Python clients (WebSocket, auto prefetch, CoDel both "
            f"sides) ACKing at once, {args.e2e_backlog:,} items kept waiting; {args.repeats} "
            f"windows of {args.e2e_window:g} s",
            flush=True,
        )
    for w in windows:
        print(
            f"    {w['items_per_s']:>9,.0f} items/s | {w['items_per_frame']:.1f} items a frame | "
            f"server {w['server_cpu_pct']:.0f}% CPU | load {w['load_cpu_pct']:.0f}% CPU | "
            f"prefetch {w['prefetch']}{w['noise']}",
            flush=True,
        )
    target = CLIENT_E2E_TARGET if client else E2E_TARGET
    met = "MET" if out["items_per_s"] >= target else "MISSED"
    refusals = (
        f" | refused: server {out['rejected']}, producer told {out['told']}, sent - enqueued "
        f"{out['refused_by_count']}, outcome unknown {out['client_producer']['unknown']}"
        f"{' | producer errors ' + str(producer.errors) if producer.errors else ''}"
        if producer is not None
        else ""
    )
    print(
        f"    median {out['items_per_s']:,.0f} items/s (target >= {target:,}: {met}) | "
        f"enqueued {q['enqueued']:,}, acked {q['acked']:,}, lost {out['lost']}, duplicates "
        f"{out['duplicates']}, client CoDel give-backs {out['codel_returned']}, server REVOKEs "
        f"{q['revoked']}, requeued {q['requeued']}, dead-lettered {q['dead_lettered']} "
        f"(drained in {drain_s:.1f} s){refusals}{' | A CONSUMER DIED' if died else ''}",
        flush=True,
    )
    return out


# --------------------------------------------------------------------------- the seed's scenario


def latency_ms(
    ledger: Ledger, first: int, end: int, until_ns: int, refused: set[int] | None = None
) -> tuple[list[float], int]:
    """Latencies (ms, sorted) of the items with ids in [first, end) (enqueued in that order),
    each at its last completion, and how many were never completed. Those count too, with a
    lower bound: ``until_ns`` (when the drain gave up) minus the enqueue stamp of the next
    completed id (enqueued after them), so a queue that never drained cannot flatter p99.
    Ids in ``refused`` (the server refused them: a client producer's) are left out."""
    lat = []
    missing = 0
    done, enqueued = ledger.done, ledger.enqueued
    later = until_ns
    refused = refused or set()
    for i in range(end - 1, first - 1, -1):
        if i in refused:
            continue
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
    producer: ClientProducer | None = None

    def next_id(s: dict[str, Any]) -> int:
        return producer.next_id if producer is not None else int(s["producer"]["next_id"])

    try:
        await server.start()
        lines = [DelayLine(server.port, args.delay) for _ in range(CONSUMERS)]
        ports = [await line.start() for line in lines]
        urls = [f"http://127.0.0.1:{p}/rubris" for p in ports]
        clients, consumers = await open_consumers(urls, setup.prefetch, setup.codel)
        sessions = [c.session_id for c in clients]
        if client_producer(setup, args):
            # the producer in this process, on this loop, straight to the server (no delay)
            producer = ClientProducer(f"http://127.0.0.1:{server.port}/rubris", QUEUE, args.window)
            await producer.connect()
        await wait_quiet(args.quiet_wait)
        tasks = [asyncio.create_task(w.run(c)) for w, c in zip(workers, consumers, strict=True)]
        if producer is not None:
            await http(server.port, "POST", "/control/start?mode=client")
            producer.start(producer.backlog(args.backlog))
        else:
            await http(server.port, "POST", f"/control/start?mode=backlog&depth={args.backlog}")
        t0 = time.monotonic()
        s0 = await server.stats()
        c0, k0 = load_cpu(), cpu_ticks()
        await asyncio.sleep(args.warmup / 2)
        t_half = time.monotonic()
        s_half = await server.stats()
        id_half = next_id(s_half)
        await asyncio.sleep(args.warmup / 2)
        t_slow = time.monotonic()
        workers[0].work = args.slow_work
        s_slow = await server.stats()
        id_slow = next_id(s_slow)
        await asyncio.sleep(args.slow)
        t_end = time.monotonic()
        c1, k1 = load_cpu(), cpu_ticks()
        s_end = await server.stats(samples=True)
        id_end = next_id(s_end)
        if producer is not None:
            await producer.stop()
            id_end = producer.next_id
        await http(server.port, "POST", "/control/stop")
        final, drain_s = await drain(server, args.drain)
        drained_ns = time.monotonic_ns()
        if producer is not None:
            await asyncio.sleep(0.2)  # the last REJECTEDs on their way to the producer
            final = await server.stats()
        cstats = [c.stats for c in consumers]
        died = consumers_died(clients, consumers)
    finally:
        for t in tasks:
            t.cancel()
        await close_consumers(clients, consumers)
        if producer is not None:
            await producer.close()
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
    # and everything enqueued after the slowdown began (refused ones left out)
    refused = producer.refused_ids if producer is not None else set()
    lat_before, _ = latency_ms(ledger, id_half, id_slow, drained_ns, refused)
    lat_after, missing_after = latency_ms(ledger, id_slow, id_end, drained_ns, refused)
    a_ns, s_ns, e_ns = (int(t * 1e9) for t in (t_half, t_slow, t_end))
    samples = s_end["samples"]
    acked_after = s_end["queue"]["acked"] - s_slow["queue"]["acked"]
    r = {
        "setup": setup.name,
        "producer": "client" if producer is not None else "server",
        "prefetch": setup.prefetch,
        "codel": setup.codel,
        "died": died,
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
    if producer is not None:
        add_refusals(r, producer, final)
    describe_seed(r)
    return r


def add_refusals(r: dict[str, Any], producer: ClientProducer, final: dict[str, Any]) -> None:
    """The client producer's refusals: told (ItemRefused, or REJECTED with publish) against
    the server's count of REJECTEDs sent (its telemetry; nothing else in these runs is
    refused) and against items offered minus items the queue counted as enqueued."""
    r["client_producer"] = producer.info()
    r["told"] = producer.told
    r["rejected"] = rejected_of(final)
    r["refused_by_count"] = producer.next_id - final["queue"]["enqueued"]


# --------------------------------------------------------------------------- disturbed


async def run_disturbed(
    name: str, prefetch: int | None, args: argparse.Namespace, pin: bool, shared: bool
) -> dict[str, Any]:
    """The scenario's consumers (delay lines, 4 ms items, CoDel on both sides), no slowdown,
    a client producer offering ``--rate`` items/s, and the consumers' event loop blocked
    ``--block`` s every ``--block-every`` s after the warm-up. The delay lines run on a loop of
    their own (a thread of this process: the network does not stall); the producer runs on the
    consumers' loop when ``shared`` (the block stalls it too: one worker process that makes and
    does work), else on the delay lines' loop (only the consumers stall)."""
    server = Server([], pin)
    outside = ProducerThread()
    lines: list[DelayLine] = []
    clients: list[Client] = []
    consumers: list[Consumer] = []
    ledger = Ledger()
    workers = [Worker(i, args.work, ledger) for i in range(CONSUMERS)]
    tasks: list[asyncio.Task[None]] = []
    producer: ClientProducer | None = None
    loop = asyncio.get_running_loop()
    blocks: list[tuple[float, float]] = []
    handle: asyncio.TimerHandle | None = None
    switch = sys.getswitchinterval()

    def block(k: int, first: float) -> None:
        nonlocal handle
        a = time.monotonic()
        time.sleep(args.block)  # the consumers' loop (and this process's GIL-free wait)
        blocks.append((a, time.monotonic()))
        handle = loop.call_at(first + (k + 1) * args.block_every, block, k + 1, first)

    async def make(url: str) -> ClientProducer:
        p = ClientProducer(url, QUEUE, args.window)
        await p.connect()
        return p

    async def start(p: ClientProducer) -> None:
        p.start(p.paced(args.rate))

    try:
        await server.start()
        lines = [DelayLine(server.port, args.delay) for _ in range(CONSUMERS)]
        ports = [await outside.run(line.start()) for line in lines]
        urls = [f"http://127.0.0.1:{p}/rubris" for p in ports]
        clients, consumers = await open_consumers(urls, prefetch, True)
        sessions = [c.session_id for c in clients]
        mount = f"http://127.0.0.1:{server.port}/rubris"
        producer = await (make(mount) if shared else outside.run(make(mount)))
        await wait_quiet(args.quiet_wait)
        tasks = [asyncio.create_task(w.run(c)) for w, c in zip(workers, consumers, strict=True)]
        sys.setswitchinterval(0.001)  # two threads on one core: hand the GIL over promptly
        await http(server.port, "POST", "/control/start?mode=client")
        await (start(producer) if shared else outside.run(start(producer)))
        await asyncio.sleep(args.dist_warmup)
        t_warm = time.monotonic()
        s_warm = await server.stats()
        id_warm = producer.next_id
        c0, k0 = load_cpu(), cpu_ticks()
        first = loop.time() + args.block_every / 2
        handle = loop.call_at(first, block, 0, first)
        await asyncio.sleep(args.dist_window)
        handle.cancel()
        t_end = time.monotonic()
        c1, k1 = load_cpu(), cpu_ticks()
        s_end = await server.stats(samples=True)
        id_end = producer.next_id
        await (producer.stop() if shared else outside.run(producer.stop()))
        await http(server.port, "POST", "/control/stop")
        final, drain_s = await drain(server, args.drain)
        drained_ns = time.monotonic_ns()
        await asyncio.sleep(0.2)  # the last REJECTEDs on their way to the producer
        final = await server.stats()
        cstats = [c.stats for c in consumers]
        died = consumers_died(clients, consumers)
    finally:
        if handle is not None:
            handle.cancel()
        sys.setswitchinterval(switch)
        for t in tasks:
            t.cancel()
        await close_consumers(clients, consumers)
        if producer is not None:
            await (producer.close() if shared else outside.run(producer.close()))
        for line in lines:
            await outside.run(line.close())
        outside.close()
        await server.stop()

    q = final["queue"]
    wall = (s_end["now_ns"] - s_warm["now_ns"]) / 1e9
    server_pct = (cpu_of(s_end) - cpu_of(s_warm)) / wall * 100
    load_pct = (c1 - c0) / (t_end - t_warm) * 100
    lat, missing = latency_ms(ledger, id_warm, id_end, drained_ns, producer.refused_ids)
    w_ns, e_ns = int(t_warm * 1e9), int(t_end * 1e9)
    samples = s_end["samples"]
    r: dict[str, Any] = {
        "setup": name,
        "prefetch": prefetch,
        "died": died,
        "p50_ms": pct_ms(lat, 0.5),
        "p99_ms": pct_ms(lat, 0.99),
        "max_ms": pct_ms(lat, 1.0),
        "latency_items": len(lat),
        "missing": missing,
        "offered_per_s": (id_end - id_warm) / (t_end - t_warm),
        "acked_per_s": (s_end["queue"]["acked"] - s_warm["queue"]["acked"]) / wall,
        "blocks": [[a - t_warm, b - a] for a, b in blocks],
        "over_time": over_time(samples, sessions, w_ns, e_ns, 1.0),
        "prefetch_median": [median_prefetch(samples, s, w_ns, e_ns) for s in sessions],
        "prefetch_max": [max_prefetch(samples, s, w_ns, e_ns) for s in sessions],
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
        "samples": samples,
    }
    r["lost_by_ids"] = q["enqueued"] - r["completed_ids"] - q["waiting"] - q["outstanding"]
    add_refusals(r, producer, final)
    describe_disturbed(r, args)
    return r


def over_time(
    samples: list[list[Any]], sessions: list[str | None], a_ns: int, b_ns: int, step: float
) -> list[dict[str, Any]]:
    """The server's samples in ``step`` s bins from ``a_ns``: per consumer the median prefetch
    in force and processing time (ms) estimated, and the largest round trip."""
    out = []
    step_ns = int(step * 1e9)
    for k in range(max(1, round((b_ns - a_ns) / step_ns))):
        lo, hi = a_ns + k * step_ns, min(b_ns, a_ns + (k + 1) * step_ns)
        rows: dict[str, list[Any]] = {"prefetch": [], "processing_ms": [], "rtt_ms": []}
        for s in sessions:
            cs = [c for t, cc in samples if lo <= t < hi for c in cc if c["session"] == s]
            rows["prefetch"].append(statistics.median(c["prefetch"] for c in cs) if cs else None)
            rows["processing_ms"].append(
                statistics.median(c["processing_ms"] for c in cs) if cs else None
            )
            rtts = [c["rtt_ms"] for c in cs if c["rtt_ms"] is not None]
            rows["rtt_ms"].append(max(rtts) if rtts else None)
        out.append({"t": k * step, **rows})
    return out


def describe_disturbed(r: dict[str, Any], args: argparse.Namespace) -> None:
    q = r["queue"]
    missing = f", {r['missing']} never completed" if r["missing"] else ""
    print(
        f"    {r['setup']:<12} latency p50 {r['p50_ms']:.0f} p99 {r['p99_ms']:.0f} max "
        f"{r['max_ms']:.0f} ms ({r['latency_items']:,} items{missing}) | "
        f"{r['acked_per_s']:.0f} acked/s of {r['offered_per_s']:.0f} offered | blocks at "
        + ", ".join(f"{a:.1f}s ({d * 1000:.0f} ms)" for a, d in r["blocks"])
        + f" | client CoDel give-backs {r['codel_returned']}, server REVOKEs {q['revoked']} "
        f"(dropped unstarted {r['client_revoked']}), requeued {q['requeued']} | lost "
        f"{r['lost']} (by ids {r['lost_by_ids']}) | duplicates {r['duplicates']} "
        f"({r['items_twice']} items) | producer late by up to "
        f"{r['client_producer']['max_late_ms']:.0f} ms | refused: server {r['rejected']}, told "
        f"{r['told']}, offered - enqueued {r['refused_by_count']} | server "
        f"{r['server_cpu_pct']:.0f}% CPU, load {r['load_cpu_pct']:.0f}% CPU{r['noise']}"
        + (" | A CONSUMER'S CONNECTION WAS LOST" if r["died"] else ""),
        flush=True,
    )
    rows = r["over_time"]

    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:g}" if isinstance(v, int) else f"{v:.3g}"

    for key, label in (("prefetch", "prefetch"), ("processing_ms", "processing ms")):
        for k in range(CONSUMERS):
            vals = " ".join(f"{fmt(b[key][k]):>5}" for b in rows)
            print(f"        {label:<13} c{k} (1 s bins): {vals}", flush=True)
    rtt = " ".join(
        f"{fmt(max((x for x in b['rtt_ms'] if x is not None), default=None)):>5}" for b in rows
    )
    print(f"        {'round trip ms':<13} max (1 s bins): {rtt}", flush=True)


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
    if r["producer"] == "client":
        cp = r["client_producer"]
        print(
            f"                 client producer ({cp['api']}()): {cp['next_id']:,} offered, "
            f"refused: server {r['rejected']}, producer told {r['told']}, offered - enqueued "
            f"{r['refused_by_count']}, outcome unknown {cp['unknown']}"
            + (f", errors {cp['errors']}" if cp["errors"] else ""),
            flush=True,
        )
    if r["died"]:
        print("                 A CONSUMER'S CONNECTION WAS LOST: not counted in doubles/lost")


def table(rows: list[dict[str, Any]]) -> None:
    print(
        "after the slowdown: utilisation = processing time / wall time (mean, then per consumer,"
        " the slow one first);\nlatency = enqueue to ack() (all items, then those the fast and"
        " the slow consumers did); prefetch = the server's,\nmedian per consumer (and the slow"
        " one's largest); CoDel = client give-backs, REVOKE = server take-backs"
    )
    head = (
        f"{'configuration':<13} {'producer':>8} {'util before':>11} {'util after':>10} "
        f"{'per consumer':>15} "
        f"{'p50 ms':>6} {'p99 ms':>6} {'fast p99':>8} {'slow p99':>8} {'acked/s':>7} "
        f"{'prefetch (max)':>19} {'CoDel':>5} {'REVOKE':>6} {'lost':>4} {'dups':>4}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        per = " ".join(f"{u * 100:.0f}" for u in r["util_after"])
        prefetch = f"{fmt_prefetch(r['prefetch_after'])} ({r['prefetch_max_after'][0]})"
        print(
            f"{r['setup']:<13} {r['producer']:>8} {r['util_before_mean']:>11.1%} "
            f"{r['util_after_mean']:>10.1%} "
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
    none: dict[str, Any] = {"items_per_s": 0.0, "lost": 0, "duplicates": 0, "died": False}
    e2e = none if args.skip_e2e else await run_throughput(args, pin, client=False)
    client_e2e = (
        dict(none) if args.skip_client_e2e else await run_throughput(args, pin, client=True)
    )
    seed: dict[str, dict[str, Any]] = {}
    disturbed: dict[str, dict[str, Any]] = {}
    if not args.skip_seed:
        seed = await run_seeds(args, pin)
    if not args.skip_disturbed:
        print(
            f"disturbed: {CONSUMERS} consumers behind {args.delay * 1000:.0f} ms one-way delay "
            f"lines, {args.work * 1000:g} ms an item, CoDel both sides, no slowdown; a client "
            f"producer offers {args.rate:g} items/s; the consumers' loop blocked "
            f"{args.block * 1000:.0f} ms every {args.block_every:g} s; {args.dist_window:g} s "
            f"measured after {args.dist_warmup:g} s",
            flush=True,
        )
        for name, prefetch, shared in (
            ("auto", None, True),
            (f"prefetch {args.fixed}", args.fixed, True),
            ("auto, apart", None, False),
        ):
            disturbed[name] = await run_disturbed(name, prefetch, args, pin, shared)
    return {"e2e": e2e, "client_e2e": client_e2e, "seed": seed, "disturbed": disturbed}


async def run_seeds(args: argparse.Namespace, pin: bool) -> dict[str, dict[str, Any]]:
    print(
        f"seed scenario: {CONSUMERS} consumers behind {args.delay * 1000:.0f} ms one-way delay "
        f"lines, {args.work * 1000:g} ms an item (asyncio.sleep); consumer 0 slows to "
        f"{args.slow_work * 1000:g} ms after {args.warmup:g} s, for {args.slow:g} s; backlog "
        f"of {args.backlog} items kept in the server queue",
        flush=True,
    )
    seed: dict[str, dict[str, Any]] = {}
    # --quick: the two configurations the last lines need, unless --setups names others
    chosen = args.setups or ("prefetch 51,auto+CoDel" if args.quick else "")
    for setup in SETUPS:
        if chosen and setup.name not in chosen.split(","):
            continue
        seed[setup.name] = await run_seed(setup, args, pin)
    return seed


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
    ap.add_argument(
        "--e2e-prefetch",
        type=int,
        default=None,
        help="end to end and client producer: the consumers' fixed prefetch (default: auto)",
    )
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
        "--skip-client-e2e", action="store_true", help="no client producer throughput run"
    )
    ap.add_argument("--skip-seed", action="store_true", help="no seed scenario")
    ap.add_argument("--skip-disturbed", action="store_true", help="no disturbed variant")
    ap.add_argument(
        "--producer",
        choices=["default", "server", "client"],
        default="default",
        help="the scenario's producer: default = a client for auto+CoDel, the server's for "
        "the others; server / client = that one for every configuration",
    )
    ap.add_argument("--window", type=int, default=256, help="client enqueues in flight")
    ap.add_argument("--rate", type=float, default=600.0, help="disturbed: items/s offered")
    ap.add_argument("--block", type=float, default=0.3, help="disturbed: loop blocked, s")
    ap.add_argument("--block-every", type=float, default=3.0, help="disturbed: period, s")
    ap.add_argument("--fixed", type=int, default=26, help="disturbed: the fixed prefetch row")
    ap.add_argument("--dist-warmup", type=float, default=3.0)
    ap.add_argument("--dist-window", type=float, default=None, help="disturbed: measured, s")
    ap.add_argument(
        "--profile", action="store_true", help="cProfile the load in the client producer run"
    )
    ap.add_argument(
        "--setups",
        default="",
        help="comma-separated scenario configurations (default: all; --quick: prefetch 51 "
        "and auto+CoDel)",
    )
    ap.add_argument("--json", default="", help="write every figure (and the samples) here")
    args = ap.parse_args()
    defaults = {
        "repeats": (3, 3),
        "e2e_warmup": (1.0, 1.5),
        "e2e_window": (1.0, 2.0),
        "warmup": (3.0, 5.0),
        "slow": (5.0, 10.0),
        "dist_window": (9.0, 15.0),
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
    e2e, client_e2e, seed, disturbed = (
        res["e2e"],
        res["client_e2e"],
        res["seed"],
        res["disturbed"],
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "engine": engine,
                    "e2e": e2e,
                    "client_e2e": client_e2e,
                    "seed": seed,
                    "disturbed": disturbed,
                },
                f,
            )
    print()
    if seed:
        table(list(seed.values()))
    if disturbed:
        disturbed_table(list(disturbed.values()))
    ratio = math.nan
    if "auto+CoDel" in seed and "prefetch 51" in seed:
        print("targets: " + "; ".join(verdict(seed)), flush=True)
        ratio = seed["auto+CoDel"]["p99_ms"] / seed["prefetch 51"]["p99_ms"]
    runs = [e2e, client_e2e, *seed.values(), *disturbed.values()]
    kept = [r for r in runs if not r["died"]]
    lost = sum(r["lost"] for r in kept)
    dups = sum(r["duplicates"] for r in kept)
    told = [r for r in runs if "told" in r]
    untold = sum(r["rejected"] - r["told"] for r in told)
    p99_slow = seed["auto+CoDel"]["p99_ms"] if "auto+CoDel" in seed else math.nan
    p99_dist = disturbed["auto"]["p99_ms"] if "auto" in disturbed else math.nan
    checks = [
        (
            f"auto+CoDel p99 after the slowdown <= {P99_SLOWDOWN_TARGET:.0f} ms",
            p99_slow,
            p99_slow <= P99_SLOWDOWN_TARGET,
        ),
        (
            f"disturbed p99 <= {P99_DISTURBED_TARGET:.0f} ms",
            p99_dist,
            p99_dist <= P99_DISTURBED_TARGET,
        ),
        (
            f"client producer >= {CLIENT_E2E_TARGET:,} items/s",
            client_e2e["items_per_s"],
            client_e2e["items_per_s"] >= CLIENT_E2E_TARGET,
        ),
        ("doubles 0", dups, dups == 0),
        ("refused_untold 0", untold, untold == 0),
        ("lost 0", lost, lost == 0),
    ]
    print(
        "targets (issue 26): "
        + "; ".join(
            f"{what}: not run"
            if isinstance(v, float) and math.isnan(v)
            else f"{what}: {'met' if ok else 'MISSED'} ({v:,.0f})"
            for what, v, ok in checks
        ),
        flush=True,
    )
    if any(r["died"] for r in runs):
        print(
            "a consumer's connection was lost in: "
            + ", ".join(str(r.get("setup", r.get("producer", "e2e"))) for r in runs if r["died"])
        )
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)
    print(
        f"previous figures: items_per_s={e2e['items_per_s']:.0f} "
        f"engine_items_per_s={engine['items_per_s']:.0f} codel_p99_vs_prefetch51={ratio:.3f}",
        flush=True,
    )

    def n(v: float) -> int:
        return -1 if math.isnan(v) else round(v)

    print(
        f"p99_after_slowdown_ms={n(p99_slow)} p99_disturbed_ms={n(p99_dist)} "
        f"items_per_s_client_producer={n(client_e2e['items_per_s'])} doubles={dups} "
        f"refused_untold={untold} lost={lost}",
        flush=True,
    )


def disturbed_table(rows: list[dict[str, Any]]) -> None:
    print(
        "disturbed (no slowdown, the consumers' loop blocked): latency = enqueue to ack() of "
        "the items offered in the window; prefetch = the server's, median (largest) per consumer"
    )
    head = (
        f"{'configuration':<13} {'p50 ms':>6} {'p99 ms':>6} {'max ms':>6} {'acked/s':>7} "
        f"{'offered/s':>9} {'prefetch median':>16} {'(max)':>16} {'CoDel':>5} {'REVOKE':>6} "
        f"{'lost':>4} {'dups':>4}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['setup']:<13} {r['p50_ms']:>6.0f} {r['p99_ms']:>6.0f} {r['max_ms']:>6.0f} "
            f"{r['acked_per_s']:>7.0f} {r['offered_per_s']:>9.0f} "
            f"{fmt_prefetch(r['prefetch_median']):>16} "
            f"{'/'.join(str(x) for x in r['prefetch_max']):>16} {r['codel_returned']:>5} "
            f"{r['queue']['revoked']:>6} {r['lost']:>4} {r['duplicates']:>4}"
            f"{'  NOISY' if r['noise'] else ''}"
        )


if __name__ == "__main__":
    main()

"""Scale-out benchmark: one node alone, one node through Redis, two nodes through Redis,
sessions carried by another node; then sessions moved under load, and topics spread over the
masters of a Redis Cluster.

Not a test. bench/fanout.py's method (real sockets on 127.0.0.1, the clients in this process,
publish-to-receive latency from a CLOCK_MONOTONIC stamp in each payload, cross-client skew,
GAPs, noisy-window detection) on four configurations side by side. Each configuration has
its own fresh server processes (bench/_scaleout_server.py: bench/_fanout_server.py's
Starlette app with Rubris at /rubris, on uvicorn; one process is one node):

    local    one node, no broker: bench/fanout.py's server
    redis1   the same node with ``RUBRIS_REDIS_URL`` set: every publish of its publisher goes
             to Redis (the broker's outbox, one Lua script per batch of up to 256) and comes
             back through pub/sub before it reaches a client
    redis2   two nodes (two processes on two ports, both with ``RUBRIS_REDIS_URL``), 1,000
             clients on each; the publisher runs in node A only, so node B hears everything
             through Redis. Two processes rather than ``rubris_asgi.serve(workers=2)`` (how
             users run it): the bench splits the clients exactly and reads each node's own CPU
    carried  two nodes as redis2, but every client opened its session on node A and was then
             moved to node B (bench/_scaleout_moves.py: dropped, resumed through B), which
             carries its frames to and from A through Redis (rubris_asgi/server/relay/): what
             a node's clients cost after a balancer sent them elsewhere

Each Redis configuration has its own ``redis-server`` (``tests.rediskit.RedisServer``: a free
port, no persistence): all three configurations are up at once (below), and Redis's pub/sub
channels are server-wide, so one shared server would hand redis1's publishes to redis2's nodes.

Every client subscribes to all 10 ring topics ``bench.0`` .. ``bench.9``: 2,000 clients are
20,000 subscriptions, and one *round* (one message to each topic, 10 publishes) is 20,000
deliveries. Payloads are fanout.py's (~80-byte orjson, not compressed). Two phases:

    fixed   open loop at ``--rate`` deliveries/s (default 100,000 = 5 rounds/s, fanout.py's
            latency rate), each round published at once and stamped with its scheduled time.
            The issue asks for a rate one node serves with p99 < 50 ms; at 2,000 clients there
            is none for whole rounds: a round is 2,000 frames, which one node takes ~40-50 ms
            to write (the skew p50) whatever the rate, and the load core as long to read, so
            the p99 is ~60-70 ms from 2 to 10 rounds/s (measured: 40,000/s 65 ms, 100,000/s
            64 ms, 200,000/s 70 ms). ``--spread`` publishes one message at a time, evenly
            (each a frame of its own): p99 ~43 ms at 20,000/s on a quiet machine, but at ~7x
            the CPU per delivery (15 against 2 CPU-s per million), and 200,000/s then
            saturates the node. 100,000/s leaves the node at ~20 % and the load at ~30 %,
            room for redis2's two nodes
    max     closed loop driven by the load: rounds are published (``POST /control/rounds`` on
            node A, one kept-alive connection) while fewer than ``--window`` (8) rounds'
            deliveries are on their way to the clients of *all* nodes: the slowest node, the
            trip through Redis and the load all hold it back (a closed loop inside node A
            would not see node B fall behind), and the broker's outbox never holds more than
            80 publishes, far from its 10,000 (a refused publish would be counted, not raised)

The fixed phase's window spans whole publishing intervals, from and to the same point of one
(when the last round is framed and read): cut at random, a 5 s window would hold 25 or 26
rounds, +-4 % on the CPU per delivery, the very figure compared.

**The machine drifts** (it is shared: the same window measured twice differs by up to 15 %),
and the overhead sought is a few percent. So every configuration is started first (6,000
clients in all; the idle ones cost nothing measurable), then each phase measures ``--repeat``
(3) windows of each configuration in turn (after one unmeasured window each: a fresh node's
first costs it more), the order turned by one each time, and each headline ratio is the
median over the repetitions of the ratio of two windows measured seconds apart. A window in
which other processes used a core is NOISY and measured again (``--noisy-retries``, within
``--budget``); before each, the run waits (up to ``--quiet-wait`` s) for both cores to idle.
Even so ``redis_cpu_overhead_pct`` moves by about +-10 points from run to run (quiet runs of
the same code: -7.7, -5.2, -0.4, +9.0; its windows: one node's CPU per delivery differs by up
to 15 % between two windows a minute apart): a figure within that says "not measurable here".
``two_workers_vs_one`` is steadier (1.87 to 2.09 in the same runs).

Figures per configuration and phase (the table shows the median window): delivered/s (counted
by the clients), latency and skew p50/p99, the nodes' CPU (getrusage in each, over its own
window) per million deliveries and deliveries per server CPU-second, each node's deliveries
per CPU-second of its own process, Redis's CPU (on-CPU time of all its threads from
/proc/<pid>/task/*/schedstat: nanoseconds, where /proc/<pid>/stat's utime+stime counts 10 ms
ticks) per publish (a publish: one message to one topic) and per million deliveries, also net
of its idle CPU (measured for a second with the nodes connected), load CPU %, messages per
frame, user/system split, GC, and the bottleneck.

**Cores** (2 on this machine, shared between the servers and the load):

    local, redis1        the node on core 0; the load (this process) and redis-server on core 1
    redis2 (default)     both nodes on core 0, time-sharing it; the load and redis-server on
                         core 1: the nodes have exactly the core the single node had, so the
                         configurations compare like for like, and redis2's measured maximum
                         is one core's serving, less what splitting costs
    redis2 --split       node A on core 0, node B on core 1 with the load and redis-server: B
                         competes with the load, which near the maximum needs its whole core,
                         so the raw maximum drops (measured 0.76x local's) and says little

In every ``max`` phase the load's core is the limit (load ~95-100 %, the node(s) ~60-80 %):
one load process reads ~350,000-450,000 deliveries/s at most, so the measured maxima are the
load's as much as the servers', and no configuration here can show two cores' worth of serving.

Then **settle** (``--no-settle`` skips it, about 15 s): its own Redis and two nodes, 1,000
clients of node A under a steady load of 50,000 deliveries/s, all moved to node B at once; the
seconds until every client has read a message at most 100 ms old again.

Then **shards** (``--no-shards`` skips it, about a minute; ``--quick`` 30-40 s): what Redis's CPU
buys when the topics are spread over the masters of a Redis Cluster (RedisClusterBroker, chosen by a
``redis+cluster://`` ``RUBRIS_REDIS_URL``). Two clusters (tests/clusterkit.py, no persistence), one
of 1 master and one of 2, up at once, each with its own two nodes (bench/_scaleout_server.py's,
``--no-batches``: a cluster does not keep them yet) and 100
clients: 1,000 ring topics (ring 64; 15 or 16 in each of the 64 partitions), each node publishing
half the rate one message at a time, topic after topic (``spread``), every topic followed by one
client of one node (node A's clients the first 500, node B's the rest: half of each node's publishes
reach the other through Redis). Each window drives both clusters at once, alternately (``--repeat``
of each, the order turned each time):

    scaled  the 1 master at ``--shards-rate`` (800) publishes/s, the 2 masters at twice it:
            every master numbers the same rate. Its ratio is the headline
    equal   both at 800/s: each of the 2 masters numbers half what the 1 does

Per master, over the window: its CPU (every thread, schedstat), the publishes it numbered (its
``SPUBLISH`` calls in ``INFO commandstats``: one per publish the script numbers; its share of the
topics by their partitions is printed beside it), its script calls and their time; per configuration
the p50/p99 from publish to delivery, the nodes' CPU and their broker's refused publishes, outages
and catch-ups. Why both at once rather than one after the other, and why ``scaled`` for the
headline: at these rates (about a script call per publish) a master's CPU per publish depends on how
busy it and its core are (measured, one master: 36 us at 2,000/s, 48 us at 1,000/s; 42 to 68 us at
1,500/s minutes apart), so each master is measured at the same moment, on the same core, as the one
it is compared with, and at the same rate: publishes per CPU-second is a capacity, compared where
each master works alike. At the same total rate each of the 2 masters has half the work, and a Redis
this far from busy spends more on each call when it has fewer (``equal``, printed beside it: 1.8-2.0
where ``scaled`` gives 2.2). Above 2 means no measurable cost of sharding per publish, not more than
twice: at the same rate each of the 2 masters spends a little less per publish than the 1 (44
against 48 us), not for holding half the topics (1,000 or 500 on one master cost the same, measured)
but, it seems, for sharing core 1 with its twin, whose calls come from the same nodes at the same
moments (with the twin moved to core 0 the gap fell from ~9 % to ~4 %). The first window is not
measured and lasts until the nodes' first check of every followed topic's position (5 s after they
start, then every 60 s: the topics' live messages wait meanwhile for their history to be read) is
behind them. Cores: the 4 nodes on core 0 (about 75 % of it in the ``scaled`` windows), the 3
masters (every thread) and the load on core 1.

The headline figures:

    redis_cpu_overhead_pct  redis1's server CPU per delivery / local's, - 1, in %, at the fixed
                            rate (Redis's own CPU not included; printed beside it with it, and
                            at max). The broker's cost on a node is per publish (the relay, the
                            script call, above all hearing each message back through redis-py's
                            pub/sub), so the share depends on subscribers per publish: here
                            every publish reaches 2,000 of them
    two_workers_vs_one      (node A's deliveries per CPU-second of its own process + node B's)
                            in redis2's max phase / local's in its max phase: what two nodes
                            would serve with a core each, over one node's maximum. It leaves
                            out the cores the load and Redis would need, and that a node with a
                            core to itself would not be time-shared (the nodes here switch on
                            one core, which if anything costs them). The raw measured max
                            delivered/s of redis2 over local's is printed beside it

    carried_vs_local_per_cpu
                            carried's deliveries per CPU-second of both nodes (the home that
                            builds the frames, the entry that writes them) over local's, at the
                            fixed rate, paired window by window (target >= 0.5)
    settle_1000_s           the settle run's figure (target <= 5)
    queue_redis_vs_local    bench/queues_redis.py's figure, from its run here (``--no-queues``
                            skips it): work-queue items/s end to end with the queue in Redis
                            over the same node's alone, alternated (target >= 0.8)
    redis_shards_2_vs_1     the shards run: publishes per Redis CPU-second, each master's own
                            added, of the 2 masters over the 1 master's, in its ``scaled``
                            windows (each of the 3 masters numbering the same rate, the p99s
                            printed to show they are the same), the median over the windows
                            (target >= 1.8)
    max_shard_share         the shards run: the larger of the 2 masters' shares of the
                            publishes in those windows, the median (target <= 0.6)

    python3 bench/scaleout.py            # about 6 minutes (at most ~8)
    python3 bench/scaleout.py --quick    # 2 windows each, shorter: about a minute and a half
    python3 bench/scaleout.py --configs local,redis1 --phases fixed --rate 40000

The last lines are one JSON object with every window's figures, then
``redis_cpu_overhead_pct=X two_workers_vs_one=R carried_vs_local_per_cpu=C settle_1000_s=S
queue_redis_vs_local=Q redis_shards_2_vs_1=H max_shard_share=M`` (``nan`` for a run skipped).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import glob
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvloop
from redis.asyncio import Redis as AsyncRedis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from _fanout_load import (  # noqa: E402
    Client,
    Recorder,
    close_clients,
    open_client,
    open_clients,
    pinger,
)
from _scaleout_moves import move, settled  # noqa: E402
from fanout import (  # noqa: E402
    LOAD_CORE,
    LOAD_GC,
    NOISY_PCT,
    SERVER_CORE,
    Server,
    core_usage,
    cpu_ticks,
    drain,
    fmt,
    http,
    load_cpu,
    ms,
    noisy,
    pct,
    prepare_load,
    quick_or_full,
    wait_quiet,
)
from queues_redis import measure as measure_queues  # noqa: E402
from queues_redis import parser as queues_parser  # noqa: E402

from rubris_asgi.cluster.redis.shards.partitions import (  # noqa: E402
    PARTITIONS,
    partition_of,
    slot_of_partition,
)
from rubris_asgi.server.runtime import BROKER_SWEEP  # noqa: E402
from tests.clusterkit import HOST, RedisCluster  # noqa: E402
from tests.rediskit import RedisServer  # noqa: E402

NODE = os.path.join(HERE, "_scaleout_server.py")
CLIENTS = 2000
TOPICS = 10
RATE = 100_000
"""The fixed phase's deliveries/s: 5 rounds/s of 2,000 x 10."""
ALIGN = 0.75
"""Where in a publishing interval (0: a publish is due) the fixed phase's window starts and ends."""
LATENCY_TARGET_MS = 50.0
OVERHEAD_TARGET_PCT = 15.0
SCALE_TARGET = 1.6
CARRIED_TARGET = 0.5
SETTLE_TARGET_S = 5.0


@dataclass
class Config:
    """One configuration and, once started, its nodes, its clients and its windows."""

    name: str
    cores: list[int]
    """Each node's core (node A first: it publishes)."""
    redis: RedisServer | None = None
    """Its own redis-server (Redis configurations only)."""
    nodes: list[Server] = field(default_factory=list)
    share: list[int] = field(default_factory=list)
    rec: Recorder = field(default_factory=lambda: Recorder(sample=1))
    """Its clients' receipts; skew: every message (many clients, few rounds per second)."""
    clients: list[Client] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    redis_idle_pct: float = 0.0
    """redis-server's CPU % with the nodes connected and following, nothing published."""
    carried: bool = False
    """Every client opens its session on node A, then is moved to node B, which carries it."""
    home_only: bool = False
    """Every client opens its session on node A (so does ``carried``)."""
    n_clients: int = CLIENTS

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    @property
    def redis_pid(self) -> int | None:
        return None if self.redis is None else self.redis.pid

    def describe(self) -> str:
        nodes = ", ".join(f"node {chr(65 + i)} core {c}" for i, c in enumerate(self.cores))
        extra = " and its redis-server" if self.redis else ""
        return f"{nodes}; the load{extra} core {LOAD_CORE}"

    async def start(self, args: argparse.Namespace, pin: bool) -> None:
        """Fresh nodes, then the clients, split evenly over them."""
        for core in self.cores:
            argv = ["--topics", str(TOPICS)]
            argv += ["--cpu", str(core)] if pin else []
            argv += ["--redis", self.redis.url] if self.redis else []
            self.nodes.append(Server(argv, pin=False, script=NODE))
        n, total = len(self.nodes), self.n_clients
        self.share = [total // n + (i < total % n) for i in range(n)]
        if self.carried or self.home_only:
            self.share = [total] + [0] * (n - 1)  # every session on A (carried: then by B)
        await asyncio.gather(*(node.start() for node in self.nodes))
        names = [f"bench.{i}" for i in range(TOPICS)]
        t = time.monotonic()
        for port, k in zip(self.ports, self.share, strict=True):
            url = f"ws://127.0.0.1:{port}/rubris/ws"
            self.clients += await open_clients(url, k, names, self.rec, args.decode)
        if self.carried:
            self.clients = await move(self.clients, self.ports[1], self.rec, args.decode)
        connect_s = time.monotonic() - t
        await asyncio.sleep(0.3)
        stats = await asyncio.gather(*(http(p, "GET", "/control/stats?gc=1") for p in self.ports))
        connected = [s["connected"] for s in stats]
        if connected != self.share:  # a carried session is connected on its home
            raise RuntimeError(f"{self.name}: {connected} clients connected, not {self.share}")
        print(
            f"{self.name}: {total:,} clients x {TOPICS} topics "
            f"({' + '.join(f'{k:,}' for k in self.share)}) connected and subscribed in "
            f"{connect_s:.1f} s; {self.describe()}",
            flush=True,
        )

    async def stop(self) -> None:
        try:
            await close_clients(self.clients)
        finally:
            await asyncio.gather(*(n.stop() for n in self.nodes), return_exceptions=True)
            for n in self.nodes:
                n.kill()


def configurations(split: bool) -> list[Config]:
    return [
        Config("local", [SERVER_CORE]),
        Config("redis1", [SERVER_CORE]),
        Config("redis2", [SERVER_CORE, LOAD_CORE if split else SERVER_CORE]),
        Config("carried", [SERVER_CORE, LOAD_CORE if split else SERVER_CORE], carried=True),
    ]


# --------------------------------------------------------------------------- measuring


def proc_cpu_s(pid: int) -> float:
    """CPU seconds of every thread of ``pid`` (redis-server): schedstat's nanoseconds on CPU."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        with contextlib.suppress(OSError), open(path) as f:
            total += int(f.read().split()[0])
    return total / 1e9


class Control:
    """One kept-alive HTTP/1.1 connection to a node's control endpoints: the closed loop asks
    for rounds tens of times a second, and a connection each time would cost both sides more
    than the request itself."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str) -> Any:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n".encode()
        )
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        lines = head.split("\r\n")
        if lines[0].split(" ", 2)[1] != "200":
            raise RuntimeError(f"POST {path}: {lines[0]}")
        length = next(
            int(v) for k, _, v in (x.partition(":") for x in lines) if k.lower() == "content-length"
        )
        return orjson.loads(await self.reader.readexactly(length))

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
            self.reader = self.writer = None


async def grant_rounds(ctl: Control, rec: Recorder, window: int, base: int) -> None:
    """The ``max`` phase's closed loop: keep ``window`` rounds' deliveries on their way to the
    clients (published, not yet counted by ``rec``), whichever node they go through."""
    per_round = CLIENTS * TOPICS
    limit = window * per_round
    accepted = refused = 0
    while True:
        outstanding = accepted * CLIENTS - (rec.count - base)
        if outstanding >= limit:
            await asyncio.sleep(0.001)
            continue
        r = await ctl.post(f"/control/rounds?n={math.ceil((limit - outstanding) / per_round)}")
        accepted = r["accepted"]
        if r["refused"] > refused:  # the broker's outbox is full: let it drain
            refused = r["refused"]
            await asyncio.sleep(0.01)


def node_figures(s0: dict[str, Any], s1: dict[str, Any]) -> dict[str, Any]:
    """One node's figures over its own window (its two stats answers)."""
    wall = (s1["now_ns"] - s0["now_ns"]) / 1e9
    cpu = (s1["cpu_user"] + s1["cpu_sys"]) - (s0["cpu_user"] + s0["cpu_sys"])
    framed = s1["cycle"]["messages"] - s0["cycle"]["messages"]
    frames = s1["cycle"]["frames"] - s0["cycle"]["frames"]
    return {
        "cpu_s": cpu,
        "framed": framed,
        "wall_s": wall,
        "cpu_pct": round(cpu / wall * 100, 1),
        "sys_pct": round((s1["cpu_sys"] - s0["cpu_sys"]) / wall * 100, 1),
        "framed_per_s": round(framed / wall),
        # batching: a message heard from Redis alone in its cycle makes frames of one message
        "messages_per_frame": round(framed / frames, 2) if frames else None,
        "cycles": s1["cycle"]["cycles"] - s0["cycle"]["cycles"],
        # what this node delivers per second of its own CPU: with a core to itself, its rate
        "per_cpu_s": round(framed / cpu) if cpu > 0 else None,
        "gc_ms": round((sum(s1["gc"]["seconds"]) - sum(s0["gc"]["seconds"])) * 1000, 1),
        "rss_mb": round(s1["rss"] / 2**20, 1),
    }


async def run_phase(cfg: Config, phase: str, args: argparse.Namespace) -> dict[str, Any]:
    """One measured window of ``phase`` (``fixed`` or ``max``) on ``cfg``; its figures."""
    rec, ports, redis_pid = cfg.rec, cfg.ports, cfg.redis_pid
    per_round = CLIENTS * TOPICS
    rec.reset()
    n_start = rec.count
    pub = ports[0]  # node A publishes
    # the publisher runs until told to stop (the limit is a safety net), so a late control
    # answer from a saturated node cannot end the publishing before the window does
    limit = 10 * (args.warmup + args.measure) + 30
    ctl: Control | None = None
    granter: asyncio.Task[None] | None = None
    if phase == "max":
        await http(pub, "POST", f"/control/start?mode=credit&seconds={limit}")
        ctl = Control(pub)
        granter = asyncio.get_running_loop().create_task(
            grant_rounds(ctl, rec, args.window, n_start)
        )
        rounds_per_s = 0.0
        start_at = time.monotonic_ns() + int(args.warmup * 1e9)
        end_at = start_at + int(args.measure * 1e9)
    else:
        rounds_per_s = args.rate / per_round
        mode = "spread" if args.spread else "open"
        info = await http(
            pub, "POST", f"/control/start?mode={mode}&rate={rounds_per_s:.6f}&seconds={limit}"
        )
        # the window spans whole publishing intervals, from and to the same point of one (most
        # of the way to the next publish, when the last one is framed and read): a window cut
        # across rounds at random would count 12 or 13 of a 2.5 s window's 12.5, +-4 % on the
        # CPU per delivery, which is the very figure this bench compares
        tick = 1e9 / (rounds_per_s * (TOPICS if args.spread else 1))
        ticks = max(1, round(args.measure * 1e9 / tick))
        due = info["started_ns"] + ALIGN * tick
        start_at = int(
            due + math.ceil((time.monotonic_ns() + args.warmup * 1e9 - due) / tick) * tick
        )
        end_at = int(start_at + ticks * tick)
    try:
        await asyncio.sleep((start_at - time.monotonic_ns()) / 1e9)
        r0 = proc_cpu_s(redis_pid) if redis_pid else 0.0
        c0, k0, t0, n0 = load_cpu(), cpu_ticks(), time.monotonic_ns(), rec.count
        rec.recording = True
        s0 = await asyncio.gather(*(http(p, "GET", "/control/stats?mark=1") for p in ports))
        await asyncio.sleep((end_at - time.monotonic_ns()) / 1e9)
        rec.recording = False
        t1, n1, c1, k1 = time.monotonic_ns(), rec.count, load_cpu(), cpu_ticks()
        r1 = proc_cpu_s(redis_pid) if redis_pid else 0.0
        s1 = await asyncio.gather(*(http(p, "GET", "/control/stats") for p in ports))
    finally:
        if granter is not None:
            granter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await granter
        if ctl is not None:
            await ctl.close()
        await http(pub, "POST", "/control/stop")
    await drain(rec)
    end = await http(pub, "GET", "/control/stats")

    wall = (t1 - t0) / 1e9
    delivered_rate = (n1 - n0) / wall
    nodes = [node_figures(a, b) for a, b in zip(s0, s1, strict=True)]
    server_cpu = sum(n["cpu_s"] for n in nodes)
    framed = sum(n["framed"] for n in nodes)
    server_cpu_pct = sum(n["cpu_pct"] for n in nodes)
    # publishes (one message to one topic) made by node A over its window
    p0, p1 = s0[0]["publisher"], s1[0]["publisher"]
    publish_rate = (p1["accepted"] - p0["accepted"]) / nodes[0]["wall_s"]
    redis_cpu_pct = (r1 - r0) / wall * 100
    offered = rounds_per_s * per_round if phase != "max" else publish_rate * CLIENTS
    ratio = delivered_rate / offered if offered else 0.0
    complete = (rec.count - n_start) / max(1, end["publisher"]["accepted"] * CLIENTS)
    lat = sorted(rec.lat)
    window = [e for e in rec.skew.values() if t0 <= e[0] <= t1]
    skews = sorted(e[1] - e[0] for e in window if e[2] > 1)
    latency_p99_ms = ms(pct(lat, 0.99))
    if phase == "max":
        sustained = complete >= 0.99 and rec.gaps == 0
    else:
        sustained = (
            ratio >= 0.9 and latency_p99_ms is not None and latency_p99_ms < 1000 and not rec.gaps
        )
    load_cpu_pct = (c1 - c0) / wall * 100
    # what our own processes used of each core; the rest of its busy time was someone else's
    # (the other configurations' nodes, idle meanwhile, count there: a fraction of a percent)
    by_core = {SERVER_CORE: 0.0, LOAD_CORE: 0.0}  # the nodes' CPU % on each core
    for core, n in zip(cfg.cores, nodes, strict=True):
        by_core[core] += n["cpu_pct"]
    ours = {
        c: used + (load_cpu_pct + redis_cpu_pct if c == LOAD_CORE else 0.0)
        for c, used in by_core.items()
    }
    machine = core_usage(k0, k1)
    other = {f"cpu{c}": machine.get(f"cpu{c}_busy_pct", 0.0) - used for c, used in ours.items()}
    servers_saturated = any(by_core[c] >= 90 for c in set(cfg.cores))
    if servers_saturated and load_cpu_pct >= 90:
        bottleneck = "server and load"
    elif servers_saturated:
        bottleneck = "server"
    elif load_cpu_pct >= 90:
        bottleneck = "load"
    elif ours[LOAD_CORE] >= 90:
        bottleneck = "load core (load + Redis + node)"
    else:
        bottleneck = "none" if phase != "max" else "other (nothing saturated)"
    b0, b1 = p0["broker"], p1["broker"]
    delivered_per_cpu = delivered_rate / (server_cpu_pct / 100) if server_cpu_pct > 0 else None
    per_cpu_values = [n["per_cpu_s"] for n in nodes]
    on_redis = cfg.redis is not None
    return {
        "config": cfg.name,
        "phase": phase,
        "mode": "closed-loop" if phase == "max" else "open-loop",
        "target_delivered_per_s": None if phase == "max" else round(offered),
        "delivered_per_s": round(delivered_rate),
        "delivered_ratio": round(ratio, 4),
        "complete_ratio": round(complete, 4),
        "sustained": sustained,
        "latency_p50_ms": ms(pct(lat, 0.50)),
        "latency_p99_ms": latency_p99_ms,
        "latency_max_ms": ms(pct(lat, 1.0)),
        "skew_p50_ms": ms(pct(skews, 0.50)),
        "skew_p99_ms": ms(pct(skews, 0.99)),
        "skew_samples": len(skews),
        "server_cpu_pct": round(server_cpu_pct, 1),
        "server_cpu_s_per_million": round(server_cpu / framed * 1e6, 3) if framed else None,
        "delivered_per_server_cpu_s": None
        if delivered_per_cpu is None
        else round(delivered_per_cpu),
        # each node's deliveries per CPU-second of its own process, added up: what the nodes
        # would serve with a core each
        "projected_per_cpu_s": None if None in per_cpu_values else sum(per_cpu_values),
        "nodes": [{"core": c, **n} for c, n in zip(cfg.cores, nodes, strict=True)],
        "publishes_per_s": round(publish_rate, 1),
        "redis_cpu_pct": round(redis_cpu_pct, 2),
        "redis_cpu_us_per_publish": round((r1 - r0) / wall / publish_rate * 1e6, 2)
        if on_redis and publish_rate
        else None,
        "redis_cpu_s_per_million": round((r1 - r0) / wall / delivered_rate * 1e6, 4)
        if on_redis and delivered_rate
        else None,
        "redis_idle_cpu_pct": round(cfg.redis_idle_pct, 2) if on_redis else None,
        # Redis's CPU beyond what it uses idle (its cron, the nodes' health checks), per publish
        "redis_cpu_us_per_publish_net": round(
            max(0.0, redis_cpu_pct - cfg.redis_idle_pct) / 100 / publish_rate * 1e6, 2
        )
        if on_redis and publish_rate
        else None,
        "broker": {
            "refused": p1["refused"] - p0["refused"],
            "refused_run": end["publisher"]["refused"],
            "outages": b1["outages"] - b0["outages"],
            "pending_end": b1["pending"],
            "received_node_a": b1["received"] - b0["received"],
        },
        "publisher_max_late_ms": round(p1["max_late_ms"], 3),
        "load_cpu_pct": round(load_cpu_pct, 1),
        "bottleneck": bottleneck,
        "gaps": rec.gaps,
        "lost_to_gaps": rec.lost,
        "other_cpu_pct": {k: round(v, 1) for k, v in other.items()},
        "machine": machine,
        "window_s": round(wall, 3),
    }


def describe(r: dict[str, Any]) -> str:
    rate = (
        "max (closed loop)"
        if r["phase"] == "max"
        else f"open loop @ {r['target_delivered_per_s']:,}/s"
    )
    nodes = " + ".join(f"{n['cpu_pct']:.0f}%" for n in r["nodes"])
    line = (
        f"{r['config']:<7} {rate:<25} delivered {r['delivered_per_s']:>7,}/s "
        f"({'sustained' if r['sustained'] else 'NOT SUSTAINED'}) "
        f"| latency p50 {fmt(r['latency_p50_ms'])} p99 {fmt(r['latency_p99_ms'])} ms "
        f"| skew p50 {fmt(r['skew_p50_ms'])} p99 {fmt(r['skew_p99_ms'])} ms "
        f"| server {fmt(r['server_cpu_s_per_million'], '.3f')} CPU-s/M, {nodes} CPU "
        f"| redis {r['redis_cpu_pct']:.1f}% CPU | load {r['load_cpu_pct']:.0f}% CPU"
    )
    if r["broker"]["refused"] or r["gaps"]:
        line += f" | refused {r['broker']['refused']}, GAPs {r['gaps']}"
    if noisy(r):
        line += " | NOISY: other work on " + ", ".join(
            f"{k} {v:.0f}%" for k, v in r["other_cpu_pct"].items() if v > NOISY_PCT
        )
    return line


class Budget:
    """The run's time limit: a NOISY window is measured again only while the windows left,
    at the pace so far, still fit."""

    def __init__(self, seconds: float, windows: int) -> None:
        self.first = time.monotonic()
        self.deadline = self.first + seconds
        self.left = windows
        self.measured = 0

    def window_done(self) -> None:
        self.left -= 1
        self.measured += 1

    def may_retry(self) -> bool:
        pace = (time.monotonic() - self.first) / max(1, self.measured)
        return time.monotonic() + pace * (self.left + 1) <= self.deadline


async def measure(
    cfg: Config, phase: str, args: argparse.Namespace, budget: Budget
) -> dict[str, Any]:
    """One window of ``phase``, measured again (up to ``--noisy-retries`` times, within the
    budget) while other processes used our cores; of the attempts, the least disturbed."""
    return await least_noisy(lambda: run_phase(cfg, phase, args), describe, args, budget)


async def least_noisy(
    window: Callable[[], Awaitable[dict[str, Any]]],
    show: Callable[[dict[str, Any]], str],
    args: argparse.Namespace,
    budget: Budget,
) -> dict[str, Any]:
    """``window()`` after the cores idled, again while it was NOISY (``--noisy-retries``, within
    the budget); each attempt printed with ``show``; the least disturbed returned."""
    attempts: list[dict[str, Any]] = []
    for attempt in range(1, args.noisy_retries + 2):
        await wait_quiet(args.quiet_wait)
        r = await window()
        r["attempt"] = attempt
        attempts.append(r)
        print(show(r), flush=True)
        if not noisy(r):
            break
        if attempt > args.noisy_retries or not budget.may_retry():
            break
        print("        (other processes used our cores: measuring again)", flush=True)
    budget.window_done()
    return min(attempts, key=lambda a: max(a["other_cpu_pct"].values()))


async def redis_idle(configs: list[Config]) -> None:
    """Each redis-server's CPU over a second with its nodes connected, following, idle."""
    pids = {c.name: c.redis_pid for c in configs if c.redis_pid}
    r0, t0 = {n: proc_cpu_s(p) for n, p in pids.items()}, time.monotonic()
    await asyncio.sleep(1.0)
    wall = time.monotonic() - t0
    for c in configs:
        if c.name in pids:
            c.redis_idle_pct = (proc_cpu_s(pids[c.name]) - r0[c.name]) / wall * 100


async def run(configs: list[Config], args: argparse.Namespace, pin: bool) -> None:
    """Every configuration up at once, then each phase: ``--repeat`` windows of each
    configuration in turn (the order turned by one each time), so that each configuration's
    windows and the ones they are compared with are seconds apart on a machine whose speed
    drifts."""
    ping_task: asyncio.Task[None] | None = None
    try:
        for cfg in configs:
            await cfg.start(args, pin)
        await redis_idle(configs)
        LOAD_GC.collect()
        gc.freeze()  # the clients are long-lived: keep them out of the load's gc passes
        everyone = [c for cfg in configs for c in cfg.clients]
        ping_task = asyncio.get_running_loop().create_task(pinger(everyone))
        # one unmeasured window of the fixed rate on each configuration first: the first window
        # a fresh node serves costs it more (its buffers and pools grow), and would count
        # against whichever configuration happened to be measured first
        print("warming every configuration up (not measured)", flush=True)
        for cfg in configs:
            await run_phase(cfg, "fixed", argparse.Namespace(**{**vars(args), "measure": 1.0}))
        phases = args.phases.split(",")
        budget = Budget(args.budget, len(phases) * args.repeat * len(configs))
        for phase in phases:
            for rep in range(args.repeat):
                k = rep % len(configs)
                for cfg in configs[k:] + configs[:k]:
                    r = await measure(cfg, phase, args, budget)
                    r["rep"] = rep + 1
                    cfg.results.append(r)
    finally:
        if ping_task is not None:
            ping_task.cancel()
        gc.unfreeze()
        await asyncio.gather(*(cfg.stop() for cfg in configs), return_exceptions=True)


# --------------------------------------------------------------------------- the report


def windows(configs: list[Config], name: str, phase: str) -> list[dict[str, Any]]:
    """The windows of one configuration and phase, in the order measured."""
    return [r for c in configs if c.name == name for r in c.results if r["phase"] == phase]


def typical(rs: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """The window whose ``key`` is the median (the lower of the two middle ones), of the quiet
    windows if there are any."""
    quiet = [r for r in rs if not noisy(r)] or rs
    valued = sorted((r for r in quiet if r[key] is not None), key=lambda r: r[key])
    return valued[(len(valued) - 1) // 2] if valued else None


def paired(
    configs: list[Config], a: str, b: str, phase: str, key: str, extra: str = ""
) -> list[float]:
    """``key`` (plus ``extra``) of configuration ``a`` over ``b``, repetition by repetition:
    the two windows were measured seconds apart, so whatever slowed the machine then slowed
    both (NOISY pairs are kept: on a busy day the quiet ones are too few for a median)."""
    return [
        (x[key] + ((x[extra] or 0.0) if extra else 0.0)) / y[key]
        for x, y in zip(windows(configs, a, phase), windows(configs, b, phase), strict=False)
        if x[key] is not None and y[key]
    ]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def headline(configs: list[Config], args: argparse.Namespace) -> dict[str, Any]:
    """The issue's figures and targets: medians over the repetitions of paired ratios."""
    cost = "server_cpu_s_per_million"

    def pct_over(values: list[float]) -> list[float]:
        return [round((v - 1) * 100, 1) for v in values]

    overhead = pct_over(paired(configs, "redis1", "local", "fixed", cost))
    with_redis = pct_over(
        paired(configs, "redis1", "local", "fixed", cost, "redis_cpu_s_per_million")
    )
    at_max = pct_over(paired(configs, "redis1", "local", "max", cost))
    two = paired(configs, "redis2", "local", "max", "projected_per_cpu_s")
    two_at_rate = paired(configs, "redis2", "local", "fixed", "projected_per_cpu_s")
    carried = paired(configs, "carried", "local", "fixed", "delivered_per_server_cpu_s")
    raw = paired(configs, "redis2", "local", "max", "delivered_per_s")
    local_fixed = typical(windows(configs, "local", "fixed"), cost)
    redis1_fixed = typical(windows(configs, "redis1", "fixed"), cost)
    redis1_max = typical(windows(configs, "redis1", "max"), cost)

    def get(r: dict[str, Any] | None, key: str) -> Any:
        return None if r is None else r[key]

    def rounded(x: float | None, digits: int) -> float | None:
        return None if x is None else round(x, digits)

    p99 = get(local_fixed, "latency_p99_ms")
    m_overhead = median(overhead)
    m_two = median(two)
    return {
        "rate_delivered_per_s": args.rate,
        "local_p99_ms_at_rate": p99,
        "rate_meets_p99_target": p99 is not None and p99 < LATENCY_TARGET_MS,
        "redis_cpu_overhead_pct": rounded(m_overhead, 1),
        "redis_cpu_overhead_pct_windows": overhead,
        "redis_cpu_overhead_pct_with_redis": rounded(median(with_redis), 1),
        "redis_cpu_overhead_pct_at_max": rounded(median(at_max), 1),
        # the difference per delivery, times the deliveries a publish makes: the node's CPU
        # the broker costs per publish (a small difference of two measured figures: noisy)
        "node_cpu_us_per_publish_added": None
        if m_overhead is None or local_fixed is None
        else round(m_overhead / 100 * local_fixed[cost] * CLIENTS),
        "redis_cpu_us_per_publish_at_rate": get(redis1_fixed, "redis_cpu_us_per_publish"),
        "redis_cpu_us_per_publish_net_at_rate": get(redis1_fixed, "redis_cpu_us_per_publish_net"),
        "redis_cpu_s_per_million_at_rate": get(redis1_fixed, "redis_cpu_s_per_million"),
        "redis_cpu_us_per_publish_at_max": get(redis1_max, "redis_cpu_us_per_publish"),
        "two_workers_vs_one": rounded(m_two, 2),
        "two_workers_vs_one_windows": [round(x, 2) for x in two],
        "two_workers_vs_one_at_rate": rounded(median(two_at_rate), 2),
        "two_workers_vs_one_measured": rounded(median(raw), 2),
        "carried_vs_local_per_cpu": rounded(median(carried), 2),
        "carried_vs_local_per_cpu_windows": [round(x, 2) for x in carried],
        "overhead_met": m_overhead is not None and m_overhead <= OVERHEAD_TARGET_PCT,
        "scale_met": m_two is not None and m_two >= SCALE_TARGET,
    }


def table(configs: list[Config], head: dict[str, Any], args: argparse.Namespace) -> str:
    cols = (
        f"{'config':<7} {'phase':<13} {'delivered/s':>11} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'skew50':>7} {'skew99':>7} {'srv CPU':>8} {'CPU-s/M':>8} {'per CPU-s':>10} "
        f"{'node per CPU-s':>17} {'redis':>6} {'us/pub':>7} {'load':>5}  ok   note"
    )
    lines = ["", "cores (2, shared between the servers and the load):"]
    lines += [f"  {c.name:<7} {c.describe()}" for c in configs]
    if args.split:
        lines.append(
            "  redis2's node B shares core 1 with the load and Redis: its measured maximum is "
            "bounded by what the load leaves it"
        )
    else:
        lines.append(
            "  redis2's two nodes time-share core 0, the one core the single node had: its "
            "measured maximum is one core's; the per-CPU-second figures are what each node "
            "would serve with a core of its own"
        )
    lines += [
        f"one row per configuration and phase: the median of {args.repeat} windows (by CPU per "
        "delivery; max: by the nodes' deliveries per CPU-second), the configurations' windows "
        "interleaved",
        "per CPU-s = delivered/s / the nodes' CPU fraction; node per CPU-s = each node's "
        "deliveries / its own CPU-seconds; redis = redis-server CPU %, us/pub its CPU per publish",
        "",
        cols,
        "-" * len(cols),
    ]
    for phase, key in (("fixed", "server_cpu_s_per_million"), ("max", "projected_per_cpu_s")):
        for c in configs:
            r = typical(windows(configs, c.name, phase), key)
            if r is None:
                continue
            shown = "max" if phase == "max" else f"@{r['target_delivered_per_s']:,}/s"
            notes = []
            if noisy(r):
                notes.append("NOISY")
            if r["bottleneck"] not in ("none", "server"):
                notes.append(f"bottleneck: {r['bottleneck']}")
            if r["broker"]["refused"]:
                notes.append(f"{r['broker']['refused']} refused")
            per_node = "+".join(f"{n['per_cpu_s'] or 0:,}" for n in r["nodes"])
            lines.append(
                f"{r['config']:<7} {shown:<13} {r['delivered_per_s']:>11,} "
                f"{fmt(r['latency_p50_ms']):>7} {fmt(r['latency_p99_ms']):>7} "
                f"{fmt(r['skew_p50_ms']):>7} {fmt(r['skew_p99_ms']):>7} "
                f"{r['server_cpu_pct']:>7.0f}% {fmt(r['server_cpu_s_per_million'], '.3f'):>8} "
                f"{fmt(r['delivered_per_server_cpu_s'], ',.0f'):>10} {per_node:>17} "
                f"{r['redis_cpu_pct']:>5.1f}% {fmt(r['redis_cpu_us_per_publish'], '.1f'):>7} "
                f"{r['load_cpu_pct']:>4.0f}%  {'yes' if r['sustained'] else 'NO ':<4} "
                f"{', '.join(notes)}".rstrip()
            )
    return "\n".join([*lines, "", *verdict(head, args)])


def verdict(h: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """The headline figures in words, each against its target."""
    out = []
    if h["local_p99_ms_at_rate"] is not None:
        met = h["rate_meets_p99_target"]
        out.append(
            f"fixed rate {h['rate_delivered_per_s']:,} deliveries/s: local p99 "
            f"{fmt(h['local_p99_ms_at_rate'])} ms ({'<' if met else 'NOT <'} "
            f"{LATENCY_TARGET_MS:.0f} ms)"
            + (
                ""
                if met or args.spread
                else f": a round is {CLIENTS:,} frames, which take one node ~40-50 ms to write "
                "(skew p50) at any rate, so no rate of whole rounds gets under it here"
            )
        )
    if h["redis_cpu_overhead_pct"] is None:
        out.append("Redis's CPU overhead: not measured (needs local and redis1, fixed phase)")
    else:
        windows_pct = ", ".join(f"{x:+.1f}" for x in h["redis_cpu_overhead_pct_windows"])
        out += [
            "Redis's CPU overhead per delivery, one node, at that rate: "
            f"{h['redis_cpu_overhead_pct']:+.1f} % of the node's CPU, median of "
            f"[{windows_pct}] (target <= {OVERHEAD_TARGET_PCT:.0f} %: "
            f"{'met' if h['overhead_met'] else 'NOT met'}); "
            f"{fmt(h['redis_cpu_overhead_pct_with_redis'], '+.1f')} % counting redis-server's "
            f"CPU too; {fmt(h['redis_cpu_overhead_pct_at_max'], '+.1f')} % at max",
            (
                f"  = {h['node_cpu_us_per_publish_added']:+.0f} us of the node's CPU per publish "
                f"({CLIENTS:,} deliveries)"
                if (h["node_cpu_us_per_publish_added"] or 0) > 0
                else "  = no measurable cost: within the machine's noise (one configuration's "
                "windows differ by up to ~15 %)"
            )
            + f"; the broker costs per publish, so its share is small when, as here, every "
            f"publish reaches {CLIENTS:,} subscribers",
            "redis-server, one node following, at the fixed rate: "
            f"{fmt(h['redis_cpu_us_per_publish_at_rate'], '.1f')} us CPU per publish "
            f"({fmt(h['redis_cpu_us_per_publish_net_at_rate'], '.1f')} beyond its idle CPU), "
            f"{fmt(h['redis_cpu_s_per_million_at_rate'], '.4f')} CPU-s per million deliveries; "
            f"{fmt(h['redis_cpu_us_per_publish_at_max'], '.1f')} us per publish at max "
            "(bigger batches)",
        ]
    if h["two_workers_vs_one"] is None:
        out.append("two workers vs one: not measured (needs local and redis2, max phase)")
    else:
        where = (
            "node B shared core 1 with the load and Redis"
            if args.split
            else "both nodes time-shared core 0, the single node's core"
        )
        out += [
            f"two workers vs one: {h['two_workers_vs_one']:.2f}x, median of "
            f"{h['two_workers_vs_one_windows']} (each node's deliveries per CPU-second of its "
            "own process, added, over the single node's; max phases; target >= "
            f"{SCALE_TARGET}x: {'met' if h['scale_met'] else 'NOT met'}); "
            f"{fmt(h['two_workers_vs_one_at_rate'], '.2f')}x at the fixed rate",
            "  measured max delivered/s, redis2 / local: "
            f"{fmt(h['two_workers_vs_one_measured'], '.2f')}x: {where}, and the load's one core "
            "bounds both maxima: not what two cores would serve",
        ]
    shards = h.get("redis_shards_2_vs_1")
    if shards is not None:
        share = h["max_shard_share"]
        scaled = "met" if shards >= SHARD_SCALE_TARGET else "NOT met"
        even = "met" if share <= SHARD_SHARE_TARGET else "NOT met"
        out.append(
            f"Redis Cluster, 2 masters vs 1: {shards:.2f}x the publishes per Redis CPU-second "
            f"(target >= {SHARD_SCALE_TARGET}: {scaled}), the busiest master {share:.1%} of "
            f"them (target <= {SHARD_SHARE_TARGET:.0%}: {even}): the shards run, above"
        )
    carried = h["carried_vs_local_per_cpu"]
    if carried is not None:
        out.append(
            f"carried sessions: {carried:.2f}x a local session's deliveries per CPU-second (both "
            f"nodes counted), median of {h['carried_vs_local_per_cpu_windows']} (target >= "
            f"{CARRIED_TARGET}: {'met' if carried >= CARRIED_TARGET else 'NOT met'})"
        )
    return out


SETTLE_CLIENTS = 1000
SETTLE_ROUNDS_PER_S = 5.0
SETTLE_LIMIT_S = 60.0


async def settle(args: argparse.Namespace, pin: bool) -> dict[str, Any]:
    """``settle_1000_s``: 1,000 clients of node A under a steady ring load (5 rounds/s: 50,000
    deliveries/s), all moved to node B at once (bench/_scaleout_moves.py); the seconds until
    every one has read a message at most 100 ms old again."""
    cfg = Config("settle", [SERVER_CORE, SERVER_CORE], home_only=True, n_clients=SETTLE_CLIENTS)
    with RedisServer() as redis:
        if pin and redis.pid is not None:
            os.sched_setaffinity(redis.pid, {LOAD_CORE})
        cfg.redis = redis
        await cfg.start(args, pin)
        a, b = cfg.ports
        pings = asyncio.get_running_loop().create_task(pinger(cfg.clients))
        try:
            await http(
                a, "POST", f"/control/start?mode=open&rate={SETTLE_ROUNDS_PER_S}&seconds=120"
            )
            await asyncio.sleep(3.0)
            cfg.rec.recording = True
            t0 = time.monotonic_ns()
            cfg.clients = await move(cfg.clients, b, cfg.rec, args.decode)
            moved_s = (time.monotonic_ns() - t0) / 1e9
            deadline = time.monotonic() + SETTLE_LIMIT_S
            while time.monotonic() < deadline:
                done, _ = settled(cfg.clients, t0)
                if done == len(cfg.clients):
                    break
                await asyncio.sleep(0.05)
            done, times = settled(cfg.clients, t0)
            await http(a, "POST", "/control/stop")
            stats = await asyncio.gather(*(http(p, "GET", "/control/stats") for p in cfg.ports))
        finally:
            pings.cancel()
            cfg.rec.recording = False
            await cfg.stop()
    times.sort()
    every = done == SETTLE_CLIENTS
    out = {
        "clients": SETTLE_CLIENTS,
        "deliveries_per_s": int(SETTLE_CLIENTS * TOPICS * SETTLE_ROUNDS_PER_S),
        "reconnected_s": round(moved_s, 2),
        "settled": done,
        "settle_s": round(times[-1], 2) if every else None,
        "settle_p50_s": round(statistics.median(times), 2) if times else None,
        "connected_on_a": stats[0]["connected"],
        "gaps": cfg.rec.gaps,
    }
    print(
        f"settle: {SETTLE_CLIENTS:,} sessions of node A moved to node B under "
        f"{out['deliveries_per_s']:,} deliveries/s, reconnected in {moved_s:.1f} s; every "
        f"client within 100 ms of the publisher again after "
        f"{fmt(out['settle_s'], '.2f')} s (half of them after {fmt(out['settle_p50_s'], '.2f')} s)"
        + ("" if every else f"; only {done} settled within {SETTLE_LIMIT_S:.0f} s")
        + f" (target <= {SETTLE_TARGET_S:.0f} s: "
        + ("met)" if every and times[-1] <= SETTLE_TARGET_S else "NOT met)"),
        flush=True,
    )
    return out


# --------------------------------------------------------------------------- the shards run

SHARDS_NODE = NODE
SHARD_TOPICS = 1000
"""Ring topics ``bench.0`` .. ``bench.999``: 15 or 16 in each of the 64 partitions."""
SHARD_RING = 64
SHARD_NODES = 2
SHARD_TOPICS_PER_CLIENT = 10
"""50 clients a node, 10 topics each: every topic has one subscriber, on one of the nodes."""
SHARD_RATE = 800
"""Publishes/s each master numbers in the windows that give ``redis_shards_2_vs_1``."""
SHARD_SCALE_TARGET = 1.8
SHARD_SHARE_TARGET = 0.6
SHARD_P99_SPREAD = 2.0
"""Two p99s within this factor of each other count as the same."""
SHARD_BUDGET_S = (25.0, 60.0)
"""The seconds the shards run's windows may take (--quick, full): NOISY ones are measured again
only within it."""


@dataclass
class ShardMaster:
    """One master of a configuration: where it listens, its process, its share of the topics."""

    port: int
    pid: int
    topic_share: float
    """Of the 1,000 topics, the fraction whose partition's slot it serves (partitions.py)."""
    conn: AsyncRedis
    """For ``INFO``: the publishes and script calls it ran, its connections."""


@dataclass
class Shards:
    """One configuration of the shards run: a Redis Cluster of ``masters`` masters, its two
    nodes and their clients."""

    masters: int
    redis: list[ShardMaster] = field(default_factory=list)
    nodes: list[Server] = field(default_factory=list)
    rec: Recorder = field(default_factory=lambda: Recorder(sample=1 << 30))
    """Latency only (a skew sample every 2**30th seq: never)."""
    clients: list[Client] = field(default_factory=list)
    started_at: float = 0.0
    """When its nodes answered first (time.monotonic())."""

    @property
    def name(self) -> str:
        return "1 master" if self.masters == 1 else f"{self.masters} masters"

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    async def start(self, cluster: RedisCluster, args: argparse.Namespace, pin: bool) -> None:
        """Its masters found (and pinned), then its nodes, then their clients."""
        names = [f"bench.{i}" for i in range(SHARD_TOPICS)]
        masters = cluster.masters()
        served = [
            next(m.port for m in masters if m.owns(slot_of_partition(partition_of(n))))
            for n in names
        ]
        for m in masters:
            conn = AsyncRedis(host=HOST, port=m.port)
            # the kit keeps its processes to itself; Redis says which one it is
            pid = int((await conn.info("server"))["process_id"])
            self.redis.append(ShardMaster(m.port, pid, served.count(m.port) / len(names), conn))
            if pin:
                pin_threads(pid, LOAD_CORE)
        url = "redis+cluster://" + ",".join(f"{HOST}:{p}" for p in cluster.ports)
        for _ in range(SHARD_NODES):
            argv = ["--topics", str(SHARD_TOPICS), "--ring", str(SHARD_RING), "--redis", url]
            argv += ["--no-batches"]  # a Redis Cluster keeps no batches yet
            argv += ["--cpu", str(SERVER_CORE)] if pin else []
            self.nodes.append(Server(argv, pin=False, script=SHARDS_NODE))
        await asyncio.gather(*(node.start() for node in self.nodes))
        self.started_at = time.monotonic()
        # each node's clients follow its half of the topics: every publish is heard by one
        # node, half of each node's publishes by the other one, through Redis
        half, k = SHARD_TOPICS // SHARD_NODES, SHARD_TOPICS_PER_CLIENT
        for i, port in enumerate(self.ports):
            mine = names[i * half : (i + 1) * half]
            ws = f"ws://127.0.0.1:{port}/rubris/ws"
            self.clients += await asyncio.gather(
                *(
                    open_client(ws, mine[j : j + k], self.rec, args.decode)
                    for j in range(0, half, k)
                )
            )
        stats = await asyncio.gather(*(http(p, "GET", "/control/stats?gc=1") for p in self.ports))
        following = [s["publisher"]["broker"]["following"] for s in stats]
        if following != [half] * SHARD_NODES:
            raise RuntimeError(f"shards, {self.name}: the nodes follow {following} topics")

    async def stop(self) -> None:
        """Its clients closed, its nodes stopped (the cluster is its caller's to stop)."""
        try:
            await close_clients(self.clients)
        finally:
            await asyncio.gather(*(n.stop() for n in self.nodes), return_exceptions=True)
            for n in self.nodes:
                n.kill()
            for m in self.redis:
                await m.conn.aclose()


def pin_threads(pid: int, core: int) -> None:
    """Every thread of ``pid`` on ``core`` (setting a process's affinity moves its first thread
    only, not the threads it started before: Redis's bio threads)."""
    for task in glob.glob(f"/proc/{pid}/task/*"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(os.path.basename(task)), {core})


async def redis_info(m: ShardMaster) -> dict[str, Any]:
    """A master's ``INFO commandstats`` (each command's calls and microseconds), ``clients``
    and ``stats`` (connections made) at once."""
    info: dict[str, Any] = await m.conn.execute_command("INFO", "commandstats", "clients", "stats")
    return info


def cmdstat(info: dict[str, Any], command: str, key: str = "calls") -> int:
    """One figure of ``INFO commandstats`` (0 for a command not run yet)."""
    return int(info.get(f"cmdstat_{command}", {}).get(key, 0))


async def shard_window(
    runs: list[tuple[Shards, int]], warmup: float, measure: float
) -> dict[str, Any]:
    """Every configuration of ``runs`` at its rate (publishes/s: half from each of its nodes,
    one message at a time, topic after topic) at once, ``measure`` seconds measured after
    ``warmup``; the figures of each and the ratio of the second's to the first's."""
    masters = [m for cfg, _ in runs for m in cfg.redis]
    # each node's spread run: R rounds/s of one message to each topic, one at a time
    starts = [(p, rate / len(cfg.ports) / SHARD_TOPICS) for cfg, rate in runs for p in cfg.ports]
    ports = [p for p, _ in starts]
    limit = 10 * (warmup + measure) + 30  # a safety net: stopped after the window
    for cfg, _ in runs:
        cfg.rec.reset()
    try:
        await asyncio.gather(
            *(
                http(p, "POST", f"/control/start?mode=spread&rate={r:.6f}&seconds={limit}")
                for p, r in starts
            )
        )
        await asyncio.sleep(warmup)
        # INFO first at the start and last at the end: its own cost stays out of the CPU window
        i0 = await asyncio.gather(*(redis_info(m) for m in masters))
        r0 = [proc_cpu_s(m.pid) for m in masters]
        s0 = await asyncio.gather(*(http(p, "GET", "/control/stats?mark=1") for p in ports))
        c0, k0, t0 = load_cpu(), cpu_ticks(), time.monotonic_ns()
        n0 = [cfg.rec.count for cfg, _ in runs]
        for cfg, _ in runs:
            cfg.rec.recording = True
        await asyncio.sleep(measure)
        for cfg, _ in runs:
            cfg.rec.recording = False
        t1, c1, k1 = time.monotonic_ns(), load_cpu(), cpu_ticks()
        n1 = [cfg.rec.count for cfg, _ in runs]
        r1 = [proc_cpu_s(m.pid) for m in masters]
        i1 = await asyncio.gather(*(redis_info(m) for m in masters))
        s1 = await asyncio.gather(*(http(p, "GET", "/control/stats") for p in ports))
    finally:
        await asyncio.gather(
            *(http(p, "POST", "/control/stop") for p in ports), return_exceptions=True
        )
    await asyncio.gather(*(drain(cfg.rec) for cfg, _ in runs))

    wall = (t1 - t0) / 1e9
    figures = [
        master_figures(m, a, b, y - x, wall)
        for m, a, b, x, y in zip(masters, i0, i1, r0, r1, strict=True)
    ]
    nodes = [node_figures(a, b) for a, b in zip(s0, s1, strict=True)]
    pubs = [(a["publisher"], b["publisher"]) for a, b in zip(s0, s1, strict=True)]
    # masters, nodes and their answers in the order of ``runs``: each configuration's in turn
    each_figures, each_node, each_pubs = iter(figures), iter(nodes), iter(pubs)
    results = [
        shard_figures(
            cfg,
            rate,
            [next(each_figures) for _ in cfg.redis],
            [next(each_node) for _ in cfg.nodes],
            [next(each_pubs) for _ in cfg.nodes],
            b - a,
            wall,
        )
        for (cfg, rate), a, b in zip(runs, n0, n1, strict=True)
    ]
    load_pct = (c1 - c0) / wall * 100
    machine = core_usage(k0, k1)
    ours = {
        SERVER_CORE: sum(r["node_cpu_pct"] for r in results),
        LOAD_CORE: load_pct + sum(r["redis_cpu_pct"] for r in results),
    }
    other = {f"cpu{c}": machine.get(f"cpu{c}_busy_pct", 0.0) - used for c, used in ours.items()}
    saturated = [c for c, used in ours.items() if machine.get(f"cpu{c}_busy_pct", 0.0) >= 90]
    first, second = results[0]["per_cpu_s"], results[-1]["per_cpu_s"]
    return {
        "rates": [rate for _, rate in runs],
        "configs": results,
        # publishes per Redis CPU-second, the second configuration's over the first's
        "ratio": round(second / first, 3) if first and second is not None else None,
        "load_cpu_pct": round(load_pct, 1),
        "saturated_cores": saturated,
        "other_cpu_pct": {k: round(v, 1) for k, v in other.items()},
        "machine": machine,
        "window_s": round(wall, 3),
    }


def master_figures(
    m: ShardMaster, a: dict[str, Any], b: dict[str, Any], cpu: float, wall: float
) -> dict[str, Any]:
    """One master's figures over a window: ``a`` and ``b`` its commandstats before and after,
    ``cpu`` the CPU-seconds of its threads meanwhile."""
    # every publish the script numbers is one SPUBLISH on its partition's master (nothing
    # else here publishes on a sharded channel): counted by Redis over the window, where the
    # publisher's turn through the topics, cut by the window, would be off by part of a round
    published = cmdstat(b, "spublish") - cmdstat(a, "spublish")
    calls = cmdstat(b, "evalsha") - cmdstat(a, "evalsha")
    script_us = cmdstat(b, "evalsha", "usec") - cmdstat(a, "evalsha", "usec")
    return {
        "port": m.port,
        "cpu_pct": round(cpu / wall * 100, 2),
        "publishes": published,
        "topic_share": round(m.topic_share, 3),
        "script_calls": calls,
        "publishes_per_call": round(published / calls, 2) if calls else None,
        "cpu_us_per_publish": round(cpu / published * 1e6, 1) if published else None,
        "script_us_per_call": round(script_us / calls, 1) if calls else None,
        # what of its CPU went to running the scripts (the rest: reading the calls, writing
        # the answers and the messages, waking up, its cron)
        "script_cpu_share": round(script_us / 1e6 / cpu, 2) if cpu > 0 else None,
        "per_cpu_s": round(published / cpu) if cpu > 0 else None,
        # the nodes' connections to it, and how many it accepted in the window (a pool that
        # does not keep its connections would show here)
        "clients": b["connected_clients"],
        "connections_opened": b["total_connections_received"] - a["total_connections_received"],
    }


def shard_figures(
    cfg: Shards,
    rate: int,
    masters: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    pubs: list[tuple[dict[str, Any], dict[str, Any]]],
    delivered: int,
    wall: float,
) -> dict[str, Any]:
    """One configuration's figures over a window."""
    total = sum(m["publishes"] for m in masters)
    for m in masters:
        m["share"] = round(m["publishes"] / total, 3) if total else None
    # what went wrong on the way, on both nodes: publishes the broker refused, masters not
    # answering, holes caught up from the history, topics numbered afresh
    broker = {
        key: sum(b["broker"][key] - a["broker"][key] for a, b in pubs)
        for key in ("refused", "outages", "fetched", "restarted")
    }
    broker["pending_peak"] = max(b["broker"]["pending_peak"] for _, b in pubs)
    per_cpu = [m["per_cpu_s"] for m in masters]
    lat = sorted(cfg.rec.lat)
    return {
        "config": cfg.name,
        "masters": cfg.masters,
        "target_publishes_per_s": rate,
        "publishes_per_s": round(sum(b["accepted"] - a["accepted"] for a, b in pubs) / wall),
        "numbered_per_s": round(total / wall),
        "delivered_per_s": round(delivered / wall),
        "latency_p50_ms": ms(pct(lat, 0.50)),
        "latency_p99_ms": ms(pct(lat, 0.99)),
        "latency_max_ms": ms(pct(lat, 1.0)),
        "gaps": cfg.rec.gaps,
        "redis": masters,
        "redis_cpu_pct": round(sum(m["cpu_pct"] for m in masters), 2),
        # what the masters would number per CPU-second each, added: with a core each, the
        # publishes the configuration's Redis would take at this rate a master
        "per_cpu_s": None if None in per_cpu else sum(per_cpu),
        "max_share": max((m["share"] or 0.0) for m in masters),
        "nodes": [{"cpu_pct": n["cpu_pct"], "gc_ms": n["gc_ms"]} for n in nodes],
        "node_cpu_pct": round(sum(n["cpu_pct"] for n in nodes), 1),
        "broker": broker,
        "refused": sum(b["refused"] - a["refused"] for a, b in pubs),
    }


def joined(values: list[Any], spec: str, sep: str = " + ") -> str:
    return sep.join(fmt(v, spec) for v in values)


def each_master(r: dict[str, Any], key: str, spec: str, sep: str = " + ") -> str:
    """``key`` of every master of a configuration's window figures, joined."""
    return joined([m[key] for m in r["redis"]], spec, sep)


def describe_shards(w: dict[str, Any]) -> str:
    """A window of the shards run: a line per configuration, then the ratio."""
    lines = []
    for r in w["configs"]:
        line = (
            f"shards  {r['config']:<9} @{r['target_publishes_per_s']:>5,}/s numbered "
            f"{r['numbered_per_s']:>5,}/s delivered {r['delivered_per_s']:>5,}/s "
            f"| latency p50 {fmt(r['latency_p50_ms'], '.2f')} p99 "
            f"{fmt(r['latency_p99_ms'], '.2f')} ms | redis {each_master(r, 'cpu_pct', '.1f')} % "
            f"CPU, {each_master(r, 'cpu_us_per_publish', '.1f')} us/publish, "
            f"{each_master(r, 'publishes_per_call', '.2f')} publishes/call"
            + (f", shares {each_master(r, 'share', '.2f', ' / ')}" if r["masters"] > 1 else "")
            + f" | nodes {r['node_cpu_pct']:.0f}%"
        )
        trouble = {k: v for k, v in r["broker"].items() if k != "pending_peak" and v}
        if r["refused"] or r["gaps"] or trouble:
            line += f" | refused {r['refused']}, GAPs {r['gaps']}, broker {trouble}"
        lines.append(line)
    last = (
        f"        publishes per Redis CPU-second {w['configs'][-1]['per_cpu_s'] or 0:,} / "
        f"{w['configs'][0]['per_cpu_s'] or 0:,} = {fmt(w['ratio'], '.2f')} | load "
        f"{w['load_cpu_pct']:.0f}%"
    )
    if w["saturated_cores"]:
        last += f" | SATURATED: core {', '.join(map(str, w['saturated_cores']))}"
    if noisy(w):
        last += " | NOISY: other work on " + ", ".join(
            f"{k} {v:.0f}%" for k, v in w["other_cpu_pct"].items() if v > NOISY_PCT
        )
    return "\n".join([*lines, last])


async def measure_shards(args: argparse.Namespace, pin: bool) -> dict[str, Any]:
    """``redis_shards_2_vs_1`` and ``max_shard_share``: a Redis Cluster of one master and one
    of two, up at once, each with its own two nodes and clients, driven at once."""
    started = time.monotonic()
    rate = args.shards_rate
    one, two = Shards(1), Shards(2)
    # each window drives both: every master at the same rate (the headline), or both
    # configurations at the same total rate (each of the two masters then numbers half)
    kinds = [[(one, rate), (two, 2 * rate)], [(one, rate), (two, rate)]]
    windows: list[dict[str, Any]] = []
    ping_task: asyncio.Task[None] | None = None
    with contextlib.ExitStack() as stack:
        # started one after the other, blocking (2 s each): a start under way in a thread
        # could not be stopped by a Ctrl-C meanwhile, and would leave its servers behind
        clusters = [
            stack.enter_context(
                RedisCluster(
                    cfg.masters,
                    appendonly=False,  # topics only: nothing here needs a restart's keys
                    args=("--cluster-require-full-coverage", "no"),
                )
            )
            for cfg in (one, two)
        ]
        try:
            for cfg, cluster in zip((one, two), clusters, strict=True):
                await cfg.start(cluster, args, pin)
            LOAD_GC.collect()
            gc.freeze()  # the clients are long-lived: keep them out of the load's gc passes
            ping_task = asyncio.get_running_loop().create_task(pinger(one.clients + two.clients))
            print(
                f"shards: a Redis Cluster of 1 master and one of 2 (no persistence), each with "
                f"{SHARD_NODES} nodes publishing to {SHARD_TOPICS:,} ring topics one message at "
                f"a time and {len(one.clients)} clients, one subscriber a topic; both driven in "
                "each window; "
                + (
                    f"the 4 nodes on core {SERVER_CORE}, the 3 masters and the load on core "
                    f"{LOAD_CORE}"
                    if pin
                    else "not pinned"
                ),
                flush=True,
            )
            # unmeasured: a fresh node's first window costs it more; and BROKER_SWEEP seconds
            # after it starts a node checks the position of every topic it follows (then once
            # a minute), their live messages waiting meanwhile for their history to be read,
            # which the first 5 s window would otherwise hold, weighed twelve times
            ready = max(c.started_at for c in (one, two)) + BROKER_SWEEP + 1.0
            await shard_window(kinds[0], max(0.5, ready - time.monotonic()), 1.0)
            budget = Budget(SHARD_BUDGET_S[0 if args.quick else 1], args.repeat * len(kinds))
            for rep in range(args.repeat):
                k = rep % len(kinds)
                for runs in kinds[k:] + kinds[:k]:
                    w = await least_noisy(
                        lambda runs=runs: shard_window(runs, args.warmup, args.measure),
                        describe_shards,
                        args,
                        budget,
                    )
                    w["rep"] = rep + 1
                    windows.append(w)
        finally:
            if ping_task is not None:
                ping_task.cancel()
            gc.unfreeze()
            await asyncio.gather(one.stop(), two.stop(), return_exceptions=True)
    out = shards_summary(windows, rate)
    out["cores"] = {"nodes": SERVER_CORE, "masters_and_load": LOAD_CORE} if pin else None
    out["duration_s"] = round(time.monotonic() - started, 1)
    for line in shards_verdict(out):
        print(line, flush=True)
    return out


def shards_summary(windows: list[dict[str, Any]], rate: int) -> dict[str, Any]:
    """The shards run's figures: medians over the windows, each a ratio of two configurations
    measured at the same time."""
    scaled = [w for w in windows if w["rates"] == [rate, 2 * rate]]
    equal = [w for w in windows if w["rates"] == [rate, rate]]

    def config(ws: list[dict[str, Any]], i: int) -> dict[str, Any]:
        """Configuration ``i`` of windows ``ws``: medians, each master's apart."""
        rs = [w["configs"][i] for w in ws]

        def med(key: str) -> float | None:
            return median([r[key] for r in rs if r[key] is not None])

        def each(key: str) -> list[float | None]:
            masters = len(rs[0]["redis"]) if rs else 0
            return [
                median([r["redis"][j][key] for r in rs if r["redis"][j][key] is not None])
                for j in range(masters)
            ]

        return {
            "rate": rs[0]["target_publishes_per_s"] if rs else None,
            "numbered_per_s": med("numbered_per_s"),
            "latency_p50_ms": med("latency_p50_ms"),
            "latency_p99_ms": med("latency_p99_ms"),
            "per_cpu_s": med("per_cpu_s"),
            "node_cpu_pct": med("node_cpu_pct"),
            "redis_cpu_pct": each("cpu_pct"),
            "cpu_us_per_publish": each("cpu_us_per_publish"),
            "publishes_per_call": each("publishes_per_call"),
            "script_us_per_call": each("script_us_per_call"),
            "script_cpu_share": each("script_cpu_share"),
            "share": each("share"),
            "topic_share": each("topic_share"),
            "refused": sum(r["refused"] for r in rs),
            "gaps": sum(r["gaps"] for r in rs),
            "broker": {
                k: sum(r["broker"][k] for r in rs) for k in ("outages", "fetched", "restarted")
            },
        }

    ratios = [w["ratio"] for w in scaled if w["ratio"] is not None]
    at_equal = [w["ratio"] for w in equal if w["ratio"] is not None]
    m_ratio = median(ratios)
    share = median([w["configs"][1]["max_share"] for w in scaled])
    one, two = config(scaled, 0), config(scaled, 1)
    p99s = [one["latency_p99_ms"], two["latency_p99_ms"]]
    return {
        "topics": SHARD_TOPICS,
        "partitions": PARTITIONS,
        "nodes": SHARD_NODES,
        "clients": SHARD_TOPICS // SHARD_TOPICS_PER_CLIENT,
        "rate_per_master": rate,
        "redis_shards_2_vs_1": rounded_or_none(m_ratio, 2),
        "redis_shards_2_vs_1_windows": [round(x, 2) for x in ratios],
        "redis_shards_2_vs_1_at_equal_rate": rounded_or_none(median(at_equal), 2),
        "redis_shards_2_vs_1_at_equal_rate_windows": [round(x, 2) for x in at_equal],
        "max_shard_share": rounded_or_none(share, 3),
        "same_p99": None
        if None in p99s or not min(p99s)
        else max(p99s) / min(p99s) <= SHARD_P99_SPREAD,
        "one_master": one,
        "two_masters": two,
        "equal_rate_one_master": config(equal, 0),
        "equal_rate_two_masters": config(equal, 1),
        "noisy_windows": sum(1 for w in windows if noisy(w)),
        "windows": windows,
    }


def rounded_or_none(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def shards_verdict(h: dict[str, Any]) -> list[str]:
    """The shards run's figures in words, against the issue's targets."""
    rate = h["rate_per_master"]
    out = [
        f"shards: {h['topics']:,} ring topics over {h['partitions']} partitions, "
        f"{h['nodes']} nodes publishing, {h['clients']} clients a configuration; medians of "
        "the windows:"
    ]
    rows = (
        ("scaled  1 master", h["one_master"]),
        ("scaled  2 masters", h["two_masters"]),
        ("equal   1 master", h["equal_rate_one_master"]),
        ("equal   2 masters", h["equal_rate_two_masters"]),
    )
    for label, c in rows:
        if c["per_cpu_s"] is None:
            continue
        out.append(
            f"  {label:<17} @{c['rate']:>5,}/s p99 {fmt(c['latency_p99_ms'], '.2f')} ms, Redis "
            f"CPU {joined(c['redis_cpu_pct'], '.1f')} %: {joined(c['cpu_us_per_publish'], '.1f')}"
            f" us a publish ({joined(c['script_us_per_call'], '.1f')} us of it in the script, "
            f"{joined(c['publishes_per_call'], '.2f')} publishes a call), "
            f"{c['per_cpu_s']:,.0f} publishes per Redis CPU-second; nodes "
            f"{c['node_cpu_pct']:.0f} %"
        )
    scale = h["redis_shards_2_vs_1"]
    if scale is None:
        return [*out, "redis_shards_2_vs_1: not measured"]
    share = h["max_shard_share"]
    out += [
        f"redis_shards_2_vs_1 = {scale:.2f}, median of {h['redis_shards_2_vs_1_windows']}: "
        f"publishes per Redis CPU-second summed over the 2 masters at {2 * rate:,}/s over the "
        f"single master's at {rate:,}/s, measured at the same time (target >= "
        f"{SHARD_SCALE_TARGET}: {'met' if scale >= SHARD_SCALE_TARGET else 'NOT met'})",
        f"  at the same total rate ({rate:,}/s, each of the 2 masters numbering half what "
        f"the 1 does): {fmt(h['redis_shards_2_vs_1_at_equal_rate'], '.2f')}, median of "
        f"{h['redis_shards_2_vs_1_at_equal_rate_windows']}",
        f"max_shard_share = {share:.3f} (the topics' partitions give "
        f"{joined(h['two_masters']['topic_share'], '.3f', ' / ')}; target <= "
        f"{SHARD_SHARE_TARGET}: {'met' if share <= SHARD_SHARE_TARGET else 'NOT met'})",
        f"  p99 {fmt(h['one_master']['latency_p99_ms'], '.2f')} ms (1 master) and "
        f"{fmt(h['two_masters']['latency_p99_ms'], '.2f')} ms (2 masters): "
        + (
            f"the same within {SHARD_P99_SPREAD:.0f}x"
            if h["same_p99"]
            else f"NOT the same (more than {SHARD_P99_SPREAD:.0f}x apart)"
        ),
    ]
    trouble = [
        f"{label} @{c['rate']:,}/s: {what} {n}"
        for label, c in rows
        for what, n in (("refused", c["refused"]), ("GAPs", c["gaps"]), *c["broker"].items())
        if n
    ]
    if trouble:
        out.append("  the nodes' broker: " + ", ".join(trouble))
    return out


async def amain(args: argparse.Namespace, pin: bool) -> dict[str, Any]:
    started = time.monotonic()
    configs = [c for c in configurations(args.split) if c.name in args.configs.split(",")]
    with contextlib.ExitStack() as stack:
        # a redis-server per Redis configuration: every configuration's nodes are up at once,
        # and Redis's pub/sub channels are server-wide, so a shared one would hand redis1's
        # publishes to redis2's nodes too
        for c in configs:
            if c.name != "local":
                c.redis = stack.enter_context(RedisServer())
                if pin and c.redis.pid is not None:
                    os.sched_setaffinity(c.redis.pid, {LOAD_CORE})
        await run(configs, args, pin)
    moves = None if args.no_settle else await settle(args, pin)
    shards = None if args.no_shards else await measure_shards(args, pin)
    queues = None
    if not args.no_queues:  # bench/queues_redis.py's alternation (--quick: one round)
        print("--- queues: one node alone, then its queue in Redis", flush=True)
        queues = await measure_queues(
            queues_parser().parse_args(["--rounds", "1"] if args.quick else []), pin
        )
    head = headline(configs, args)
    head["settle_1000_s"] = None if moves is None else moves["settle_s"]
    head["queue_redis_vs_local"] = None if queues is None else queues["queue_redis_vs_local"]
    for key in ("redis_shards_2_vs_1", "max_shard_share"):
        head[key] = None if shards is None else shards[key]
    print(table(configs, head, args), flush=True)
    return {
        "bench": "scaleout",
        "cores": os.cpu_count(),
        "pinned": {c.name: c.cores for c in configs} if pin else None,
        "load_core": LOAD_CORE,
        "redis_core": LOAD_CORE,
        "python": sys.version.split()[0],
        "clients": CLIENTS,
        "topics": TOPICS,
        "publish": "spread" if args.spread else "rounds",
        "window_rounds": args.window,
        "repeat": args.repeat,
        "warmup_s": args.warmup,
        "measure_s": args.measure,
        "duration_s": round(time.monotonic() - started, 1),
        "noisy_phases": sum(1 for c in configs for r in c.results if noisy(r)),
        "headline": head,
        "settle": moves,
        "shards": shards,
        "queues": queues,
        "results": [r for c in configs for r in c.results],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="shorter windows (about a minute)")
    ap.add_argument("--warmup", type=float, default=None, help="seconds before each window")
    ap.add_argument("--measure", type=float, default=None, help="seconds measured per window")
    ap.add_argument("--repeat", type=int, default=None, help="windows per configuration and phase")
    ap.add_argument(
        "--rate", type=int, default=RATE, help="the fixed phase's deliveries/s (all configs)"
    )
    ap.add_argument(
        "--spread",
        action="store_true",
        help="fixed phase: one message at a time, evenly, instead of each round at once",
    )
    ap.add_argument("--window", type=int, default=8, help="max phase: rounds on their way at most")
    ap.add_argument(
        "--split",
        action="store_true",
        help="redis2: node B on core 1 with the load and Redis (default: both nodes on core 0)",
    )
    ap.add_argument(
        "--configs",
        default="local,redis1,redis2,carried",
        help="which configurations, comma-separated (the headline needs all four)",
    )
    ap.add_argument(
        "--no-settle", action="store_true", help="skip the settle measurement (about 15 s)"
    )
    ap.add_argument(
        "--no-shards",
        action="store_true",
        help="skip the Redis Cluster run, 1 master against 2 (about a minute, --quick 30-40 s)",
    )
    ap.add_argument(
        "--shards-rate",
        type=int,
        default=SHARD_RATE,
        help="shards run: publishes/s each master numbers in the headline's windows",
    )
    ap.add_argument(
        "--no-queues",
        action="store_true",
        help="skip the work-queue run (bench/queues_redis.py's, about a minute)",
    )
    ap.add_argument(
        "--phases", default="fixed,max", help="fixed and/or max (the headline needs both)"
    )
    ap.add_argument("--decode", choices=["fast", "full"], default="fast", help="as fanout.py")
    ap.add_argument(
        "--noisy-retries",
        type=int,
        default=1,
        help="measure a window again (up to N times) when other processes used our cores",
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds the windows may take in all: noisy windows are measured again only "
        "within it (default 240, --quick 60)",
    )
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        help="before each window, wait up to this many seconds for both cores to be idle",
    )
    args = ap.parse_args()
    quick_or_full(
        args,
        {
            "warmup": (0.5, 1.0),
            "measure": (2.5, 5.0),
            "quiet_wait": (2.0, 3.0),
            "repeat": (2, 3),
            "budget": (60.0, 240.0),
        },
    )
    pin = prepare_load(
        f"scaleout: cores={os.cpu_count()} python={sys.version.split()[0]} "
        f"{CLIENTS:,} clients x {TOPICS} topics, fixed rate {args.rate:,}/s "
        f"({'spread' if args.spread else 'rounds at once'}), {args.repeat} windows each, "
        f"warm-up {args.warmup} s, measured {args.measure} s"
    )
    try:
        summary = uvloop.run(amain(args, pin))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    print(json.dumps(summary, separators=(",", ":"), allow_nan=False), flush=True)
    h = summary["headline"]

    def kv(key: str, digits: int) -> str:
        v = h[key]
        return f"{key}={'nan' if v is None else f'{v:.{digits}f}'}"

    print(
        " ".join(
            [
                kv("redis_cpu_overhead_pct", 1),
                kv("two_workers_vs_one", 2),
                kv("carried_vs_local_per_cpu", 2),
                kv("settle_1000_s", 2),
                kv("queue_redis_vs_local", 2),
                kv("redis_shards_2_vs_1", 2),
                kv("max_shard_share", 2),
            ]
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()

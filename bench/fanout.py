"""Fan-out benchmark over real sockets: one server process, one load process, 127.0.0.1 only.

Not a test. The server runs in a subprocess pinned to core 0: a Starlette app with Rubris
mounted at /rubris (bench/_fanout_server.py), on one ASGI server process chosen with
``--server`` (bench/_servers.py has the details; on each: one worker, lifespan on, no access
log, no permessage-deflate, no server WebSocket ping):

    uvicorn    (default) uvloop, httptools and the ``websockets-sansio`` WebSocket implementation
    hypercorn  ``hypercorn.asyncio.serve`` on uvloop
    granian    interface asgi, 1 worker, its default runtime threads; the app runs in granian's
               worker, a child of the process the bench starts: the pin to core 0 is inherited
               by it and its Rust threads, and the server CPU figures are that worker's,
               threads included (getrusage in the worker)

This process is the load, pinned to core 1: N WebSocket clients (bench/_fanout_load.py) in one
uvloop event loop. So the server and everything it runs (its event loop, granian's Rust
threads, granian's mostly idle main process) share core 0, and the load has core 1 to itself.

``--app plain`` serves the plain-loop baseline (bench/_fanout_plain.py) instead of Rubris: a
plain Starlette broadcast loop, what a team writes without Rubris (a WebSocket endpoint that
keeps its sockets in a set; a round encodes one PUSH frame per topic and awaits
``ws.send_bytes(frame)`` for each client in turn), speaking the same wire format and answering
the same control endpoints, so the same load measures it.

Every client subscribes to *all* T ring topics ``bench.0`` .. ``bench.{T-1}`` (ring of 1024, so
nothing is conflated and every delivery counts), unless ``--per-client K`` (with ``--clients``)
has each take K of them in a ring: client i takes ``bench.{(i + j) % T}`` for j < K, so each topic
has N * K / T subscribers, and a round is N * K deliveries (both servers send a topic's message
to its subscribers only); ``--snapshot`` (with ``--clients``) makes them snapshot topics, where
a client gets the latest value and what it missed is conflated: offered beyond what the
server frames, deliveries drop and latency stays put (the overload case: ``--snapshot
--clients 1000 --topics 10 --phases 1000000``). "1,000 clients x 10 topics" is therefore 10,000
subscriptions, and one publish *round* (one message to each topic) is 10,000 deliveries. The
wide cases are 5,000 clients x 10 topics (50,000 subscriptions, up to 10 messages a frame) and
5,000 clients x 1 topic (one message a frame: the per-frame cost). Payloads are ~80-byte orjson
``{"t": <CLOCK_MONOTONIC ns>, "i": <round>, "pad": "xxx..."}``, not compressed.

Each case starts a fresh server, measures its RSS, connects the clients, measures its RSS again,
then runs its phases. Each phase publishes through warm-up and the measured window:

    max     closed loop: the server's publisher sends a round whenever fewer than 2 rounds of
            deliveries wait to be framed, i.e. as fast as the server frames and writes them
            (the plain loop: rounds back to back, every send of one awaited before the next)
    half    open loop at half the delivered rate that ``max`` measured
    <rate>  open loop at that many deliveries/s; 1,000 x 10 runs 200000 (the target) and
            100000 (half the target, the latency figure the target names)

Open-loop rounds are stamped with their scheduled time, so a server that falls behind (and so
delays its own publisher) shows as latency (no coordinated omission). A phase is ``sustained``
when it lost nothing to a lapped ring (GAP) and, open loop, the clients received >= 90 % of the
offered rate with latency p99 under 1 s; closed loop, when everything published arrived. If the
load process saturates instead of the server (``load_cpu_pct`` ~100, ``bottleneck: load``), the
figure is the load's limit, not the server's.

Figures per phase: delivered messages/s (counted by the clients), publish-to-receive latency
p50/p99, cross-client skew p50/p99 (for one message, last receive minus first receive across
the clients that got it; every message is sampled with >= 500 clients, every 8th seq below),
server CPU seconds per million deliveries and server CPU % (its own window, from getrusage),
deliveries per server CPU-second (delivered/s over the server's CPU fraction), load CPU %, the
server's garbage-collection time, per-core use of the machine, and server RSS per connection
((RSS after connecting - RSS before) / N, after a gc in the server; includes the session and
its subscriptions, and the server's own buffers; in KiB of 1,024 bytes: the JSON's
``server_rss_per_conn_kb`` has always been KiB too, ``server_rss_per_conn_kib`` is the same figure
with 3 decimals). A window in which other processes used one of
the two cores is marked ``NOISY`` and measured again (``--noisy-retries``, default 1); before
each phase the run waits (``--quiet-wait``, up to 5 s) for both cores to be idle.

    python3 bench/fanout.py            # full run, about 2 minutes
    python3 bench/fanout.py --quick    # 100 x 10 and 1,000 x 10, shorter phases, about 30 s
    python3 bench/fanout.py --server granian --app plain --clients 1000 --topics 1 \
        --phases max,10000            # one custom case, any server and app

The last line of output is one JSON object with every figure.

    python3 bench/fanout.py --compare-servers     # about 3-5 minutes

compares the servers side by side: Rubris 1,000 clients x 1 topic (10,000 deliveries/s = 10
messages/s, then max), the plain loop 1,000 x 1 (the same phases) and Rubris 1,000 x 10
(50,000/s, then max), each case on uvicorn, hypercorn and granian in turn (case by case, the
servers' order turned by one each case), 1 s warm-up and 5 s measured per phase. It prints a
table: per server and phase, delivered/s, server CPU %, deliveries per server CPU-second
(delivered/s divided by the server's CPU fraction: in ``max`` the server is saturated, in the
fixed phases it includes the server's fixed costs), latency p50/p99, skew p99 and whether the
phase was sustained; then, per server, Rubris's latency p99 over the plain loop's at 1,000 x 1,
10,000/s. Then the JSON object, and as the last line
``uvicorn_per_cpu_s=N hypercorn_per_cpu_s=N granian_per_cpu_s=N``: Rubris's deliveries per
server CPU-second at 1,000 x 1, max phase (0 for a server that failed the case).

    python3 bench/fanout.py --compare-plain           # about 7 minutes (3 rounds)
    python3 bench/fanout.py --compare-plain --quick   # about 4 minutes (2 rounds, 0.5 s
                                                     # warm-up and 3 s measured per phase)

sets Rubris against the plain loop on uvicorn, side by side in one run, for three cases:

    1,000 clients x 1 topic         open loop 10,000 deliveries/s, then max (closed loop: here
                                    Rubris's publisher keeps one round waiting, not two, as
                                    the plain loop sends its rounds one after the other)
    1,000 clients x 10 topics       open loop 50,000 deliveries/s
    10,000 clients, 2 of 10 topics  each topic 2,000 subscribers, 1 message/s per topic:
                                    open loop 20,000 deliveries/s, one burst a second

Each round (``--rounds``, default 3, ``--quick`` 2) runs every case for Rubris, then for the
plain loop, each on a fresh server (pinned, NOISY phases measured again, as above), so each
round gives one ratio rubris / plain measured side by side, and the medians of those ratios
are the figures. The times above are a quiet machine's: NOISY phases measured again and the
waits for idle cores add to them, and each 10,000-client connect takes about 20 s. At one
round a second the window starts half a second after a burst and holds whole seconds, so no
burst is cut at either end. 10,000 sockets: both processes raise their
open-file limit to its hard limit, and the clients connect 200 at a time
(``--connect-concurrency``; the server's per-connection cost, about 2 ms of its core, bounds
this to ~20 s). The load's garbage collector is off while the clients are connected
(``--load-gc``, default off here, on elsewhere): with 10,000 clients its pauses (100 ms and
more) would be counted as the servers' latency. It prints a table: per case, phase, round and
app, delivered/s, server CPU %, deliveries per server CPU-second, latency p50/p99, server RSS
per connection (KiB), the load's CPU % (a note when the load, not the server, saturated), and
the per-app medians; then each round's ratios rubris / plain (deliveries per server CPU-second,
delivered/s, latency p99) and their medians. Then the JSON object (``plain_comparison``), and
as the last line

    per_cpu_vs_plain_1x1=R max_vs_plain_1x1=R per_cpu_vs_plain_1x10=R p99_10k_ms=N kib_per_conn=N

the median over rounds of rubris / plain deliveries per server CPU-second at 1,000 x 1 10,000/s,
at 1,000 x 1 max and at 1,000 x 10 50,000/s; rubris's median latency p99 (ms) and its server
RSS per connection (KiB) in the 10,000-client case (``nan`` for a figure that failed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import resource
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import uvloop

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from _fanout_load import (  # noqa: E402
    Client,
    GcTimer,
    Recorder,
    close_clients,
    open_clients,
    pinger,
)
from _servers import BENCH_PID_ENV, SERVERS  # noqa: E402

SERVER = os.path.join(HERE, "_fanout_server.py")
PLAIN = os.path.join(HERE, "_fanout_plain.py")
APPS = {"rubris": SERVER, "plain": PLAIN}
TARGET_DELIVERED = 200_000
MAIN_PHASES = ["max", "half", str(TARGET_DELIVERED), str(TARGET_DELIVERED // 2)]
SERVER_CORE = 0
LOAD_CORE = 1
LOAD_GC = GcTimer()
NOISY_PCT = 15.0
"""Busy % of a core beyond what our process on it used: other work was running there."""


@dataclass
class Case:
    clients: int
    topics: int
    phases: list[str]
    results: list[dict[str, Any]] = field(default_factory=list)
    per_client: int = 0
    """Topics each client subscribes to, K of the T in a ring (0: all of them)."""
    snapshot: bool = False
    """Snapshot topics instead of rings (``--snapshot``): a client gets the latest value."""
    window: int = 2
    """``max``: the rounds the server's publisher keeps waiting to be framed (``--compare-plain``:
    1, as the plain loop, whose rounds go back to back, every send of one awaited first)."""
    round: int = 0
    """``--compare-plain``: which round of the comparison the case belongs to (from 1)."""
    quiet_wait_s: float = 0.0
    server: str = "uvicorn"
    app: str = "rubris"
    label: str = ""
    """Printed before each of the case's lines (``--compare-servers``, a non-default server)."""
    error: str | None = None


# --------------------------------------------------------------------------- control channel


async def http(port: int, method: str, path: str, timeout: float = 60.0) -> Any:
    """One HTTP/1.1 request to the server's control endpoints; returns the JSON body."""

    async def go() -> Any:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            data = await reader.read()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        head, _, body = data.partition(b"\r\n\r\n")
        status = head.split(b" ", 2)[1]
        if status != b"200":
            raise RuntimeError(f"{method} {path}: HTTP {status.decode()}: {body[:200]!r}")
        return orjson.loads(body)

    return await asyncio.wait_for(go(), timeout)


class Server:
    """The server subprocess: started per case, stopped (SIGTERM, then SIGKILL) after it."""

    def __init__(self, args: list[str], pin: bool, script: str = SERVER) -> None:
        self.argv = [sys.executable, script, *args]
        if pin:
            self.argv += ["--cpu", str(SERVER_CORE)]
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0

    async def start(self) -> None:
        args = self.argv
        # its own session: a Ctrl-C in the terminal reaches only this process, which then stops
        # the server itself (SIGTERM); the server also exits if this process disappears (it
        # watches the pid in BENCH_PID_ENV: granian's worker is not our child)
        env = {**os.environ, BENCH_PID_ENV: str(os.getpid())}
        self.proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, start_new_session=True, env=env
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        if not line.startswith(b"PORT "):
            raise RuntimeError(f"server did not start: {line!r}")
        self.port = int(line.split()[1])
        deadline = time.monotonic() + 30
        while True:
            try:
                await http(self.port, "GET", "/control/stats")
                return
            except (OSError, RuntimeError, asyncio.TimeoutError):
                if time.monotonic() > deadline or self.proc.returncode is not None:
                    raise
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except asyncio.TimeoutError:
            self.kill()
            await proc.wait()

    def kill(self) -> None:
        """SIGKILL the server and whatever it started (granian's worker): its process group,
        which is its own (``start_new_session``) while it has not been waited for."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()


# --------------------------------------------------------------------------- measuring


def load_rss() -> int:
    """This process's resident set, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def load_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def cpu_ticks() -> dict[str, list[int]]:
    """Per-core busy and steal jiffies from /proc/stat: is anything else using our cores?"""
    out: dict[str, list[int]] = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *vals = line.split()
                v = [int(x) for x in vals]
                idle = v[3] + v[4]
                out[name] = [sum(v[:8]) - idle, sum(v[:8]), v[7], v[6]]
    return out


def core_usage(a: dict[str, list[int]], b: dict[str, list[int]]) -> dict[str, float]:
    usage: dict[str, float] = {}
    for name in sorted(b):
        busy = b[name][0] - a[name][0]
        total = b[name][1] - a[name][1]
        steal = b[name][2] - a[name][2]
        softirq = b[name][3] - a[name][3]
        usage[f"{name}_busy_pct"] = round(100 * busy / total, 1) if total else 0.0
        usage[f"{name}_steal_pct"] = round(100 * steal / total, 1) if total else 0.0
        usage[f"{name}_softirq_pct"] = round(100 * softirq / total, 1) if total else 0.0
    return usage


def pct(sorted_values: list[int], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return float(sorted_values[i])


def ms(ns: float) -> float | None:
    """Nanoseconds as milliseconds for the report; None when there was nothing to measure."""
    return None if ns != ns else round(ns / 1e6, 3)


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


async def wait_quiet(limit: float, threshold: float = 10.0) -> float:
    """Between phases our two processes are idle: wait (up to ``limit`` s) until both cores
    are, so that other processes on a shared machine do not run into the next window."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        a = cpu_ticks()
        await asyncio.sleep(0.25)
        usage = core_usage(a, cpu_ticks())
        cores = (f"cpu{SERVER_CORE}_busy_pct", f"cpu{LOAD_CORE}_busy_pct")
        if all(usage.get(c, 0.0) < threshold for c in cores):
            break
    return time.monotonic() - started


async def drain(rec: Recorder, quiet: float = 0.3, limit: float = 10.0) -> None:
    """Wait until no message has arrived for ``quiet`` seconds (or ``limit`` passes)."""
    deadline = time.monotonic() + limit
    last = rec.count
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet)
        if rec.count == last:
            return
        last = rec.count


async def run_phase(
    port: int,
    rec: Recorder,
    clients: int,
    topics: int,
    phase: str,
    mode: str,
    rounds_per_s: float,
    warmup: float,
    measure: float,
    subs_by_topic: dict[int, int] | None = None,
    window: int = 2,
) -> dict[str, Any]:
    """One phase. ``subs_by_topic``: subscribers per topic id, when clients do not all take
    every topic (the default: ``clients`` each); ``window``: the closed loop's rounds waiting."""
    rec.reset()
    if mode == "open" and 0 < rounds_per_s <= 4:
        # few rounds a second (each a burst): the window starts half an interval after a round
        # and holds a whole number of rounds, so no burst is cut in two at either end
        interval = 1 / rounds_per_s
        warmup = (int(warmup / interval) + 0.5) * interval
        measure = max(1, round(measure / interval)) * interval
    n_start = rec.count
    # the publisher runs until told to stop (the time limit is only a safety net): a control
    # answer that comes late, because the server or the load is saturated, cannot end the
    # publishing before the window does
    limit = 10 * (warmup + measure) + 30
    if mode == "closed":
        await http(port, "POST", f"/control/start?mode=closed&window={window}&seconds={limit}")
    else:
        await http(
            port, "POST", f"/control/start?mode=open&rate={rounds_per_s:.6f}&seconds={limit}"
        )
    await asyncio.sleep(warmup)
    s0 = await http(port, "GET", "/control/stats?mark=1")
    c0 = load_cpu()
    k0 = cpu_ticks()
    g0 = LOAD_GC.info(mark=True)
    t0 = time.monotonic_ns()
    n0 = rec.count
    rec.recording = True
    await asyncio.sleep(measure)
    rec.recording = False
    t1 = time.monotonic_ns()
    n1 = rec.count
    c1 = load_cpu()
    k1 = cpu_ticks()
    g1 = LOAD_GC.info()
    s1 = await http(port, "GET", "/control/stats")
    await http(port, "POST", "/control/stop")
    await drain(rec)
    s2 = await http(port, "GET", "/control/stats")

    wall = (t1 - t0) / 1e9
    # the server's figures over its own window: a busy server answers the stats request late,
    # so its window is not exactly the load's
    server_wall = (s1["now_ns"] - s0["now_ns"]) / 1e9
    delivered = n1 - n0
    per_round = s1["publisher"]["deliveries_per_round"]
    published_rounds = s1["publisher"]["run_rounds"] - s0["publisher"]["run_rounds"]
    published_rate = published_rounds * per_round / server_wall
    delivered_rate = delivered / wall
    offered = rounds_per_s * per_round if mode == "open" else published_rate
    # everything published in the phase (warm-up and window) against everything received
    complete = (rec.count - n_start) / max(1, s2["publisher"]["run_rounds"] * per_round)
    framed = s1["cycle"]["messages"] - s0["cycle"]["messages"]
    server_cpu = (s1["cpu_user"] + s1["cpu_sys"]) - (s0["cpu_user"] + s0["cpu_sys"])
    lat = sorted(rec.lat)
    # skew: sampled messages first received inside the window, over every client that got them
    window = [(k, e) for k, e in rec.skew.items() if t0 <= e[0] <= t1]
    skews = sorted(e[1] - e[0] for _, e in window if e[2] > 1)
    subscriptions = sum(subs_by_topic.values()) if subs_by_topic else clients * topics
    # a sampled message reached every client that subscribed to its topic
    everyone = sum(
        1
        for k, e in window
        if e[2] == (clients if subs_by_topic is None else subs_by_topic.get(k >> 40, 0))
    )
    latency_p99_ms = pct(lat, 0.99) / 1e6
    ratio = delivered_rate / offered if offered else 0.0
    # closed loop: the publisher waits for the server, so the rate is whatever it delivers and
    # latency is the depth of the publisher's window; open loop: a server that falls behind
    # delivers less than the offered rate and its latency grows
    if mode == "open":
        sustained = ratio >= 0.9 and latency_p99_ms < 1000 and rec.gaps == 0
    else:
        sustained = complete >= 0.99 and rec.gaps == 0
    server_cpu_pct = server_cpu / server_wall * 100
    # deliveries per second of server CPU: the server's cost whatever its load
    per_cpu_s = delivered_rate / (server_cpu_pct / 100) if server_cpu_pct > 0 else None
    load_cpu_pct = (c1 - c0) / wall * 100
    machine = core_usage(k0, k1)
    other = {
        f"cpu{SERVER_CORE}": machine.get(f"cpu{SERVER_CORE}_busy_pct", 0.0) - server_cpu_pct,
        f"cpu{LOAD_CORE}": machine.get(f"cpu{LOAD_CORE}_busy_pct", 0.0) - load_cpu_pct,
    }
    if server_cpu_pct >= 90 and load_cpu_pct >= 90:
        bottleneck = "server and load"
    elif server_cpu_pct >= 90:
        bottleneck = "server"
    elif load_cpu_pct >= 90:
        bottleneck = "load"
    else:
        bottleneck = "none" if mode == "open" else "other (neither process saturated)"
    gc0, gc1 = s0["gc"], s1["gc"]
    return {
        "phase": phase,
        "clients": clients,
        "topics": topics,
        "subscriptions": subscriptions,
        "mode": "closed-loop" if mode == "closed" else "open-loop",
        "target_delivered_per_s": None if mode == "closed" else round(rounds_per_s * per_round),
        "delivered_per_s": round(delivered_rate),
        "published_x_subscribers_per_s": round(published_rate),
        "delivered_ratio": round(ratio, 4),
        "complete_ratio": round(complete, 4),
        "sustained": sustained,
        "latency_p50_ms": ms(pct(lat, 0.50)),
        "latency_p99_ms": ms(pct(lat, 0.99)),
        "latency_max_ms": ms(pct(lat, 1.0)),
        "skew_p50_ms": ms(pct(skews, 0.50)),
        "skew_p99_ms": ms(pct(skews, 0.99)),
        "skew_samples": len(skews),
        "skew_samples_all_clients": everyone,
        "server_cpu_s_per_million": round(server_cpu / framed * 1e6, 3) if framed else None,
        "server_cpu_pct": round(server_cpu_pct, 1),
        "delivered_per_server_cpu_s": None if per_cpu_s is None else round(per_cpu_s),
        "load_cpu_pct": round(load_cpu_pct, 1),
        "bottleneck": bottleneck,
        "messages_per_frame": round(framed / (s1["cycle"]["frames"] - s0["cycle"]["frames"]), 2)
        if s1["cycle"]["frames"] > s0["cycle"]["frames"]
        else None,
        "publisher_max_late_ms": round(s1["publisher"]["max_late_ms"], 3),
        "server_gc_ms": round((sum(gc1["seconds"]) - sum(gc0["seconds"])) * 1000, 1),
        "server_gc_full": gc1["count"][2] - gc0["count"][2],
        "server_gc_max_pause_ms": round(gc1["max_ms"], 1),  # within the window
        "server_rss_end_mb": round(s1["rss"] / 2**20, 1),
        "server_failed_sends_max": s1["failed_sends_max"],
        "load_gc_ms": round((sum(g1["seconds"]) - sum(g0["seconds"])) * 1000, 1),
        "load_gc_max_pause_ms": round(g1["max_ms"], 1),
        "load_gc_collections": [
            b - a
            for a, b in zip(cast(list[int], g0["count"]), cast(list[int], g1["count"]), strict=True)
        ],
        "load_rss_mb": round(load_rss() / 2**20, 1),
        "gaps": rec.gaps,
        "lost_to_gaps": rec.lost,
        "other_cpu_pct": {k: round(v, 1) for k, v in other.items()},
        "machine": machine,
        "window_s": round(wall, 3),
    }


def describe(r: dict[str, Any], label: str = "") -> str:
    verdict = "sustained" if r["sustained"] else "NOT SUSTAINED"
    rate = (
        "max (closed loop)"
        if r["target_delivered_per_s"] is None
        else f"open loop @ {r['target_delivered_per_s']:,}/s"
    )
    keep = "" if r["mode"] == "closed-loop" else f"{r['delivered_ratio']:.0%} of offered, "
    topics = str(r["topics"])
    if r.get("per_client", r["topics"]) != r["topics"]:
        topics = f"{r['per_client']}/{r['topics']}"
    line = (
        f"{label}{r['clients']:>5,} x {topics:<2} {r['phase']:<6} {rate:<25} "
        f"delivered {r['delivered_per_s']:>7,}/s ({keep}{verdict}) "
        f"| latency p50 {fmt(r['latency_p50_ms'])} p99 {fmt(r['latency_p99_ms'])} ms "
        f"| skew p50 {fmt(r['skew_p50_ms'])} p99 {fmt(r['skew_p99_ms'])} ms "
        f"| server {fmt(r['server_cpu_s_per_million'], '.2f')} CPU-s/M msgs, "
        f"{r['server_cpu_pct']:.0f}% CPU, {r['server_rss_per_conn_kib']:.1f} KiB/conn, "
        f"GC {r['server_gc_ms']:.0f} ms "
        f"| load {r['load_cpu_pct']:.0f}% CPU"
    )
    if noisy(r):
        line += " | NOISY: other work on " + ", ".join(
            f"{k} {v:.0f}%" for k, v in r["other_cpu_pct"].items() if v > NOISY_PCT
        )
    return line


def bottleneck_notes(r: dict[str, Any]) -> list[str]:
    """What a table row says when the load, not the server alone, was the limit."""
    if r["bottleneck"] == "load":
        return ["LOAD-BOUND (the server had CPU to spare)"]
    if r["bottleneck"] == "server and load":
        return ["load saturated too"]
    return []


def noisy(r: dict[str, Any]) -> bool:
    """Did other processes use one of our two cores during the window?"""
    return any(v > NOISY_PCT for v in r["other_cpu_pct"].values())


async def run_case(case: Case, args: argparse.Namespace, pin: bool) -> None:
    ring = ["--ring", "0"] if case.snapshot else []  # 0: snapshot topics
    server = Server(
        ["--topics", str(case.topics), "--server", case.server, *ring], pin, APPS[case.app]
    )
    # skew: every message of every topic with many clients (few rounds per second), every 8th
    # seq with few clients (many rounds per second, few deliveries each)
    rec = Recorder(sample=1 if case.clients >= 500 else 8)
    case_started = time.monotonic()
    clients: list[Client] = []
    ping_task: asyncio.Task[None] | None = None
    try:
        await server.start()
        port = server.port
        await asyncio.sleep(0.2)
        before = await http(port, "GET", "/control/stats?gc=1")
        url = f"ws://127.0.0.1:{port}/rubris/ws"
        names = [f"bench.{i}" for i in range(case.topics)]
        t = time.monotonic()
        load_cpu0 = load_cpu()
        clients = await open_clients(
            url,
            case.clients,
            names,
            rec,
            args.decode,
            concurrency=args.connect_concurrency,
            per_client=case.per_client,
        )
        connect_s = time.monotonic() - t
        connect_load_cpu = load_cpu() - load_cpu0
        await asyncio.sleep(0.3)
        after = await http(port, "GET", "/control/stats?gc=1")
        if args.server_gc != "default":
            await http(port, "GET", f"/control/stats?gc=1&gc_mode={args.server_gc}")
        if after["connected"] != case.clients:
            raise RuntimeError(f"{after['connected']} of {case.clients} clients connected")
        # KiB (1,024 bytes) per connection: the session, its subscriptions, the server's buffers
        rss_per_conn_kib = (after["rss"] - before["rss"]) / case.clients / 1024
        connect_server_cpu = (after["cpu_user"] + after["cpu_sys"]) - (
            before["cpu_user"] + before["cpu_sys"]
        )
        connect_server_gc = sum(after["gc"]["seconds"]) - sum(before["gc"]["seconds"])
        # subscribers per topic id (the server's numbers, as the PUSHes carry them)
        subs_by_topic: dict[int, int] = {}
        for c in clients:
            for number in c.topics:
                subs_by_topic[number] = subs_by_topic.get(number, 0) + 1
        subscriptions = sum(subs_by_topic.values())
        LOAD_GC.collect()
        gc.freeze()  # the clients are long-lived: keep them out of the load's gc passes
        if args.load_gc == "off":
            gc.disable()  # no collector pauses in the instrument (collected between cases)
        ping_task = asyncio.get_running_loop().create_task(pinger(clients))
        each = f" ({case.per_client} each)" if case.per_client else ""
        print(
            f"{case.label}{case.clients:>5,} clients x {case.topics} topics{each}: connected and "
            "subscribed in "
            f"{connect_s:.1f} s; server RSS {before['rss'] / 2**20:.0f} -> "
            f"{after['rss'] / 2**20:.0f} MiB ({rss_per_conn_kib:.1f} KiB per connection); CPU "
            f"server {connect_server_cpu:.1f} s (GC {connect_server_gc:.1f} s), load "
            f"{connect_load_cpu:.1f} s",
            flush=True,
        )
        per_round = subscriptions
        max_delivered = 0.0
        quiet_wait = 0.0
        for phase in case.phases:
            if phase == "max":
                mode, rounds = "closed", 0.0
            elif phase == "half":
                if not max_delivered:
                    raise RuntimeError("'half' needs a 'max' phase before it")
                mode, rounds = "open", max_delivered / 2 / per_round
            elif phase.isdigit():
                mode, rounds = "open", int(phase) / per_round
                phase = "fixed"
            else:
                raise ValueError(f"unknown phase {phase!r}: max, half or a delivered rate")
            attempts: list[dict[str, Any]] = []
            for attempt in range(1, args.noisy_retries + 2):
                quiet_wait += await wait_quiet(args.quiet_wait)
                r = await run_phase(
                    port,
                    rec,
                    case.clients,
                    case.topics,
                    phase,
                    mode,
                    rounds,
                    args.warmup,
                    args.measure,
                    None if subscriptions == case.clients * case.topics else subs_by_topic,
                    case.window,
                )
                r["server"] = case.server
                r["app"] = case.app
                r["per_client"] = case.per_client or case.topics
                r["round"] = case.round
                # the name says KB, the figure has always been KiB (bytes / 1,024): kept for
                # the readers of the JSON; server_rss_per_conn_kib is the same, less rounded
                r["server_rss_per_conn_kb"] = round(rss_per_conn_kib, 2)
                r["server_rss_per_conn_kib"] = round(rss_per_conn_kib, 3)
                r["server_rss_before_mib"] = round(before["rss"] / 2**20, 1)
                r["server_rss_connected_mib"] = round(after["rss"] / 2**20, 1)
                r["connect_s"] = round(connect_s, 2)
                r["connect_cpu_s"] = {
                    "server": round(connect_server_cpu, 2),
                    "server_gc": round(connect_server_gc, 2),
                    "load": round(connect_load_cpu, 2),
                }
                r["attempt"] = attempt
                attempts.append(r)
                print(describe(r, case.label), flush=True)
                if not noisy(r):
                    break
                if attempt <= args.noisy_retries:
                    print("      (other processes used our cores: measuring again)", flush=True)
            r = attempts[-1]
            if noisy(r):
                # noise only ever slows us down: the best maximum is the least disturbed one
                if phase == "max":
                    r = max(attempts, key=lambda a: a["delivered_per_s"])
                else:
                    r = min(attempts, key=lambda a: max(a["other_cpu_pct"].values()))
            if phase == "max":
                max_delivered = r["delivered_per_s"]
            case.results.append(r)
        case.quiet_wait_s = round(quiet_wait, 1)
        for r in case.results:
            r["case_s"] = round(time.monotonic() - case_started, 1)
    finally:
        if ping_task is not None:
            ping_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ping_task
        gc.unfreeze()
        gc.enable()
        try:
            await close_clients(clients)
        finally:
            await server.stop()
            server.kill()


def verdict(cases: list[Case]) -> dict[str, Any]:
    """The issue's targets, checked against the 1,000 x 10 case.

    Throughput: at least 200,000 deliveries/s sustained (open loop at that rate: delivered
    >= 90 % of it, bounded latency, nothing lost). Latency: p99 under 50 ms at half that rate
    (open loop at 100,000/s); the p99 at half the measured maximum is reported beside it.
    """
    main = next((c for c in cases if c.clients == 1000 and c.topics == 10), None)
    if main is None:
        return {}
    by = {r["phase"]: r for r in main.results}
    fixed = {r["target_delivered_per_s"]: r for r in main.results if r["phase"] == "fixed"}
    mx, half = by.get("max"), by.get("half")
    at_target, at_half_target = fixed.get(TARGET_DELIVERED), fixed.get(TARGET_DELIVERED // 2)
    return {
        "case": "1,000 clients x 10 topics",
        "target_delivered_per_s": TARGET_DELIVERED,
        "max_delivered_per_s": mx and mx["delivered_per_s"],
        "max_bottleneck": mx and mx["bottleneck"],
        "sustained_at_target": at_target and at_target["sustained"],
        "latency_p99_ms_at_target": at_target and at_target["latency_p99_ms"],
        "throughput_met": bool(
            at_target
            and at_target["sustained"]
            and mx
            and mx["delivered_per_s"] >= TARGET_DELIVERED
        ),
        "latency_p99_ms_at_half_target": at_half_target and at_half_target["latency_p99_ms"],
        "latency_met": bool(
            at_half_target and at_half_target["sustained"] and at_half_target["latency_p99_ms"] < 50
        ),
        "latency_p99_ms_at_half_max": half and half["latency_p99_ms"],
    }


COMPARE_CASES = [
    ("rubris", 1000, 1, ["10000", "max"]),
    ("plain", 1000, 1, ["10000", "max"]),
    ("rubris", 1000, 10, ["50000", "max"]),
]
"""``--compare-servers``: (app, clients, topics, phases), each run on every server in turn. The
fixed rate first: its latency is measured on a fresh server, not in the wake of saturation."""
RATIO_AT = 10_000
"""The fixed rate (1,000 x 1) at which rubris's latency p99 is set against the plain loop's."""


def compare_cases() -> list[Case]:
    """Every case on each server, case by case (not all of one server first), the servers'
    order turned by one each case so that none always runs first."""
    cases = []
    for k, (app, clients, topics, phases) in enumerate(COMPARE_CASES):
        for server in SERVERS[k % len(SERVERS) :] + SERVERS[: k % len(SERVERS)]:
            label = f"{server:<9} {app:<6} "
            cases.append(Case(clients, topics, list(phases), server=server, app=app, label=label))
    return cases


async def amain(args: argparse.Namespace, pin: bool) -> dict[str, Any]:
    compare = args.compare_servers or args.compare_plain
    if args.compare_servers:
        cases = compare_cases()
    elif args.compare_plain:
        cases = compare_plain_cases(args.rounds)
    else:
        if args.quick:
            cases = [Case(100, 10, ["max", "half"]), Case(1000, 10, MAIN_PHASES)]
        else:
            cases = [
                Case(100, 10, ["max", "half"]),
                Case(1000, 10, MAIN_PHASES),
                Case(5000, 10, ["max", "half"]),
                Case(5000, 1, ["max", "half"]),
            ]
        if args.clients:
            cases = [
                Case(
                    args.clients,
                    args.topics,
                    args.phases.split(","),
                    per_client=args.per_client,
                    snapshot=args.snapshot,
                )
            ]
        default = args.server == "uvicorn" and args.app == "rubris"
        for case in cases:
            case.server, case.app = args.server, args.app
            case.label = "" if default else f"{args.server}/{args.app} "
    started = time.monotonic()
    for case in cases:
        if not compare:
            await run_case(case, args, pin)
            continue
        try:  # one server (or app) failing a case does not end the comparison
            await run_case(case, args, pin)
        except Exception as exc:
            case.error = f"{type(exc).__name__}: {exc}"
            print(f"{case.label}{case.clients:,} x {case.topics}: FAILED: {case.error}", flush=True)
    summary: dict[str, Any] = {
        "bench": "fanout",
        "cores": os.cpu_count(),
        "pinned": {"server": SERVER_CORE, "load": LOAD_CORE} if pin else None,
        "python": sys.version.split()[0],
        "decode": args.decode,
        "server_gc": args.server_gc,
        "load_gc": args.load_gc,
        "warmup_s": args.warmup,
        "measure_s": args.measure,
        "noisy_phases": sum(1 for c in cases for r in c.results if noisy(r)),
        "quiet_wait_s": round(sum(c.quiet_wait_s for c in cases), 1),
        "duration_s": round(time.monotonic() - started, 1),
    }
    if compare:
        summary["errors"] = [
            {
                "server": c.server,
                "app": c.app,
                "clients": c.clients,
                "topics": c.topics,
                "per_client": c.per_client or c.topics,
                "round": c.round,
                "error": c.error,
            }
            for c in cases
            if c.error
        ]
    if args.compare_servers:
        summary["mode"] = "compare-servers"
        summary["comparison"] = comparison(cases)
    elif args.compare_plain:
        summary["mode"] = "compare-plain"
        summary["server"] = "uvicorn"
        summary["plain_comparison"] = plain_comparison(cases, args.rounds)
    else:
        summary["server"] = args.server
        summary["app"] = args.app
        summary["targets"] = verdict(cases)
    summary["cases"] = [r for c in cases for r in c.results]
    return summary


# --------------------------------------------------------------------------- --compare-servers


def _find(
    results: list[dict[str, Any]], server: str, app: str, clients: int, topics: int, phase: str
) -> dict[str, Any] | None:
    """A result by its server, app, case and phase (``max`` or a fixed rate such as 10000)."""
    for r in results:
        if (r["server"], r["app"], r["clients"], r["topics"]) != (server, app, clients, topics):
            continue
        if phase == "max" and r["phase"] == "max":
            return r
        if phase.isdigit() and r["phase"] == "fixed" and r["target_delivered_per_s"] == int(phase):
            return r
    return None


def _ratio(a: float | None, b: float | None, digits: int = 2) -> float | None:
    return None if a is None or b is None or b <= 0 else round(a / b, digits)


def comparison(cases: list[Case]) -> dict[str, Any]:
    """The comparison's figures by server: per case and phase, and the two headline figures."""
    results = [r for c in cases for r in c.results]
    keep = (
        "delivered_per_s",
        "delivered_per_server_cpu_s",
        "server_cpu_pct",
        "latency_p50_ms",
        "latency_p99_ms",
        "skew_p99_ms",
        "sustained",
        "bottleneck",
    )
    out: dict[str, Any] = {"by_server": {}, "per_cpu_s_rubris_1000x1_max": {}}
    out["p99_ratio_rubris_over_plain_1000x1_at_10000"] = {}
    for server in SERVERS:
        figures: dict[str, Any] = {}
        for app, clients, topics, phases in COMPARE_CASES:
            for phase in phases:
                r = _find(results, server, app, clients, topics, phase)
                name = f"{app} {clients}x{topics} {phase}"
                figures[name] = None if r is None else {k: r[k] for k in keep}
        out["by_server"][server] = figures
        mx = _find(results, server, "rubris", 1000, 1, "max")
        out["per_cpu_s_rubris_1000x1_max"][server] = mx and mx["delivered_per_server_cpu_s"]
        rub = _find(results, server, "rubris", 1000, 1, str(RATIO_AT))
        plain = _find(results, server, "plain", 1000, 1, str(RATIO_AT))
        out["p99_ratio_rubris_over_plain_1000x1_at_10000"][server] = _ratio(
            rub and rub["latency_p99_ms"], plain and plain["latency_p99_ms"]
        )
    return out


def comparison_table(summary: dict[str, Any]) -> str:
    """The readable side-by-side table of a ``--compare-servers`` run."""
    results = summary["cases"]
    failed = {
        (e["server"], e["app"], e["clients"], e["topics"]): e["error"]
        for e in summary.get("errors", [])
    }
    head = (
        f"{'case':<17} {'phase':<10} {'server':<10} {'delivered/s':>11} {'srv CPU':>7} "
        f"{'per CPU-s':>10} {'p50 ms':>8} {'p99 ms':>8} {'skew p99':>8}  {'sustained':<9} note"
    )
    lines = [
        "server comparison: one worker process each; the server and its threads on core "
        f"{SERVER_CORE}, the load on core {LOAD_CORE}",
        "per CPU-s = delivered/s / server CPU fraction (max: the server saturated)",
        "",
        head,
        "-" * len(head),
    ]
    for app, clients, topics, phases in COMPARE_CASES:
        case = f"{app} {clients:,} x {topics}"
        for phase in phases:
            shown = "max" if phase == "max" else f"{int(phase):,}/s"
            for server in SERVERS:
                r = _find(results, server, app, clients, topics, phase)
                start = f"{case:<17} {shown:<10} {server:<10} "
                if r is None:
                    err = failed.get((server, app, clients, topics), "no result")
                    lines.append(f"{start}{'-':>11}  ({err[:60]})")
                    continue
                notes = ["NOISY"] if noisy(r) else []
                notes += bottleneck_notes(r)
                lines.append(
                    f"{start}{r['delivered_per_s']:>11,} {r['server_cpu_pct']:>6.0f}% "
                    f"{fmt(r['delivered_per_server_cpu_s'], ',.0f'):>10} "
                    f"{fmt(r['latency_p50_ms'], '.2f'):>8} {fmt(r['latency_p99_ms'], '.2f'):>8} "
                    f"{fmt(r['skew_p99_ms'], '.2f'):>8}  "
                    f"{'yes' if r['sustained'] else 'NO':<9} {', '.join(notes)}".rstrip()
                )
                case = ""
        lines.append("")
    lines.append(f"rubris p99 / plain p99, 1,000 x 1 at {RATIO_AT:,}/s:")
    for server in SERVERS:
        rub = _find(results, server, "rubris", 1000, 1, str(RATIO_AT))
        plain = _find(results, server, "plain", 1000, 1, str(RATIO_AT))
        a = rub and rub["latency_p99_ms"]
        b = plain and plain["latency_p99_ms"]
        ratio = _ratio(a, b)
        lines.append(
            f"  {server:<10} rubris {fmt(a, '.2f'):>8} ms / plain {fmt(b, '.2f'):>8} ms = "
            f"{fmt(ratio, '.2f')}"
        )
    return "\n".join(lines)


def per_cpu_line(summary: dict[str, Any]) -> str:
    """The last line of ``--compare-servers``: rubris deliveries per server CPU-second at
    1,000 x 1, max phase, per server (0 when a server has no figure)."""
    figures = summary["comparison"]["per_cpu_s_rubris_1000x1_max"]
    return " ".join(f"{s}_per_cpu_s={int(figures.get(s) or 0)}" for s in SERVERS)


# --------------------------------------------------------------------------- --compare-plain


PLAIN_CASES: list[tuple[str, int, int, int, list[str]]] = [
    ("1,000 x 1", 1000, 1, 0, ["10000", "max"]),
    ("1,000 x 10", 1000, 10, 0, ["50000"]),
    ("10,000 x 2 of 10", 10000, 10, 2, ["20000"]),
]
"""``--compare-plain``: (name, clients, topics, topics per client (0: all), phases), each run on
uvicorn for rubris, then for the plain loop, every round. The fixed rate first: its latency is
measured on a fresh server, not in the wake of saturation."""
PLAIN_APPS = ("rubris", "plain")
PLAIN_KEEP = (
    "delivered_per_s",
    "server_cpu_pct",
    "delivered_per_server_cpu_s",
    "latency_p50_ms",
    "latency_p99_ms",
    "skew_p99_ms",
    "server_rss_per_conn_kib",
    "load_cpu_pct",
    "sustained",
    "bottleneck",
    "attempt",
)
"""The figures of each run the ``--compare-plain`` JSON repeats under ``plain_comparison``."""
PLAIN_RATIOS = (
    ("per_cpu_s", "delivered_per_server_cpu_s"),
    ("delivered", "delivered_per_s"),
    ("p99", "latency_p99_ms"),
)
"""The ratios rubris / plain per round: name in the JSON, and the figure."""


def compare_plain_cases(rounds: int) -> list[Case]:
    """Round after round, every case, rubris then the plain loop, each on a fresh server."""
    cases = []
    for rnd in range(1, rounds + 1):
        for _, clients, topics, per_client, phases in PLAIN_CASES:
            for app in PLAIN_APPS:
                label = f"r{rnd} {app:<6} "
                cases.append(
                    Case(
                        clients,
                        topics,
                        list(phases),
                        per_client=per_client,
                        app=app,
                        label=label,
                        round=rnd,
                        window=1,  # max: one round framed at a time, as the plain loop's
                    )
                )
    return cases


def _find_run(
    results: list[dict[str, Any]],
    app: str,
    clients: int,
    topics: int,
    per_client: int,
    phase: str,
    rnd: int,
) -> dict[str, Any] | None:
    """One round's result of one app, case and phase (``max`` or a fixed rate)."""
    k = per_client or topics
    for r in results:
        if (r["app"], r["clients"], r["topics"], r["per_client"], r["round"]) != (
            app,
            clients,
            topics,
            k,
            rnd,
        ):
            continue
        if phase == "max" and r["phase"] == "max":
            return r
        if phase.isdigit() and r["phase"] == "fixed" and r["target_delivered_per_s"] == int(phase):
            return r
    return None


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def _phase_key(name: str, phase: str) -> str:
    return f"{name} {'max' if phase == 'max' else f'{int(phase):,}/s'}"


def plain_comparison(cases: list[Case], rounds: int) -> dict[str, Any]:
    """Per case and phase: each round's rubris and plain figures, their medians, the ratios
    rubris / plain of each round (measured side by side) and the ratios' medians; then the
    headline figures of the last line."""
    results = [r for c in cases for r in c.results]
    out: dict[str, Any] = {"rounds": rounds, "by_case": {}}
    for name, clients, topics, per_client, phases in PLAIN_CASES:
        for phase in phases:
            entry: dict[str, Any] = {"runs": [], "median": {}, "ratios": {}, "median_ratio": {}}
            for rnd in range(1, rounds + 1):
                run: dict[str, Any] = {"round": rnd}
                for app in PLAIN_APPS:
                    r = _find_run(results, app, clients, topics, per_client, phase, rnd)
                    run[app] = None if r is None else {k: r[k] for k in PLAIN_KEEP}
                entry["runs"].append(run)
            for app in PLAIN_APPS:
                entry["median"][app] = {
                    k: _median([run[app] and run[app][k] for run in entry["runs"]])
                    for k in PLAIN_KEEP
                    if k not in ("sustained", "bottleneck", "attempt")
                }
            for key, figure in PLAIN_RATIOS:
                per_round = [
                    _ratio(
                        run["rubris"] and run["rubris"][figure],
                        run["plain"] and run["plain"][figure],
                        4,
                    )
                    for run in entry["runs"]
                ]
                entry["ratios"][key] = per_round
                med = _median(list(per_round))
                entry["median_ratio"][key] = None if med is None else round(med, 3)
            out["by_case"][_phase_key(name, phase)] = entry
    by = out["by_case"]
    big = PLAIN_CASES[2][0]
    out["headline"] = {
        "per_cpu_vs_plain_1x1": by[_phase_key("1,000 x 1", "10000")]["median_ratio"]["per_cpu_s"],
        "max_vs_plain_1x1": by[_phase_key("1,000 x 1", "max")]["median_ratio"]["per_cpu_s"],
        "per_cpu_vs_plain_1x10": by[_phase_key("1,000 x 10", "50000")]["median_ratio"]["per_cpu_s"],
        "p99_10k_ms": by[_phase_key(big, "20000")]["median"]["rubris"]["latency_p99_ms"],
        "kib_per_conn": by[_phase_key(big, "20000")]["median"]["rubris"]["server_rss_per_conn_kib"],
    }
    return out


def plain_table(summary: dict[str, Any]) -> str:
    """The readable side-by-side table of a ``--compare-plain`` run."""
    comp = summary["plain_comparison"]
    failed = {
        (e["app"], e["clients"], e["topics"], e["per_client"], e["round"]): e["error"]
        for e in summary.get("errors", [])
    }
    head = (
        f"{'case':<17} {'phase':<10} {'rnd':<3} {'app':<6} {'delivered/s':>11} {'srv CPU':>7} "
        f"{'per CPU-s':>10} {'p50 ms':>8} {'p99 ms':>8} {'KiB/conn':>8} {'load':>5}  "
        f"{'sustained':<9} note"
    )
    lines = [
        "rubris vs the plain Starlette loop, on uvicorn: one worker, the server on core "
        f"{SERVER_CORE}, the load on core {LOAD_CORE}; each round runs every case, rubris then "
        "plain, each on a fresh server",
        "per CPU-s = delivered/s / server CPU fraction (max: the server saturated); KiB/conn = "
        "server RSS per connection after connecting and subscribing (after a gc); load = the "
        "load process's CPU %",
        "",
        head,
        "-" * len(head),
    ]
    rounds = comp["rounds"]
    for name, clients, topics, per_client, phases in PLAIN_CASES:
        case = name
        for phase in phases:
            shown = "max" if phase == "max" else f"{int(phase):,}/s"
            entry = comp["by_case"][_phase_key(name, phase)]
            for run in entry["runs"]:
                for app in PLAIN_APPS:
                    r = run[app]
                    start = f"{case:<17} {shown:<10} {run['round']:<3} {app:<6} "
                    case, shown = "", ""
                    if r is None:
                        err = failed.get(
                            (app, clients, topics, per_client or topics, run["round"]),
                            "no result",
                        )
                        lines.append(f"{start}{'-':>11}  ({err[:70]})")
                        continue
                    notes = [f"attempt {r['attempt']}"] if r["attempt"] > 1 else []
                    notes += bottleneck_notes(r)
                    lines.append(
                        f"{start}{r['delivered_per_s']:>11,} {r['server_cpu_pct']:>6.0f}% "
                        f"{fmt(r['delivered_per_server_cpu_s'], ',.0f'):>10} "
                        f"{fmt(r['latency_p50_ms'], '.2f'):>8} "
                        f"{fmt(r['latency_p99_ms'], '.2f'):>8} "
                        f"{fmt(r['server_rss_per_conn_kib'], '.1f'):>8} "
                        f"{r['load_cpu_pct']:>4.0f}%  "
                        f"{'yes' if r['sustained'] else 'NO':<9} {', '.join(notes)}".rstrip()
                    )
            for app in PLAIN_APPS:
                m = entry["median"][app]
                start = f"{'':<17} {'':<10} {'med':<3} {app:<6} "
                lines.append(
                    f"{start}{fmt(m['delivered_per_s'], ',.0f'):>11} "
                    f"{fmt(m['server_cpu_pct'], '.0f'):>6}% "
                    f"{fmt(m['delivered_per_server_cpu_s'], ',.0f'):>10} "
                    f"{fmt(m['latency_p50_ms'], '.2f'):>8} {fmt(m['latency_p99_ms'], '.2f'):>8} "
                    f"{fmt(m['server_rss_per_conn_kib'], '.1f'):>8} "
                    f"{fmt(m['load_cpu_pct'], '.0f'):>4}%"
                )
        lines.append("")
    lines.append(
        f"rubris / plain, per round ({rounds} rounds, each pair measured side by side) -> median:"
    )
    width = max(len(k) for k in comp["by_case"])
    for key, entry in comp["by_case"].items():
        parts = []
        for ratio, _ in PLAIN_RATIOS:
            rs = " ".join(fmt(x, ".2f") for x in entry["ratios"][ratio])
            parts.append(f"{ratio} {rs} -> {fmt(entry['median_ratio'][ratio], '.2f')}")
        lines.append(f"  {key:<{width}}  " + " | ".join(parts))
    lines.append(
        "  (per_cpu_s, delivered: higher is better for rubris; p99: lower is better for rubris)"
    )
    return "\n".join(lines)


def plain_line(summary: dict[str, Any]) -> str:
    """The last line of ``--compare-plain`` (``nan`` for a figure that could not be measured)."""
    h = summary["plain_comparison"]["headline"]

    def f(key: str, spec: str) -> str:
        v = h.get(key)
        return "nan" if v is None else format(v, spec)

    return (
        f"per_cpu_vs_plain_1x1={f('per_cpu_vs_plain_1x1', '.2f')} "
        f"max_vs_plain_1x1={f('max_vs_plain_1x1', '.2f')} "
        f"per_cpu_vs_plain_1x10={f('per_cpu_vs_plain_1x10', '.2f')} "
        f"p99_10k_ms={f('p99_10k_ms', '.1f')} "
        f"kib_per_conn={f('kib_per_conn', '.1f')}"
    )


def prepare_load(banner: str) -> bool:
    """This process as a bench's load: as many sockets as it may open, pinned to LOAD_CORE when
    there are two cores (returns whether it pinned), and the bench's first line printed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    pin = (os.cpu_count() or 1) >= 2 and hasattr(os, "sched_setaffinity")
    if pin:
        os.sched_setaffinity(0, {LOAD_CORE})
    else:
        print("fewer than 2 cores: server and load share the CPU, figures are pessimistic")
    print(banner, flush=True)
    return pin


def quick_or_full(args: argparse.Namespace, defaults: dict[str, tuple[float, float]]) -> None:
    """Fill the options left unset with their ``(--quick, full)`` default."""
    for key, (quick, full) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="fewer cases, shorter phases")
    ap.add_argument("--warmup", type=float, default=None, help="seconds before each window")
    ap.add_argument("--measure", type=float, default=None, help="seconds measured per phase")
    ap.add_argument(
        "--decode",
        choices=["fast", "full", "frame"],
        default="fast",
        help="full: every frame through iter_messages + orjson (slower load side); frame: "
        "messages counted, the first of each frame timed, no skew (overload cases, where the "
        "load timing every message falls behind the server)",
    )
    ap.add_argument(
        "--server-gc",
        choices=["default", "freeze", "off"],
        default="default",
        help="experiment: gc.freeze() or gc.disable() in the server once the clients are "
        "connected (default: leave the server's garbage collector alone)",
    )
    ap.add_argument(
        "--load-gc",
        choices=["on", "off"],
        default=None,
        help="the load's garbage collector while the clients are connected (their objects are "
        "frozen either way; off: no collector pauses of the load in the latency figures, it "
        "collects between cases); default on, off with --compare-plain",
    )
    ap.add_argument(
        "--noisy-retries",
        type=int,
        default=1,
        help="measure a phase again (up to N times) when other processes used our cores",
    )
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=5.0,
        help="before each phase, wait up to this many seconds for both cores to be idle",
    )
    ap.add_argument(
        "--server",
        choices=SERVERS,
        default="uvicorn",
        help="the ASGI server that serves the app (one worker process; see bench/_servers.py)",
    )
    ap.add_argument(
        "--app",
        choices=sorted(APPS),
        default="rubris",
        help="rubris (bench/_fanout_server.py) or the plain Starlette broadcast loop "
        "(bench/_fanout_plain.py)",
    )
    ap.add_argument(
        "--compare-servers",
        action="store_true",
        help="rubris 1,000 x 1 and 1,000 x 10 and the plain loop 1,000 x 1 on every server, "
        "side by side (about 4 minutes; ignores --server, --app, --clients)",
    )
    ap.add_argument(
        "--compare-plain",
        action="store_true",
        help="rubris against the plain loop on uvicorn, alternated round by round: 1,000 x 1, "
        "1,000 x 10 and 10,000 x 2 of 10 (about 7 minutes, --quick about 4; ignores --server, "
        "--app, --clients)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="--compare-plain: rounds of every case per app (default 3, --quick 2; at least 2)",
    )
    ap.add_argument("--clients", type=int, default=0, help="run one custom case instead")
    ap.add_argument("--topics", type=int, default=10, help="with --clients")
    ap.add_argument(
        "--snapshot",
        action="store_true",
        help="with --clients: snapshot topics (latest value, conflated) instead of rings",
    )
    ap.add_argument(
        "--per-client",
        type=int,
        default=0,
        help="with --clients: each client subscribes to K of the T topics, client i to "
        "(i + j) %% T for j < K (default 0: all of them)",
    )
    ap.add_argument(
        "--connect-concurrency",
        type=int,
        default=200,
        help="clients connecting (and subscribing) at once",
    )
    ap.add_argument(
        "--phases",
        default="max,half",
        help="with --clients: comma-separated max, half, or a delivered rate such as 200000",
    )
    args = ap.parse_args()
    if args.compare_servers and args.compare_plain:
        ap.error("--compare-servers and --compare-plain: one at a time")
    quick_or_full(args, {"warmup": (0.5, 1.0), "measure": (3.0, 5.0), "rounds": (2, 3)})
    if args.load_gc is None:
        args.load_gc = "off" if args.compare_plain else "on"
    if args.compare_plain and args.rounds < 1:
        ap.error("--rounds: at least 1 (2 for a median of ratios)")

    if args.compare_servers:
        serving = f"servers {', '.join(SERVERS)} (compared)"
    elif args.compare_plain:
        serving = f"server uvicorn, apps rubris and plain (compared, {args.rounds} rounds)"
    elif args.server == "uvicorn" and args.app == "rubris":
        serving = ""
    else:
        serving = f"server {args.server}, app {args.app}"
    pin = prepare_load(
        f"fanout: cores={os.cpu_count()} python={sys.version.split()[0]} "
        f"server core {SERVER_CORE}, load core {LOAD_CORE}, decode={args.decode}"
        + (f", {serving}" if serving else "")
    )
    try:
        summary = uvloop.run(amain(args, pin))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    if args.compare_servers:
        print(comparison_table(summary), flush=True)
    elif args.compare_plain:
        print(plain_table(summary), flush=True)
    print(json.dumps(summary, separators=(",", ":"), allow_nan=False), flush=True)
    if args.compare_servers:
        print(per_cpu_line(summary), flush=True)
    elif args.compare_plain:
        print(plain_line(summary), flush=True)


if __name__ == "__main__":
    main()

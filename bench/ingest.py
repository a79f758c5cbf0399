"""Ingest benchmark over real sockets: the HTTP publish API and paced vs unpaced publishers.

Not a test. What it measures: (a) how many messages a second one server core takes in through
``POST /rubris/api/publish`` (NDJSON, bearer token), and (b) whether ``Publisher``'s NAK pacing
(control/ratelimit.py, driven by the ``Rubris-Fill`` of every answer) keeps four publishers that
offer five times what the subscribers can take out of 429s, without loss, at a steady and fair rate,
compared with the same publishers unpaced.

How the two cores are shared: like bench/fanout.py, the server (bench/_ingest_server.py:
uvicorn with uvloop, httptools and the ``websockets-sansio`` WebSocket implementation, no
permessage-deflate, Rubris mounted at /rubris with ``api_token`` set, ring channels
``bench.{n}``, bench-only control routes for stats, an intake sampler and the intake bound) runs
in a subprocess pinned to core 0, alone. Everything that publishes or subscribes runs on core 1:
this process (the HTTP posters of (a); the WebSocket subscribers of (b), one uvloop event loop)
and, in (b), the publishers in a process of their own (bench/_ingest_pub.py), so that the
kernel, not one event loop, divides core 1 between subscribers and publishers, as between
separate programs. 127.0.0.1 only. CPU is taken from getrusage of each process (the server over
its own window) and /proc/stat per core; a window in which other processes used our cores is
marked NOISY.

(a) API throughput. A fresh server with no subscribers. Keep-alive HTTP/1.1 connections
    (bench/_ingest_load.py ``Poster``, raw asyncio streams) POST pre-built 1,000-message NDJSON
    requests (~90-byte lines; a request names 1,000 consecutive topics) back to back. After a
    warm-up, over the window: messages accepted (200 answers) per second, requests/s, 429s,
    request latency, scheduler cycles/s, server CPU % and CPU-s per million accepted messages,
    load CPU %, and which side saturated. The main window is 4 connections x 1,000 topics (the
    figure on the last line); two shorter diagnostic windows follow on the same server, 1
    connection x 1,000 topics and 4 connections x 10,000 topics. With no subscribers a ring
    topic takes everything waiting in one cycle, so parsing and checking set the rate here.
    Target: >= 100,000 messages/s on one core.

(b) Paced vs unpaced publishers. A fresh server with 100 ring topics (ring 1,024) and 1,000
    WebSocket subscribers (subscriber i takes the 10 topics of group i mod 10: 100 subscribers a
    topic). Subscribers check each topic's seqs for holes: lost = seqs a subscriber never got
    (holes, GAPs, and what it lacks of the topic's head once the intake is empty) plus messages a
    publisher took and never got accepted. Latency is the payload's ``t`` (CLOCK_MONOTONIC ns,
    stamped when the generator hands the message to ``Publisher.publish``) to the moment its
    frame came off the subscriber's socket.

    calibration  two raw posters keep the intake nearly full (a 50 ms pause after a 429, 20 ms
                 after an answer with fill >= 80 %; intake bound 20,000 meanwhile); R, the
                 sustainable rate, is the server's drain rate: delta of ``intake.published``
                 per second (read from the bench server's stats route) over the window.
    paced        4 ``Publisher``s (defaults: batch 1,000, linger 5 ms, default
                 ``RateLimiter``), each fed by an open-loop generator offering R x 5 / 4 on a
                 fixed schedule; what the publisher does not take yet waits in the generator
                 (``behind``). The intake bound is the package default (100,000; ``--intake``,
                 ``--intake-s`` to size it in seconds of R).
    unpaced      the same with ``RateLimiter(initial=floor)``: NAKs change nothing; 429s are
                 retried with the publisher's backoff (at least Retry-After, 1 s).

    Per phase: intake fill max and p99 (the server samples it every 50 ms; the answers'
    ``Rubris-Fill`` count too), 429 answers ("wasted requests") and refused messages, lost,
    accepted messages per 250 ms window (by the arrival of each 200 answer) as a fraction of R,
    ``settle_s`` (the first time from the phase start after which every 250 ms window is within
    +-15 % of R; ``inf`` if none; the same on a trailing 1 s rate is printed beside it),
    ``share_spread`` ((max - min) / mean of the four publishers' accepted counts over the settled
    part, or over the second half if it never settled), latency p50/p99, each limiter's end
    state. Targets (paced): fill < 90 %, nothing refused or lost, settle within 2 s, shares
    within 20 % of each other; the line before the summary says which were met.

How to run it:

    python3 bench/ingest.py            # full run, about 1.5 minutes
    python3 bench/ingest.py --quick    # shorter windows, about 1 minute

The last two lines are the summary:
``unpaced_refused=N unpaced_wasted_requests=N unpaced_p99_ms=X paced_p99_ms=X paced_max_fill=N``
then ``api_msgs_per_s=N paced_refused=N paced_lost=N settle_s=S share_spread=R``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import os
import sys
import time
from typing import Any

import orjson
import uvloop

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from _fanout_load import close_clients, pinger  # noqa: E402
from _ingest_load import (  # noqa: E402
    Poster,
    PostStats,
    Subscriber,
    Tracker,
    ndjson_request,
    open_subscribers,
    unreceived,
)
from fanout import Server as FanoutServer  # noqa: E402
from fanout import (  # noqa: E402
    core_usage,
    cpu_ticks,
    http,
    load_cpu,
    pct,
    prepare_load,
    quick_or_full,
    wait_quiet,
)

from rubris_asgi import Limits  # noqa: E402

SERVER = os.path.join(HERE, "_ingest_server.py")
PUB = os.path.join(HERE, "_ingest_pub.py")
SERVER_CORE = 0
LOAD_CORE = 1
TOKEN = "bench-token"
API_PATH = "/rubris/api/publish"
API_TARGET = 100_000
PUBLISHERS = 4
OVERLOAD = 5.0
WINDOW_S = 0.25
BAND = 0.15
PAD = "x" * 40


class Server(FanoutServer):
    """The ingest server subprocess (bench/_ingest_server.py), with its control routes."""

    def __init__(self, args: list[str], pin: bool) -> None:
        super().__init__(args, pin, SERVER)

    async def stats(self, heads: bool = False) -> Any:
        return await http(self.port, "GET", "/control/stats" + ("?heads=1" if heads else ""))

    async def samples(self, since_ns: int) -> list[list[int]]:
        rows: list[list[int]] = await http(self.port, "GET", f"/control/samples?since={since_ns}")
        return rows


def cpu_of(s: dict[str, Any]) -> float:
    return float(s["cpu_user"] + s["cpu_sys"])


def bottleneck(server_pct: float, load_pct: float) -> str:
    if server_pct >= 90 and load_pct >= 90:
        return "server and load"
    if server_pct >= 90:
        return "server"
    if load_pct >= 90:
        return "load"
    return "none (neither process saturated)"


def other_work(
    k0: dict[str, list[int]], k1: dict[str, list[int]], server: float, load: float
) -> str:
    """Busy % of our two cores beyond what our processes used: other work on the machine."""
    machine = core_usage(k0, k1)
    extra = {
        f"cpu{SERVER_CORE}": machine.get(f"cpu{SERVER_CORE}_busy_pct", 0.0) - server,
        f"cpu{LOAD_CORE}": machine.get(f"cpu{LOAD_CORE}_busy_pct", 0.0) - load,
    }
    noisy = {k: v for k, v in extra.items() if v > 15}
    return " | NOISY: " + ", ".join(f"{k} +{v:.0f}%" for k, v in noisy.items()) if noisy else ""


# --------------------------------------------------------------------------- (a) API throughput


def api_bodies(count: int, per_request: int, topics: int) -> list[tuple[bytes, int]]:
    """``count`` requests of ``per_request`` NDJSON lines; consecutive lines name consecutive
    topics, so a request spreads over ``per_request`` topics (all of them with 1,000)."""
    out = []
    for b in range(count):
        lines = [
            orjson.dumps(
                {
                    "topic": f"bench.{(b * per_request + j) % topics}",
                    "data": {"t": 0, "i": b * per_request + j, "pad": PAD},
                }
            )
            for j in range(per_request)
        ]
        out.append((ndjson_request(API_PATH, TOKEN, b"\n".join(lines) + b"\n"), per_request))
    return out


async def api_window(
    server: Server, label: str, conns: int, topics: int, measure: float, args: argparse.Namespace
) -> dict[str, Any]:
    """One API measurement on a running server: warm-up, then ``measure`` seconds."""
    for _ in range(100):  # what an earlier window left in the intake
        if not (await server.stats())["intake"]["pending"]:
            break
        await asyncio.sleep(0.1)
    await wait_quiet(args.quiet_wait)
    reqs = api_bodies(8, args.api_batch, topics)
    stats = PostStats()
    posters = [Poster(server.port, reqs, stats, offset=i) for i in range(conns)]
    tasks = [asyncio.create_task(p.run()) for p in posters]
    try:
        await asyncio.sleep(args.api_warmup)
        s0 = await server.stats()
        c0, k0, t0 = load_cpu(), cpu_ticks(), time.monotonic()
        stats.recording = True
        await asyncio.sleep(measure)
        stats.recording = False
        c1, k1, t1 = load_cpu(), cpu_ticks(), time.monotonic()
        s1 = await server.stats()
        for p in posters:
            p.stop = True
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    finally:
        for t in tasks:
            t.cancel()
    wall = t1 - t0
    server_wall = (s1["now_ns"] - s0["now_ns"]) / 1e9
    server_cpu = cpu_of(s1) - cpu_of(s0)
    accepted = s1["intake"]["accepted"] - s0["intake"]["accepted"]
    server_pct = server_cpu / server_wall * 100
    load_pct = (c1 - c0) / wall * 100
    answered = stats.ok + stats.refused + sum(stats.other.values())
    lat = sorted(stats.lat)
    r = {
        "label": label,
        "conns": conns,
        "topics": topics,
        "msgs_per_s": round(stats.ok_msgs / wall),
        "requests_per_s": round(stats.ok / wall, 1),
        "refused_429": stats.refused,
        "refused_share": stats.refused / answered if answered else 0.0,
        "other_status": stats.other,
        "server_cpu_pct": round(server_pct, 1),
        "cpu_s_per_million": round(server_cpu / accepted * 1e6, 2) if accepted else None,
        "load_cpu_pct": round(load_pct, 1),
        "request_p50_ms": pct(lat, 0.5) / 1e6 if lat else math.nan,
        "request_p99_ms": pct(lat, 0.99) / 1e6 if lat else math.nan,
        "max_fill": stats.max_fill,
        "cycles_per_s": round((s1["cycle"]["cycles"] - s0["cycle"]["cycles"]) / server_wall),
        "bottleneck": bottleneck(server_pct, load_pct),
        "noise": other_work(k0, k1, server_pct, load_pct),
    }
    met = "MET" if r["msgs_per_s"] >= API_TARGET else "MISSED"
    print(
        f"    {label:<26} accepted {r['msgs_per_s']:>7,} msgs/s ({r['requests_per_s']:.0f} "
        f"requests/s; target {API_TARGET:,} {met}) | 429s {r['refused_429']} "
        f"({r['refused_share']:.0%} of answers) | request p50 {r['request_p50_ms']:.1f} "
        f"p99 {r['request_p99_ms']:.1f} ms | fill max {r['max_fill']} % | "
        f"{r['cycles_per_s']} cycles/s | server {r['server_cpu_pct']:.0f}% CPU, "
        f"{r['cpu_s_per_million']} CPU-s/M accepted | load {r['load_cpu_pct']:.0f}% CPU | "
        f"bottleneck: {r['bottleneck']}{r['noise']}",
        flush=True,
    )
    return r


async def run_api(args: argparse.Namespace, pin: bool) -> dict[str, Any]:
    """(a): the main window, then two diagnostic ones on the same server (shorter)."""
    server = Server(["--ring", "64"], pin)
    try:
        await server.start()
        body_kb = len(api_bodies(1, args.api_batch, args.api_topics)[0][0]) / 1024
        print(
            f"(a) API: {args.api_batch:,}-message NDJSON requests ({body_kb:.0f} KiB, ~90-byte "
            f"lines, pre-built) on keep-alive connections, no subscribers, "
            f"{args.api_measure:g} s window (diagnostics {args.api_diag:g} s)",
            flush=True,
        )
        main = await api_window(
            server,
            f"{args.api_conns} conns x {args.api_topics:,} topics",
            args.api_conns,
            args.api_topics,
            args.api_measure,
            args,
        )
        diags = []
        if args.api_diag > 0:
            diags.append(
                await api_window(
                    server,
                    f"1 conn x {args.api_topics:,} topics",
                    1,
                    args.api_topics,
                    args.api_diag,
                    args,
                )
            )
            wide = args.api_topics * 10
            diags.append(
                await api_window(
                    server,
                    f"{args.api_conns} conns x {wide:,} topics",
                    args.api_conns,
                    wide,
                    args.api_diag,
                    args,
                )
            )
    finally:
        await server.stop()
    if main["refused_share"] > 0.2:
        print(
            f"    note: over 20 % of the answers were 429: the intake did not drain as fast as "
            f"requests arrived ({main['cycles_per_s']} cycles/s)",
            flush=True,
        )
    main["diagnostics"] = diags
    return main


# --------------------------------------------------------------------------- (b) publishers


class PubProc:
    """One run of bench/_ingest_pub.py on the load core: spawned, started, read back."""

    def __init__(self, mode: str, port: int, rate: float, seconds: float, args: Any) -> None:
        self.argv = [
            sys.executable,
            PUB,
            mode,
            "--port",
            str(port),
            "--token",
            TOKEN,
            "--publishers",
            str(2 if mode == "blast" else PUBLISHERS),
            "--rate",
            f"{rate:.3f}",
            "--seconds",
            f"{seconds:.3f}",
            "--topics",
            str(args.sub_topics),
            "--flush-limit",
            str(args.flush_limit),
            "--batch",
            str(args.pub_batch),
        ]
        self.proc: asyncio.subprocess.Process | None = None

    async def spawn(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
            limit=64 * 2**20,  # the result is one JSON line with every answer
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        if line.strip() != b"READY":
            raise RuntimeError(f"publisher process did not start: {line!r}")

    async def go(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()

    async def result(self, limit: float) -> Any:
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), limit)
        await self.proc.wait()
        if not line:
            raise RuntimeError(f"publisher process ended with {self.proc.returncode}")
        return orjson.loads(line)

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()


async def settle_intake(server: Server, tr: Tracker, limit: float) -> None:
    """Wait until the intake is empty and the subscribers have had nothing for 0.3 s."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if (await server.stats())["intake"]["pending"] == 0:
            break
        await asyncio.sleep(0.1)
    last = tr.count
    while time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        if tr.count == last:
            return
        last = tr.count


async def calibrate(
    server: Server, tr: Tracker, subs_per_topic: int, args: argparse.Namespace
) -> dict[str, Any]:
    """R: the server's drain rate while two raw posters keep the intake nearly full."""
    blast = PubProc("blast", server.port, 0, args.calib_warmup + args.calib_measure + 1, args)
    try:
        await blast.spawn()
        await blast.go()
        await asyncio.sleep(args.calib_warmup)
        s0 = await server.stats()
        c0, k0, t0, n0 = load_cpu(), cpu_ticks(), time.monotonic(), tr.count
        await asyncio.sleep(args.calib_measure)
        c1, k1, t1, n1 = load_cpu(), cpu_ticks(), time.monotonic(), tr.count
        s1 = await server.stats()
        res = await blast.result(30)
    finally:
        blast.kill()
    rows = [r for r in await server.samples(s0["now_ns"]) if r[0] <= s1["now_ns"]]
    server_wall = (s1["now_ns"] - s0["now_ns"]) / 1e9
    rate = (s1["intake"]["published"] - s0["intake"]["published"]) / server_wall
    server_pct = (cpu_of(s1) - cpu_of(s0)) / server_wall * 100
    core1 = core_usage(k0, k1).get(f"cpu{LOAD_CORE}_busy_pct", 0.0)
    delivered = (n1 - n0) / (t1 - t0)
    out = {
        "R": rate,
        "delivered_per_s": delivered,
        "pending_min": min((r[5] for r in rows), default=0),
        "pending_median": pct(sorted(r[5] for r in rows), 0.5) if rows else 0,
        "cycles_per_s": (s1["cycle"]["cycles"] - s0["cycle"]["cycles"]) / server_wall,
        "server_cpu_pct": server_pct,
        "subscribers_cpu_pct": (c1 - c0) / (t1 - t0) * 100,
        "load_core_pct": core1,
        "blast_429s": res["refused"],
    }
    print(
        f"    calibration: drain R = {rate:,.0f} msgs/s ({out['cycles_per_s']:.0f} cycles/s x "
        f"{args.sub_topics} topics; intake pending median {out['pending_median']:,.0f}, min "
        f"{out['pending_min']:,}) | subscribers got {delivered:,.0f} of "
        f"{rate * subs_per_topic:,.0f} deliveries/s | server {server_pct:.0f}% CPU | load core "
        f"{core1:.0f}% busy (subscribers {out['subscribers_cpu_pct']:.0f}%) | bottleneck: "
        f"{bottleneck(server_pct, core1)}",
        flush=True,
    )
    await settle_intake(server, tr, 30)
    return out


def windows(
    runs: list[dict[str, Any]], start_ns: int, seconds: float
) -> tuple[list[float], list[list[int]]]:
    """Accepted messages per 250 ms window: the total rate, and each publisher's counts."""
    nwin = int(seconds / WINDOW_S + 1e-9)
    per: list[list[int]] = [[0] * nwin for _ in runs]
    for i, run in enumerate(runs):
        for t, status, _fill, n in run["answers"]:
            w = int((t - start_ns) / 1e9 / WINDOW_S)
            if status == 200 and 0 <= w < nwin:
                per[i][w] += n
    total = [sum(p[w] for p in per) / WINDOW_S for w in range(nwin)]
    return total, per


def settled_from(rates: list[float], target: float) -> int | None:
    """The first window from which every later window is within +-BAND of ``target``."""
    first = None
    for w, r in enumerate(rates):
        if abs(r - target) <= BAND * target:
            if first is None:
                first = w
        else:
            first = None
    return first


async def run_phase(
    name: str,
    server: Server,
    tr: Tracker,
    subs: list[Subscriber],
    rate_r: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    await wait_quiet(args.quiet_wait)
    seconds = args.phase
    proc = PubProc(name, server.port, OVERLOAD * rate_r, seconds, args)
    try:
        await proc.spawn()
        s0 = await server.stats(heads=True)
        missing0 = unreceived(subs, s0["heads"])
        holes0, dups0, gaps0, lat_from = tr.holes, tr.dups, tr.gaps, len(tr.lat)
        c0, k0, t0 = load_cpu(), cpu_ticks(), time.monotonic()
        tr.recording = True
        await proc.go()
        await asyncio.sleep(seconds)
        c1, k1, t1 = load_cpu(), cpu_ticks(), time.monotonic()
        s1 = await server.stats()
        res = await proc.result(args.flush_limit + 30)
    finally:
        proc.kill()
    await settle_intake(server, tr, 60)
    tr.recording = False
    s2 = await server.stats(heads=True)
    start = res["start_ns"]
    end = start + int(seconds * 1e9)
    runs = res["runs"]
    rows = [x for x in await server.samples(start) if x[0] <= end]

    wall = t1 - t0
    server_wall = (s1["now_ns"] - s0["now_ns"]) / 1e9
    server_pct = (cpu_of(s1) - cpu_of(s0)) / server_wall * 100
    subs_pct = (c1 - c0) / wall * 100
    pubs_pct = res["cpu_s"] / seconds * 100
    core1 = core_usage(k0, k1).get(f"cpu{LOAD_CORE}_busy_pct", 0.0)
    lost_subs = (tr.holes - holes0) + (unreceived(subs, s2["heads"]) - missing0)
    unsent = sum(r["handed"] - r["accepted"] for r in runs)
    fills = sorted(x[1] for x in rows)
    answers = [a for r in runs for a in r["answers"]]
    answer_fills = [a[2] for a in answers if a[0] <= end]
    rates, per = windows(runs, start, seconds)
    w0 = settled_from(rates, rate_r)
    per_s = round(1 / WINDOW_S)
    sliding = [sum(rates[w - per_s + 1 : w + 1]) / per_s for w in range(per_s - 1, len(rates))]
    w1 = settled_from(sliding, rate_r)
    share_from = w0 if w0 is not None else len(rates) // 2
    shares = [sum(p[share_from:]) for p in per]
    mean = sum(shares) / len(shares)
    lat = sorted(tr.lat[lat_from:])
    fill_w = []
    for w in range(len(rates)):
        lo, hi = start + int(w * WINDOW_S * 1e9), start + int((w + 1) * WINDOW_S * 1e9)
        fill_w.append(max((x[1] for x in rows if lo <= x[0] < hi), default=0))
    span = (rows[-1][0] - rows[0][0]) / 1e9 if len(rows) > 1 else 0.0
    half = rows[len(rows) // 2 :]
    half_span = (half[-1][0] - half[0][0]) / 1e9 if len(half) > 1 else 0.0
    r = {
        "phase": name,
        "offered_per_s": OVERLOAD * rate_r,
        "drained_per_s": (rows[-1][3] - rows[0][3]) / span if span else 0.0,
        "drained_2nd_half_per_s": (half[-1][3] - half[0][3]) / half_span if half_span else 0.0,
        "accepted_per_s": sum(map(sum, per)) / (len(rates) * WINDOW_S) if rates else 0.0,
        "max_fill": max(fills + answer_fills, default=0),
        "p99_fill": pct(fills, 0.99) if fills else 0,
        "requests": len(answers),
        "wasted_requests": sum(1 for a in answers if a[1] == 429),
        "refused_msgs": s2["intake"]["refused"] - s0["intake"]["refused"],
        "lost": lost_subs + unsent,
        "lost_subscribers": lost_subs,
        "unsent": unsent,
        "gaps": tr.gaps - gaps0,
        "dups": tr.dups - dups0,
        "errors": sum(r["errors"] for r in runs),
        "behind": sum(r["scheduled"] - r["handed"] for r in runs),
        "settle_s": math.inf if w0 is None else w0 * WINDOW_S,
        "settle_1s_s": math.inf if w1 is None else (w1 + per_s) * WINDOW_S,
        "share_spread": (max(shares) - min(shares)) / mean if mean else math.inf,
        "shares": shares,
        "rates": rates,
        "fill_windows": fill_w,
        "p50_ms": pct(lat, 0.5) / 1e6 if lat else math.nan,
        "p99_ms": pct(lat, 0.99) / 1e6 if lat else math.nan,
        "server_cpu_pct": server_pct,
        "subscribers_cpu_pct": subs_pct,
        "publishers_cpu_pct": pubs_pct,
        "load_core_pct": core1,
        "flush_s": max(r["flush_s"] for r in runs),
        "limiters": [r["limiter"] for r in runs],
        "noise": other_work(k0, k1, server_pct, subs_pct + pubs_pct),
    }
    describe_phase(r, rate_r)
    return r


def describe_phase(r: dict[str, Any], rate_r: float) -> None:
    settle = "never" if r["settle_s"] == math.inf else f"{r['settle_s']:.2f} s"
    settle_1s = "never" if r["settle_1s_s"] == math.inf else f"{r['settle_1s_s']:.2f} s"
    print(
        f"    {r['phase']:<8} accepted {r['accepted_per_s']:,.0f}/s "
        f"({r['accepted_per_s'] / rate_r:.0%} of R; drained {r['drained_per_s']:,.0f}/s, "
        f"{r['drained_2nd_half_per_s']:,.0f}/s in the 2nd half) "
        f"| intake fill max {r['max_fill']} "
        f"p99 {r['p99_fill']:.0f} % | 429s {r['wasted_requests']} of {r['requests']} requests, "
        f"{r['refused_msgs']:,} msgs refused | lost {r['lost']:,} (subscribers "
        f"{r['lost_subscribers']:,}, GAPs {r['gaps']}, unsent {r['unsent']:,}) | latency p50 "
        f"{r['p50_ms']:.1f} p99 {r['p99_ms']:.1f} ms",
        flush=True,
    )
    print(
        f"             settle {settle} (by the rate over the last 1 s: {settle_1s}) "
        f"| shares {r['shares']} spread {r['share_spread']:.1%} | "
        f"generators behind by {r['behind']:,} msgs at the end | final flush "
        f"{r['flush_s']:.1f} s | server {r['server_cpu_pct']:.0f}% CPU | load core "
        f"{r['load_core_pct']:.0f}% busy (subscribers {r['subscribers_cpu_pct']:.0f}%, "
        f"publishers {r['publishers_cpu_pct']:.0f}%) | bottleneck: "
        f"{bottleneck(r['server_cpu_pct'], r['load_core_pct'])}{r['noise']}",
        flush=True,
    )
    print(
        "             accepted/R per 250 ms: " + " ".join(f"{x / rate_r:.2f}" for x in r["rates"]),
        flush=True,
    )
    print(
        "             max fill % per 250 ms: " + " ".join(map(str, r["fill_windows"])), flush=True
    )
    print(
        "             limiters at the end: "
        + "; ".join(
            f"{x['rate']:,.0f}/s, {x['naks']} NAKs, {x['cuts']} cuts, {x['ignored']} ignored"
            for x in r["limiters"]
        ),
        flush=True,
    )


async def run_publishers(args: argparse.Namespace, pin: bool) -> dict[str, Any]:
    n_topics, per_client = args.sub_topics, args.topics_per_client
    names = [f"bench.{i}" for i in range(n_topics)]
    groups = [names[g * per_client : (g + 1) * per_client] for g in range(n_topics // per_client)]
    subs_per_topic = args.subscribers // len(groups)
    server = Server(["--ring", str(args.ring), "--intake-messages", str(args.calib_intake)], pin)
    tr = Tracker()
    subs: list[Subscriber] = []
    ping_task: asyncio.Task[None] | None = None
    results: dict[str, Any] = {}
    try:
        await server.start()
        t = time.monotonic()
        subs = await open_subscribers(
            f"ws://127.0.0.1:{server.port}/rubris/ws", groups, args.subscribers, tr
        )
        st = await server.stats()
        if st["connected"] != args.subscribers:
            raise RuntimeError(f"{st['connected']} of {args.subscribers} subscribers connected")
        gc.collect()
        gc.freeze()  # the subscribers are long-lived: keep them out of the load's gc passes
        ping_task = asyncio.create_task(pinger([s.client for s in subs]))
        print(
            f"(b) publishers: {args.subscribers:,} WebSocket subscribers x {per_client} of "
            f"{n_topics} ring topics (ring {args.ring}, {subs_per_topic} subscribers a topic), "
            f"connected in {time.monotonic() - t:.1f} s; publishers in a process of their own "
            f"on the load core",
            flush=True,
        )
        await wait_quiet(args.quiet_wait)
        cal = await calibrate(server, tr, subs_per_topic, args)
        rate_r = cal["R"]
        results["calibration"] = cal
        if args.intake_s is not None:
            bound = max(1000, round(rate_r * args.intake_s))
        else:
            bound = args.intake
        await http(server.port, "POST", f"/control/intake?messages={bound}")
        print(
            f"    intake bounded to {bound:,} messages ({bound / rate_r:.1f} s of R); "
            f"{PUBLISHERS} publishers offering {OVERLOAD * rate_r:,.0f} msgs/s together "
            f"(5 x R), {args.phase:g} s per phase",
            flush=True,
        )
        for name in ("paced", "unpaced"):
            results[name] = await run_phase(name, server, tr, subs, rate_r, args)
    finally:
        if ping_task is not None:
            ping_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ping_task
        gc.unfreeze()
        try:
            await close_clients([s.client for s in subs])
        finally:
            await server.stop()
    return results


def verdict(paced: dict[str, Any]) -> list[str]:
    """The issue's targets for the paced phase, each with by how much it was missed."""
    out = []
    checks = [
        ("intake fill < 90 %", paced["max_fill"] < 90, f"max {paced['max_fill']} %"),
        ("nothing refused", paced["refused_msgs"] == 0, f"{paced['refused_msgs']:,} refused"),
        ("nothing lost", paced["lost"] == 0, f"{paced['lost']:,} lost"),
        ("settle within 2 s", paced["settle_s"] <= 2.0, f"settle {paced['settle_s']:.2f} s"),
        (
            "shares within 20 %",
            paced["share_spread"] <= 0.2,
            f"spread {paced['share_spread']:.1%}",
        ),
    ]
    for what, ok, figure in checks:
        out.append(f"{what}: {'met' if ok else 'MISSED'} ({figure})")
    return out


async def amain(args: argparse.Namespace, pin: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    api = await run_api(args, pin) if not args.skip_api else {"msgs_per_s": 0, "diagnostics": []}
    pubs = await run_publishers(args, pin) if not args.skip_publishers else {}
    return api, pubs


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="shorter windows")
    ap.add_argument("--api-conns", type=int, default=4)
    ap.add_argument("--api-batch", type=int, default=1000)
    ap.add_argument("--api-topics", type=int, default=1000)
    ap.add_argument("--api-warmup", type=float, default=None)
    ap.add_argument("--api-measure", type=float, default=None)
    ap.add_argument("--api-diag", type=float, default=None, help="diagnostic windows (0: none)")
    ap.add_argument("--skip-api", action="store_true", help="only (b)")
    ap.add_argument("--skip-publishers", action="store_true", help="only (a)")
    ap.add_argument("--subscribers", type=int, default=1000)
    ap.add_argument("--sub-topics", type=int, default=100, help="ring topics in (b)")
    ap.add_argument("--topics-per-client", type=int, default=10)
    ap.add_argument("--ring", type=int, default=1024)
    ap.add_argument("--calib-intake", type=int, default=20_000, help="intake bound meanwhile")
    ap.add_argument("--calib-warmup", type=float, default=None)
    ap.add_argument("--calib-measure", type=float, default=None)
    ap.add_argument(
        "--intake",
        type=int,
        default=Limits().intake_messages,
        help="intake bound (messages) for the paced and unpaced phases; default: the package's",
    )
    ap.add_argument("--intake-s", type=float, default=None, help="instead: seconds of R")
    ap.add_argument("--pub-batch", type=int, default=1000, help="Publisher(batch=...)")
    ap.add_argument("--phase", type=float, default=None, help="seconds per publisher phase")
    ap.add_argument("--flush-limit", type=float, default=30.0)
    ap.add_argument("--quiet-wait", type=float, default=3.0)
    args = ap.parse_args()
    defaults = {
        "api_warmup": (0.5, 1.0),
        "api_measure": (3.0, 5.0),
        "api_diag": (2.0, 3.0),
        "calib_warmup": (0.5, 1.0),
        "calib_measure": (2.0, 3.0),
        "phase": (5.0, 8.0),
    }
    quick_or_full(args, defaults)

    pin = prepare_load(
        f"ingest: cores={os.cpu_count()} python={sys.version.split()[0]} server core "
        f"{SERVER_CORE}, load core {LOAD_CORE}{' (quick)' if args.quick else ''}"
    )
    started = time.monotonic()
    try:
        api, pubs = uvloop.run(amain(args, pin))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    if pubs:
        print("targets (paced): " + "; ".join(verdict(pubs["paced"])), flush=True)
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)
    if not pubs:
        print(f"api_msgs_per_s={api['msgs_per_s']}", flush=True)
        return
    paced, unpaced = pubs["paced"], pubs["unpaced"]
    print(
        f"unpaced_refused={unpaced['refused_msgs']} "
        f"unpaced_wasted_requests={unpaced['wasted_requests']} "
        f"unpaced_p99_ms={unpaced['p99_ms']:.1f} paced_p99_ms={paced['p99_ms']:.1f} "
        f"paced_max_fill={paced['max_fill']}",
        flush=True,
    )
    print(
        f"api_msgs_per_s={api['msgs_per_s']} paced_refused={paced['refused_msgs']} "
        f"paced_lost={paced['lost']} settle_s={paced['settle_s']:.2f} "
        f"share_spread={paced['share_spread']:.3f}",
        flush=True,
    )


if __name__ == "__main__":
    main()

"""Spark pipeline benchmark: a Spark write to 100 subscribers, and the streaming bars' latency.

Not a test. Two parts, 127.0.0.1 only, the server alone on core 0 and everything else (the Spark
driver, its JVM and Python workers, the plain loop, the WebSocket subscribers) on core 1, as in
bench/ingest.py.

(1) Throughput: rows per second from the start of a write of 1,000,000 rows to acknowledged
    delivery at 100 subscribers, Spark against a plain Python loop.

    The server (this file's ``_serve`` mode: uvicorn with uvloop, httptools and the
    ``websockets-sansio`` WebSocket implementation, no permessage-deflate, Rubris mounted at
    /rubris with ``api_token``, the snapshot channel ``bench.{k}``, an ASGI wrapper that counts
    the API's answers by status and keeps the highest ``Rubris-Fill`` they carried, and a
    control route for its CPU time and ``rubris.stats()``) is started fresh for every round.
    The subscribers (``_subs`` mode: 100 ``rubris_asgi.client.Client`` over WebSocket in one
    uvloop process) subscribe to 10 topics each, client i to ``bench.{i + 100 j}``, so every
    one of the 1,000 topics has one subscriber and every client holds topics of both halves.

    The rows are ``(k, seq, price, qty, last)``, ``seq`` 0 .. N-1, published to ``bench.{k}``.
    Each topic's rows come from one Spark partition: with N rows in 2 partitions of N/2,
    partition p holds topics 500 p .. 500 p + 499 and ``k = p * 500 + seq % 500``, so a topic
    gets its 1,000 rows in seq order and its last row (``last = true``, the highest seq of the
    topic) is its final value. (With ``k = id % 1000`` both partitions would write every topic
    at once and whichever task answered last would set the topic's final value: a snapshot
    keeps the last value it is given, and the marked row could be conflated away.)
    "Acknowledged delivery": every write request answered 200 (the write returned without
    error) and every subscriber holds the final row of each of its topics. The clock runs from
    just before ``.save()`` (or the loop's first publish) to the moment the last subscriber's
    callback took the last final value (CLOCK_MONOTONIC, one clock for every process).

    spark   ``SparkSession`` ``local[2]``, UI off, ``spark.sql.shuffle.partitions=2``,
            ``rubris_asgi.spark.register(spark)``; ``spark.range(N, numPartitions=2)``, the
            columns by ``selectExpr``, then ``df.write.format("rubris")`` with ``url``, ``token``
            and ``topic=bench.{k}`` (sink defaults: 1,000 rows a request, paced by the fill).
            A 20,000-row write (``last = false``) to the same server first starts Spark's Python
            workers (they are reused by the timed write).
    loop    one Python process (``_loop`` mode): ``SyncPublisher`` (defaults: batch 1,000) and a
            ``for`` loop building the same rows as dicts, ``pub.publish(f"bench.{k}", row)``,
            then ``flush()``; it too warms up with 20,000 rows first.

    Rounds alternate (spark, loop, spark, loop, ...); figures are medians over ``--rounds``.
    Per run: rows/s to acknowledged delivery, when the first request came in (Spark plans the
    job and starts its tasks first), how long the write itself took (all answers in),
    server CPU seconds per million rows (getrusage of the server, over the timed part),
    producer CPU seconds per million rows (the Spark driver, JVM and Python workers from
    /proc, or the loop's getrusage), the subscribers' (/proc), the API's answers by status
    (429s: the intake was full),
    the highest intake fill any answer carried, the pushes the subscribers took, and the busy
    share of each core (/proc/stat; a run in which other processes used our cores is NOISY).

(2) Latency: the example app's streaming bars pipeline (``example_app.pipeline.bars_query``:
    trades read from the ring topic ``trades`` with ``readStream.format("rubris")``, per-symbol
    OHLC/VWAP bars per window, update output mode, each micro-batch's changed bars written to
    ``bars.{symbol}`` by the rubris sink). The example app (``example_app.app:app``, served
    with ``rubris_asgi.serve`` as ``python3 -m example_app`` does, ``RUBRIS_API_TOKEN`` set) runs
    on core 0 with its own simulated market printing trades; the query (trigger 0 s) runs in
    this process's SparkSession; one client (``_bars`` mode) subscribes to ``bars.{symbol}``
    for every symbol. Latency of a bar = the wall-clock time its push came out of the client's
    callback minus its ``last_ts`` (the ``ts`` of the newest trade in it, stamped by the app
    when it published the trade): trade published to bar pushed. Measured from the end of the
    third micro-batch (and ``--bars-warmup`` s at least: the first ones read what the ring
    holds and start Python workers) for ``--bars-measure`` seconds; p50/p90/p99 with the
    window, the app's trade rate and the micro-batches' durations (``query.recentProgress``).

Targets (the issue): Spark >= 50,000 rows/s and >= 0.8 x the plain loop; bar latency p99 <=
the window + 1 s.

    python3 bench/spark.py            # 3 rounds each, 40 s of bars: about 2.5 minutes
    python3 bench/spark.py --quick    # 1 round each of 200,000 rows, 10 s of bars: about 1 minute

Before the last line, the medians as a markdown table and the targets met or missed. The last
line: ``spark_rows_per_s=N loop_rows_per_s=N bar_p50_ms=N bar_p99_ms=N ratio=R window_s=S``
(medians of the rounds; ``nan`` for bars not measured).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, ROOT)

from fanout import core_usage, cpu_ticks, pct, prepare_load  # noqa: E402

SERVER_CORE = 0
LOAD_CORE = 1
TOKEN = "bench-token"
TOPICS = 1000
PARTS = 2
CLIENTS = 100
PER_CLIENT = 10
WARM_ROWS = 20_000
SPARK_TARGET = 50_000
RATIO_TARGET = 0.8
NOISY_PCT = 15.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- the rows


def topic_of(seq: int, rows: int) -> tuple[int, bool]:
    """The topic ``k`` of row ``seq`` of an ``rows``-row write, and whether it is the topic's
    last row: partition p (of PARTS) holds the topics ``p * TOPICS / PARTS`` onward."""
    per, tpp = rows // PARTS, TOPICS // PARTS
    p, r = divmod(seq, per)
    return p * tpp + r % tpp, r >= per - tpp


def spark_columns(rows: int, warm: bool) -> list[str]:
    """The same rows as ``topic_of`` and ``loop_rows``, as Spark SQL expressions over ``id``."""
    per, tpp = rows // PARTS, TOPICS // PARTS
    return [
        f"CAST(id DIV {per} * {tpp} + id % {tpp} AS INT) AS k",
        "id AS seq",
        "100 + (id % 1000) / 100 AS price",  # a double: 100.0 would be a decimal literal
        "CAST(id % 100 + 1 AS INT) AS qty",
        "false AS last" if warm else f"id % {per} >= {per - tpp} AS last",
    ]


def loop_rows(rows: int, warm: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    for seq in range(rows):
        k, last = topic_of(seq, rows)
        yield (
            f"bench.{k}",
            {
                "k": k,
                "seq": seq,
                "price": 100 + (seq % 1000) / 100.0,
                "qty": seq % 100 + 1,
                "last": last and not warm,
            },
        )


def finals(rows: int) -> dict[int, int]:
    """Each topic's final seq."""
    per, tpp = rows // PARTS, TOPICS // PARTS
    return {p * tpp + j: p * per + per - tpp + j for p in range(PARTS) for j in range(tpp)}


# --------------------------------------------------------------------------- processes


def read_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """One line of a child's stdout, or RuntimeError after ``timeout`` seconds."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"no answer from {proc.args!r} within {timeout:g} s")
        ready, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
        if ready:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{proc.args!r} exited (status {proc.wait()})")
            return line.strip()
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited (status {proc.returncode})")


def spawn(mode: str, *args: str, cpu: int | None = None) -> subprocess.Popen[bytes]:
    argv = [sys.executable, os.path.abspath(__file__), mode, *args]
    if cpu is not None:
        argv += ["--cpu", str(cpu)]
    # its own session: a Ctrl-C reaches only this process, which then stops the children
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )


def tell(proc: subprocess.Popen[bytes], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line.encode() + b"\n")
    proc.stdin.flush()


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 15.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ServerProc:
    """A server subprocess (``_serve`` or ``_app`` mode) announcing ``PORT n``."""

    def __init__(self, mode: str, *args: str, pin: bool) -> None:
        self.proc = spawn(mode, *args, cpu=SERVER_CORE if pin else None)
        line = read_line(self.proc, 60)
        if not line.startswith(b"PORT "):
            raise RuntimeError(f"server did not start: {line!r}")
        self.port = int(line.split()[1])
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.http.get("/").raise_for_status()
                break
            except (httpx.HTTPError, OSError):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.05)

    @property
    def mount(self) -> str:
        return f"http://127.0.0.1:{self.port}/rubris"

    def stats(self, mark: bool = False) -> dict[str, Any]:
        r = self.http.get("/control/stats", params={"mark": "1"} if mark else None)
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def close(self) -> None:
        self.http.close()
        stop(self.proc)


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of one process so far, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu(root: int, exclude: set[int]) -> float:
    """CPU seconds of ``root`` and its descendants (/proc), with the children they have waited
    for, without the subtrees of ``exclude``: the Spark driver with its JVM, Python daemons and
    workers."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(name)
        parent[pid] = int(fields[1])
        # with the children it has waited for: Spark's short-lived Python workers
        cpu[pid] = sum(int(x) for x in fields[11:15]) / CLK_TCK
    total = 0.0
    for pid in cpu:
        p = pid
        while p not in (0, 1) and p != root and p not in exclude:
            p = parent.get(p, 0)
        if p == root:
            total += cpu[pid]
    return total


def quiet(limit: float, threshold: float = 10.0) -> float:
    """Wait (up to ``limit`` s) until both cores are idle; returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        a = cpu_ticks()
        time.sleep(0.25)
        usage = core_usage(a, cpu_ticks())
        if all(usage.get(f"cpu{c}_busy_pct", 0.0) < threshold for c in (0, 1)):
            break
    return time.monotonic() - started


# --------------------------------------------------------------------------- (1) throughput


def spark_session(parallel: int) -> Any:
    from example_app.pipeline import spark_session as demo_session

    return demo_session(f"local[{parallel}]", "rubris-bench")


def spark_write(spark: Any, url: str, rows: int, warm: bool) -> None:
    df = spark.range(rows, numPartitions=PARTS).selectExpr(*spark_columns(rows, warm))
    (
        df.write.format("rubris")
        .option("url", url)
        .option("token", TOKEN)
        .option("topic", "bench.{k}")
        .mode("append")
        .save()
    )


def run_once(kind: str, spark: Any, args: argparse.Namespace, pin: bool) -> dict[str, Any]:
    """One timed write of ``args.rows`` rows by ``kind`` (spark or loop) on a fresh server."""
    server = ServerProc("_serve", pin=pin)
    subs: subprocess.Popen[bytes] | None = None
    loop: subprocess.Popen[bytes] | None = None
    me = os.getpid()
    try:
        subs = spawn("_subs", "--port", str(server.port), "--rows", str(args.rows))
        line = read_line(subs, 60)
        if line != b"READY":
            raise RuntimeError(f"subscribers did not start: {line!r}")
        if kind == "spark":
            spark_write(spark, server.mount, WARM_ROWS, warm=True)
        else:
            loop = spawn("_loop", "--port", str(server.port), "--rows", str(args.rows))
            line = read_line(loop, 60)
            if line != b"READY":
                raise RuntimeError(f"loop did not start: {line!r}")
        time.sleep(0.3)  # the warm-up's last pushes
        waited = quiet(args.quiet_wait)
        tell(subs, "MARK")
        if read_line(subs, 10) != b"MARKED":
            raise RuntimeError("subscribers did not answer MARK")
        s0 = server.stats(mark=True)
        c0 = {"server": proc_cpu(server.proc.pid), "subs": proc_cpu(subs.pid)}
        c0["load"] = tree_cpu(me, {server.proc.pid})
        c0["spark"] = tree_cpu(me, {server.proc.pid, subs.pid})
        k0 = cpu_ticks()
        if kind == "spark":
            t0 = time.monotonic_ns()
            spark_write(spark, server.mount, args.rows, warm=False)
            written = time.monotonic_ns()
            retries = refusals = None
        else:
            assert loop is not None
            tell(loop, "GO")
            res = orjson.loads(read_line(loop, args.timeout))
            t0, written = res["start_ns"], res["end_ns"]
            retries, refusals = res["retries"], res["refusals"]
        done = orjson.loads(read_line(subs, args.timeout))
        k1 = cpu_ticks()
        c1 = {"server": proc_cpu(server.proc.pid), "subs": proc_cpu(subs.pid)}
        c1["load"] = tree_cpu(me, {server.proc.pid})
        c1["spark"] = tree_cpu(me, {server.proc.pid, subs.pid})
        s1 = server.stats()
    finally:
        stop(loop)
        stop(subs)
        server.close()
    if done["wrong"]:
        raise RuntimeError("subscribers saw other last rows: " + "; ".join(done["wrong"][:5]))
    wall = (done["last_ns"] - t0) / 1e9
    cpu = {k: c1[k] - c0[k] for k in c0}
    producer_cpu = cpu["spark"] if kind == "spark" else res["cpu_s"]
    statuses = Counter({int(k): v for k, v in s1["answers"].items()})
    statuses.subtract({int(k): v for k, v in s0["answers"].items()})
    machine = core_usage(k0, k1)
    window = (k1[f"cpu{SERVER_CORE}"][1] - k0[f"cpu{SERVER_CORE}"][1]) / CLK_TCK
    ours = {SERVER_CORE: cpu["server"], LOAD_CORE: cpu["load"]}
    noise = {
        c: machine.get(f"cpu{c}_busy_pct", 0.0) - ours[c] / window * 100 for c in ours if window
    }
    return {
        "kind": kind,
        "rows": args.rows,
        "rows_per_s": round(args.rows / wall),
        "seconds": round(wall, 2),
        "write_s": round((written - t0) / 1e9, 2),
        "tail_s": round((done["last_ns"] - written) / 1e9, 3),
        "first_request_s": round((s1["first_ns"] - t0) / 1e9, 3) if s1["first_ns"] else None,
        "server_cpu_s_per_m": round(cpu["server"] / args.rows * 1e6, 2),
        "producer_cpu_s_per_m": round(producer_cpu / args.rows * 1e6, 2),
        "subs_cpu_s_per_m": round(cpu["subs"] / args.rows * 1e6, 2),
        "server_pct": round(cpu["server"] / window * 100, 1) if window else 0.0,
        "producer_pct": round(producer_cpu / window * 100, 1) if window else 0.0,
        "subs_pct": round(cpu["subs"] / window * 100, 1) if window else 0.0,
        "core0_pct": machine.get("cpu0_busy_pct", 0.0),
        "core1_pct": machine.get("cpu1_busy_pct", 0.0),
        "noise": {c: round(v) for c, v in noise.items() if v > NOISY_PCT},
        "answers": {k: v for k, v in sorted(statuses.items()) if v},
        "max_fill": s1["max_fill"],
        "refused_msgs": s1["intake"]["refused"] - s0["intake"]["refused"],
        "conflated": s1["intake"]["conflated"] - s0["intake"]["conflated"],
        "cycles": s1["cycle"]["cycles"] - s0["cycle"]["cycles"],
        "pushes": done["pushes"],
        "retries": retries,
        "refusals": refusals,
        "quiet_wait_s": round(waited, 1),
    }


def describe(r: dict[str, Any]) -> str:
    answers = ", ".join(f"{v:,} x {k}" for k, v in r["answers"].items())
    line = (
        f"  {r['kind']:<5} {r['rows_per_s']:>7,} rows/s ({r['seconds']:.2f} s to the last final; "
        f"first request after {r['first_request_s']:.2f} s; write {r['write_s']:.2f} s, last "
        f"final {r['tail_s'] * 1000:+.0f} ms after it) | CPU-s "
        f"per M rows: server {r['server_cpu_s_per_m']:.2f} ({r['server_pct']:.0f}%), producer "
        f"{r['producer_cpu_s_per_m']:.2f} ({r['producer_pct']:.0f}%), subscribers "
        f"{r['subs_cpu_s_per_m']:.2f} ({r['subs_pct']:.0f}%; {r['pushes']:,} pushes) | cores "
        f"{r['core0_pct']:.0f} / {r['core1_pct']:.0f}% busy | answers {answers}; fill max "
        f"{r['max_fill']} %; {r['cycles']:,} cycles"
    )
    if r["retries"]:
        line += f" | publisher retries {r['retries']} (429s {r['refusals']})"
    if r["noise"]:
        line += " | NOISY: " + ", ".join(f"core {c} +{v}%" for c, v in r["noise"].items())
    return line


# --------------------------------------------------------------------------- (2) latency


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_latency(spark: Any, args: argparse.Namespace, pin: bool) -> dict[str, Any]:
    """(2): the example app on core 0, ``bars_query`` in this SparkSession, one client on every
    ``bars.{symbol}``; the bars' latency over ``--bars-measure`` seconds after a warm-up."""
    from example_app.market import SYMBOLS
    from example_app.pipeline import bars_query

    server = ServerProc("_app", "--port", str(free_port()), pin=pin)
    bars: subprocess.Popen[bytes] | None = None
    query: Any = None
    checkpoint = tempfile.mkdtemp(prefix="rubris-bench-bars-")
    out: dict[str, Any] = {"window": args.window, "error": None}
    try:
        bars = spawn("_bars", "--port", str(server.port), "--symbols", ",".join(SYMBOLS))
        line = read_line(bars, 60)
        if line != b"READY":
            raise RuntimeError(f"bar subscriber did not start: {line!r}")
        started = time.monotonic()
        query = bars_query(
            spark,
            server.mount,
            TOKEN,
            window=args.window,
            checkpoint=checkpoint,
            trigger="0 seconds",
        )
        # warm-up: the first micro-batches read what the ring holds and start the Python
        # workers; measure from the end of the third one (and --bars-warmup seconds at least)
        error = watch(query, args.bars_warmup)
        deadline = time.monotonic() + 60
        while error is None and len(query.recentProgress) < 3 and time.monotonic() < deadline:
            error = watch(query, 0.25)
        if error is None:
            between_batches(query, 10.0)
            s0 = trades_head(server)
            tell(bars, "MARK")
            t0 = time.monotonic()
            batches0 = len(query.recentProgress)
            error = watch(query, args.bars_measure)
            tell(bars, "STOP")
            res = orjson.loads(read_line(bars, 30))
            s1 = trades_head(server)
            measured = time.monotonic() - t0
            progress = query.recentProgress[batches0:] if error is None else []
        if error is not None:
            out["error"] = error
            return out
    finally:
        if query is not None:
            with contextlib.suppress(Exception):
                between_batches(query, 5.0)
                query.stop()
        stop(bars)
        server.close()
        shutil.rmtree(checkpoint, ignore_errors=True)
    lat = sorted(res["latency_ms"])
    trades = s1 - s0
    durations = sorted(p["durationMs"].get("triggerExecution", 0) for p in progress)
    parts = (
        {
            key: round(statistics.median(p["durationMs"].get(key, 0) for p in progress))
            for key in ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets")
        }
        if progress
        else {}
    )
    rows_in = sorted(p.get("numInputRows", 0) for p in progress)
    out.update(
        {
            "bars": len(lat),
            "symbols_with_bars": res["symbols"],
            "trades": trades,
            "trades_per_s": round(trades / measured, 1) if measured else 0.0,
            "p50_ms": round(pct(lat, 0.5)) if lat else None,
            "p90_ms": round(pct(lat, 0.9)) if lat else None,
            "p99_ms": round(pct(lat, 0.99)) if lat else None,
            "max_ms": round(lat[-1]) if lat else None,
            "min_ms": round(lat[0]) if lat else None,
            "measure_s": round(measured, 1),
            "startup_s": round(t0 - started, 1),
            "micro_batches": len(progress),
            "batch_p50_ms": round(pct(durations, 0.5)) if durations else None,
            "batch_max_ms": durations[-1] if durations else None,
            "batch_rows_p50": round(pct(rows_in, 0.5)) if rows_in else None,
            "batch_parts_ms": parts,
        }
    )
    return out


def between_batches(query: Any, limit: float) -> None:
    """Wait (up to ``limit`` s) for the query to finish a micro-batch: stopped in the middle of
    its write, the write is interrupted and Spark prints the aborted write's errors."""
    deadline = time.monotonic() + limit
    seen = query.lastProgress
    while time.monotonic() < deadline and query.isActive and query.lastProgress == seen:
        time.sleep(0.005)


def watch(query: Any, seconds: float) -> str | None:
    """Wait ``seconds`` while the query runs; its error if it stopped meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not query.isActive:
            exc = query.exception()
            text = str(exc.desc if exc is not None and hasattr(exc, "desc") else exc)
            return text.strip().splitlines()[0] if text.strip() else "the query stopped"
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
    return None


def trades_head(server: ServerProc) -> int:
    """The head seq of the app's ``trades`` ring (how many trades it printed)."""
    r = server.http.get(
        "/rubris/api/topics/trades",
        params={"after": str(1 << 62)},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    r.raise_for_status()
    head: int = r.json()["head"]
    return head


def window_seconds(window: str) -> float:
    amount, unit = window.split()
    scale = {"second": 1, "seconds": 1, "minute": 60, "minutes": 60, "millisecond": 0.001}
    return float(amount) * scale.get(unit, 1)


# --------------------------------------------------------------------------- child modes


def serve_mode(argv: list[str]) -> None:
    """The throughput part's server: the snapshot channel ``bench.{k}`` and a stats route."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", type=int, default=None)
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})

    from _fanout_server import cpu_seconds, orphan_watchdog, raise_nofile, serve_on_free_port
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Mount, Route

    from rubris_asgi import Config, Rubris, Session, Timing

    raise_nofile()
    rubris = Rubris(Config(timing=Timing(heartbeat=60.0)), compress_at=None, api_token=TOKEN)

    @rubris.shared("bench.{k}", snapshot=True)
    async def bench_topic(session: Session, k: str) -> None:
        return None

    answers: Counter[int] = Counter()
    fills = [0]
    first = [0]  # when the first request since the last mark came in (CLOCK_MONOTONIC ns)

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        """Rubris, with the API's answers counted by status and their highest fill kept."""
        if scope["type"] != "http":
            await rubris(scope, receive, send)
            return

        if not first[0]:
            first[0] = time.monotonic_ns()

        async def send_counted(message: Any) -> None:
            if message["type"] == "http.response.start":
                answers[message["status"]] += 1
                for name, value in message.get("headers", ()):
                    if name.lower() == b"rubris-fill":
                        fills[0] = max(fills[0], int(value))
            await send(message)

        await rubris(scope, receive, send_counted)

    async def stats(request: Request) -> Response:
        user, system = cpu_seconds()
        st = rubris.stats()
        body = {
            "cpu": user + system,
            "connected": st.connected,
            "intake": {
                "accepted": st.intake.accepted,
                "refused": st.intake.refused,
                "published": st.intake.published,
                "conflated": st.intake.conflated,
                "pending": st.intake.pending,
            },
            "cycle": {"cycles": st.cycle.cycles},
            "answers": {str(k): v for k, v in answers.items()},
            "max_fill": fills[0],
            "first_ns": first[0],
        }
        if request.query_params.get("mark"):
            fills[0] = 0
            first[0] = 0
        return Response(orjson.dumps(body), media_type="application/json")

    async def root(request: Request) -> Response:
        return Response(b"ok")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        async with rubris:
            watchdog = asyncio.create_task(orphan_watchdog())
            try:
                yield
            finally:
                watchdog.cancel()

    app = Starlette(
        routes=[
            Route("/", root),
            Route("/control/stats", stats),
            Mount("/rubris", counted),
        ],
        lifespan=lifespan,
    )
    serve_on_free_port(app)


def app_mode(argv: list[str]) -> None:
    """The example app, served as ``python3 -m example_app`` serves it."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--cpu", type=int, default=None)
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    os.environ["RUBRIS_API_TOKEN"] = TOKEN
    from example_app.app import app, rubris
    from rubris_asgi import serve

    print(f"PORT {args.port}", flush=True)
    serve(app, rubris, host="127.0.0.1", port=args.port, log_level="warning")


def subs_mode(argv: list[str]) -> None:
    """100 clients x 10 snapshot topics; prints READY, MARKED when told MARK (the timed write
    starts), then, when every client holds the final row of each of its topics, the times of
    the first and the last final (``last_ns``) and the pushes taken since MARK."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--rows", type=int, required=True)
    args = ap.parse_args(argv)
    import uvloop

    uvloop.run(subs_main(args.port, args.rows))


async def subs_main(port: int, rows: int) -> None:
    from rubris_asgi.client import Client, PushInfo

    want = finals(rows)
    left = [CLIENTS * PER_CLIENT]
    times: list[int] = []
    pushes = [0]
    wrong: list[str] = []
    done = asyncio.Event()

    def callback_for(k: int) -> Callable[[Any, PushInfo], None]:
        final = want[k]
        held = [False]

        def on_push(value: Any, info: PushInfo) -> None:
            pushes[0] += 1
            if held[0] or not value["last"]:
                return
            if value["seq"] != final:
                wrong.append(f"bench.{k}: last row {value['seq']}, expected {final}")
            held[0] = True
            times.append(time.monotonic_ns())
            left[0] -= 1
            if not left[0]:
                done.set()

        return on_push

    async def one(i: int) -> Client:
        client = Client(f"http://127.0.0.1:{port}/rubris")
        await client.connect()
        for j in range(PER_CLIENT):
            k = i + CLIENTS * j
            await client.subscribe(f"bench.{k}", callback_for(k))
        return client

    clients = await asyncio.gather(*(one(i) for i in range(CLIENTS)))
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print("READY", flush=True)
    await reader.readline()  # MARK: what follows is the timed write
    pushes[0] = 0
    print("MARKED", flush=True)
    await done.wait()
    out = {"last_ns": max(times), "first_ns": min(times), "pushes": pushes[0], "wrong": wrong}
    print(orjson.dumps(out).decode(), flush=True)
    await reader.readline()  # end of input: the bench is done with us
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


def loop_mode(argv: list[str]) -> None:
    """The plain loop: warm up, READY, then on GO the timed rows; prints the result."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--rows", type=int, required=True)
    args = ap.parse_args(argv)
    from rubris_asgi.client.publisher import SyncPublisher

    url = f"http://127.0.0.1:{args.port}/rubris"
    with SyncPublisher(url, token=TOKEN) as pub:
        for topic, row in loop_rows(WARM_ROWS, warm=True):
            pub.publish(topic, row)
        pub.flush()
        print("READY", flush=True)
        sys.stdin.readline()
        s0 = (pub.stats.retries, pub.stats.refusals)
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        start = time.monotonic_ns()
        publish = pub.publish
        for topic, row in loop_rows(args.rows, warm=False):
            publish(topic, row)
        pub.flush()
        end = time.monotonic_ns()
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    print(
        orjson.dumps(
            {
                "start_ns": start,
                "end_ns": end,
                "cpu_s": cpu,
                "retries": pub.stats.retries - s0[0],
                "refusals": pub.stats.refusals - s0[1],
            }
        ).decode(),
        flush=True,
    )


def bars_mode(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--symbols", required=True)
    args = ap.parse_args(argv)
    import uvloop

    uvloop.run(bars_main(args.port, args.symbols.split(",")))


async def bars_main(port: int, symbols: list[str]) -> None:
    """One client on ``bars.{symbol}`` of every symbol; from MARK to STOP it notes each bar's
    latency (receive wall-clock time minus its ``last_ts``)."""
    from rubris_asgi.client import Client, PushInfo

    recording = [False]
    lat: list[float] = []
    seen: set[str] = set()

    def on_bar(value: Any, info: PushInfo) -> None:
        now_ms = time.time() * 1000
        if recording[0] and isinstance(value, dict) and value.get("last_ts") is not None:
            lat.append(now_ms - value["last_ts"])
            seen.add(info.name)

    client = Client(f"http://127.0.0.1:{port}/rubris")
    await client.connect()
    for s in symbols:
        await client.subscribe(f"bars.{s}", on_bar)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print("READY", flush=True)
    await reader.readline()  # MARK
    recording[0] = True
    await reader.readline()  # STOP
    recording[0] = False
    print(orjson.dumps({"latency_ms": lat, "symbols": len(seen)}).decode(), flush=True)
    await client.close()


MODES: dict[str, Callable[[list[str]], None]] = {
    "_serve": serve_mode,
    "_app": app_mode,
    "_subs": subs_mode,
    "_loop": loop_mode,
    "_bars": bars_mode,
}


# --------------------------------------------------------------------------- main


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median rows/s (the lower middle one of an even count)."""
    ordered = sorted(runs, key=lambda r: r["rows_per_s"])
    return ordered[(len(ordered) - 1) // 2]


def table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """The medians side by side (markdown, as docs/benchmarks.md shows them)."""
    med = {kind: median_run(rs) for kind, rs in runs.items()}

    def all_rates(kind: str) -> str:
        rates = sorted(r["rows_per_s"] for r in runs[kind])
        shown = f"**{med[kind]['rows_per_s']:,}**"
        return shown + (f" ({rates[0]:,} .. {rates[-1]:,})" if len(rates) > 1 else "")

    def answers(r: dict[str, Any]) -> str:
        return ", ".join(f"{v:,} × {k}" for k, v in r["answers"].items())

    spec: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("seconds to the last final", lambda r: f"{r['seconds']:.2f}"),
        ("first request in after", lambda r: f"{r['first_request_s']:.2f} s"),
        ("write (every answer in)", lambda r: f"{r['write_s']:.2f} s"),
        ("server CPU-s per M rows", lambda r: f"{r['server_cpu_s_per_m']:.2f}"),
        ("producer CPU-s per M rows", lambda r: f"{r['producer_cpu_s_per_m']:.2f}"),
        ("subscribers CPU-s per M rows", lambda r: f"{r['subs_cpu_s_per_m']:.2f}"),
        ("pushes to the subscribers", lambda r: f"{r['pushes']:,}"),
        ("API answers", answers),
        ("intake fill max", lambda r: f"{r['max_fill']} %"),
        ("core 0 / core 1 busy", lambda r: f"{r['core0_pct']:.0f} / {r['core1_pct']:.0f} %"),
    ]
    lines = [
        '| | Spark (`local[2]`, `format("rubris")`) | plain loop (`SyncPublisher`) |',
        "| --- | --- | --- |",
        f"| rows/s to acknowledged delivery | {all_rates('spark')} | {all_rates('loop')} |",
    ]
    for name, fn in spec:
        lines.append(f"| {name} | {fn(med['spark'])} | {fn(med['loop'])} |")
    return "\n".join(lines)


def met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in MODES:
        MODES[sys.argv[1]](sys.argv[2:])
        return
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="1 round of 200,000 rows, 10 s of bars")
    ap.add_argument("--rounds", type=int, default=None, help="timed writes of each kind")
    ap.add_argument("--rows", type=int, default=None, help="rows a write (a multiple of 1,000)")
    ap.add_argument("--window", default="1 second", help="the bars' window")
    ap.add_argument(
        "--bars-warmup",
        type=float,
        default=None,
        help="seconds at least before measuring (and 3 micro-batches done)",
    )
    ap.add_argument("--bars-measure", type=float, default=None, help="seconds of bars measured")
    ap.add_argument("--skip-bars", action="store_true", help="only the throughput part")
    ap.add_argument("--skip-throughput", action="store_true", help="only the latency part")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a write may take")
    ap.add_argument("--quiet-wait", type=float, default=3.0)
    args = ap.parse_args()
    for key, quick, full in (
        ("rounds", 1, 3),
        ("rows", 200_000, 1_000_000),
        ("bars_warmup", 5.0, 10.0),
        ("bars_measure", 10.0, 40.0),
    ):
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    if args.rows % TOPICS:
        ap.error("--rows must be a multiple of 1,000")

    pin = prepare_load(
        f"spark: cores={os.cpu_count()} python={sys.version.split()[0]} server core "
        f"{SERVER_CORE}; Spark (local[2]), loop and subscribers core {LOAD_CORE}"
        f"{' (quick)' if args.quick else ''}"
    )
    started = time.monotonic()
    spark = spark_session(2)
    print(f"SparkSession up in {time.monotonic() - started:.1f} s", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {"spark": [], "loop": []}
    lat: dict[str, Any] | None = None
    try:
        if not args.skip_throughput:
            print(
                f"(1) {args.rows:,} rows to {TOPICS:,} snapshot topics, {CLIENTS} subscribers x "
                f"{PER_CLIENT} topics, {args.rounds} round(s) each, a fresh server a run",
                flush=True,
            )
            for _ in range(args.rounds):
                for kind in ("spark", "loop"):
                    r = run_once(kind, spark, args, pin)
                    runs[kind].append(r)
                    print(describe(r), flush=True)
        if not args.skip_bars:
            lat = run_latency(spark, args, pin)
            print(describe_bars(lat), flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        spark.stop()
    verdicts = []
    last = []
    if runs["spark"]:
        print(table(runs), flush=True)
        sp, lp = median_run(runs["spark"]), median_run(runs["loop"])
        ratio = sp["rows_per_s"] / lp["rows_per_s"]
        verdicts += [
            f"spark >= {SPARK_TARGET:,} rows/s: {met(sp['rows_per_s'] >= SPARK_TARGET)}",
            f"spark >= {RATIO_TARGET} x loop: {met(ratio >= RATIO_TARGET)} ({ratio:.2f})",
        ]
        last += [f"spark_rows_per_s={sp['rows_per_s']}", f"loop_rows_per_s={lp['rows_per_s']}"]
    if lat is not None:
        limit = (window_seconds(lat["window"]) + 1) * 1000
        p99 = lat.get("p99_ms")
        verdicts.append(
            f"bar p99 <= window + 1 s ({limit:,.0f} ms): "
            + (met(p99 <= limit) if p99 is not None else "NOT MEASURED")
        )
        p50 = lat.get("p50_ms")
        last += [f"bar_p50_ms={nan_if_none(p50)}", f"bar_p99_ms={nan_if_none(p99)}"]
    if runs["spark"]:
        last.append(f"ratio={ratio:.2f}")
    if lat is not None:
        last.append(f"window_s={window_seconds(lat['window']):g}")
    print("targets: " + "; ".join(verdicts), flush=True)
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)
    print(" ".join(last), flush=True)


def nan_if_none(value: Any) -> str:
    return "nan" if value is None else str(value)


def describe_bars(lat: dict[str, Any]) -> str:
    if lat["error"] is not None:
        return f"(2) bars, {lat['window']} window: NOT MEASURED, the query failed: {lat['error']}"
    return (
        f"(2) bars, {lat['window']} window: {lat['bars']} bars of {lat['symbols_with_bars']} "
        f"symbols ({lat['trades_per_s']} trades/s) in {lat['measure_s']} s after "
        f"{lat['startup_s']} s of warm-up | latency p50 {lat['p50_ms']} ms, p90 {lat['p90_ms']} "
        f"ms, p99 {lat['p99_ms']} ms (min {lat['min_ms']}, max {lat['max_ms']}) | "
        f"{lat['micro_batches']} micro-batches, each {lat['batch_p50_ms']} ms (median; max "
        f"{lat['batch_max_ms']}), {lat['batch_rows_p50']} trades in (median); of a micro-batch "
        "(medians): " + ", ".join(f"{k} {v} ms" for k, v in lat["batch_parts_ms"].items())
    )


if __name__ == "__main__":
    main()

"""Work queues through Redis: one node alone vs the same node with its queue kept in Redis.

Not a test. The end-to-end throughput run of bench/queues.py (its server, bench/_queues_server.py,
pinned to core 0; 4 Python consumers in this process on core 1, WebSocket, auto prefetch, CoDel
on both sides, ACKing each item at once; the server's producer keeps ``--backlog`` items
waiting), run in alternation without and with ``RUBRIS_REDIS_URL``: with it, every item goes
through Redis (enqueued, taken for the consumers' free prefetch and settled at its ACK, all
three in one script call per round trip; cluster/redis/queues/). ``redis-server`` (append-only
file, ``appendfsync no``: the queues refuse a Redis that would lose their items) runs on core 1
with the load, as in bench/scaleout.py.

Figures per configuration, medians of every window of every round: items ACKed per second, the
server's CPU per item (its process's CPU-seconds over the window / items), and for Redis its
CPU per item over the whole round (on-CPU time of redis-server / items ACKed). The rounds
alternate (alone, Redis, alone, Redis, ...), so that a machine whose speed drifts (other work on
its cores) weighs on both alike; each round's ratio is printed beside it.

Last line: ``local_items_per_s=X redis_items_per_s=Y server_cpu_per_item_ratio=R
redis_us_per_item=U queue_redis_vs_local=Q`` (R: the node's CPU per item with Redis / alone;
Q: Y / X, the medians of the two configurations' windows, target >= 0.8).

Another bench takes the same figures with ``await measure()`` (this bench's defaults, or its
parsed options), from a process that ``prepare_load`` pinned to the load's core as this one is.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import uvloop

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

from fanout import prepare_load  # noqa: E402
from queues import CONSUMERS, LOAD_CORE, run_throughput  # noqa: E402

from tests.rediskit import RedisServer  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
URL_ENV = "RUBRIS_REDIS_URL"
TARGET = 0.8
"""``queue_redis_vs_local`` aimed at."""


def proc_cpu(pid: int) -> float:
    """CPU-seconds of process ``pid`` so far (user + system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the two")
    ap.add_argument("--repeats", type=int, default=3, help="windows per round")
    ap.add_argument("--window", type=float, default=2.0, help="seconds a window")
    ap.add_argument("--warmup", type=float, default=1.5, help="seconds before the windows")
    ap.add_argument("--backlog", type=int, default=5000, help="items kept waiting")
    return ap


def throughput_args(args: argparse.Namespace) -> argparse.Namespace:
    """What bench/queues.py's end-to-end run reads, from this bench's options."""
    return argparse.Namespace(
        repeats=args.repeats,
        e2e_window=args.window,
        e2e_warmup=args.warmup,
        e2e_backlog=args.backlog,
        e2e_prefetch=None,  # the server's estimator
        quiet_wait=2.0,
        drain=10.0,
        rounds=args.rounds,
        profile=False,
        window=256,
    )


async def one(args: argparse.Namespace, pin: bool, redis: RedisServer | None) -> dict[str, Any]:
    """One round: a fresh server, its windows; with ``redis`` its queue kept there."""
    before = os.environ.get(URL_ENV)
    if redis is not None:
        os.environ[URL_ENV] = redis.url
        assert redis.pid is not None
        cpu0 = proc_cpu(redis.pid)
    else:
        os.environ.pop(URL_ENV, None)
    try:
        out = await run_throughput(args, pin, False)
    finally:
        if before is None:
            os.environ.pop(URL_ENV, None)
        else:
            os.environ[URL_ENV] = before
    if redis is not None:
        assert redis.pid is not None
        acked = max(int(out["queue"]["acked"]), 1)
        out["redis_us_per_item"] = (proc_cpu(redis.pid) - cpu0) / acked * 1e6
        redis.flush()
    return out


async def alternate(
    args: argparse.Namespace, pin: bool, quiet: bool = False
) -> dict[str, list[dict[str, Any]]]:
    """``args.rounds`` rounds of each configuration, alone first, in alternation."""
    runs: dict[str, list[dict[str, Any]]] = {"local": [], "redis": []}
    with RedisServer() as redis:
        assert redis.pid is not None
        if pin:
            os.sched_setaffinity(redis.pid, {LOAD_CORE})
        for r in range(args.rounds):
            for name in ("local", "redis"):
                if not quiet:
                    print(f"--- round {r + 1}/{args.rounds}: {name}", flush=True)
                runs[name].append(await one(args, pin, redis if name == "redis" else None))
            if not quiet:
                pair = (runs["redis"][-1]["items_per_s"], runs["local"][-1]["items_per_s"])
                print(f"    round {r + 1}: Redis / alone {pair[0] / max(pair[1], 1):.2f}")
    return runs


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    windows = [w for run in runs for w in run["windows"]]
    return {
        "items_per_s": statistics.median(w["items_per_s"] for w in windows),
        "server_us_per_item": statistics.median(
            w["server_cpu_pct"] / 100 / w["items_per_s"] * 1e6 for w in windows
        ),
        "lost": sum(run["lost"] for run in runs),
        "duplicates": sum(run["duplicates"] for run in runs),
        "redis_us_per_item": statistics.median(r.get("redis_us_per_item", 0.0) for r in runs),
    }


def figures(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The last line's figures, and each configuration's summary."""
    local, redis = summary(runs["local"]), summary(runs["redis"])
    return {
        "local": local,
        "redis": redis,
        "local_items_per_s": local["items_per_s"],
        "redis_items_per_s": redis["items_per_s"],
        "server_cpu_per_item_ratio": redis["server_us_per_item"] / local["server_us_per_item"],
        "redis_us_per_item": redis["redis_us_per_item"],
        "queue_redis_vs_local": redis["items_per_s"] / local["items_per_s"],
    }


async def measure(
    args: argparse.Namespace | None = None, pin: bool | None = None, quiet: bool = True
) -> dict[str, Any]:
    """This bench's figures (``figures``), for another bench to await: ``args`` are this
    bench's options (None: its defaults), ``pin`` whether the server goes to its own core
    (None: when this process runs on the load's core alone, as ``prepare_load`` leaves it)."""
    if args is None:
        args = parser().parse_args([])
    if pin is None:
        pin = hasattr(os, "sched_getaffinity") and os.sched_getaffinity(0) == {LOAD_CORE}
    return figures(await alternate(throughput_args(args), pin, quiet))


def main() -> None:
    args = parser().parse_args()
    pin = prepare_load(
        f"queues_redis: cores={os.cpu_count()} python={sys.version.split()[0]}, "
        f"{CONSUMERS} consumers, {args.rounds} rounds of local then Redis"
    )
    started = time.monotonic()
    out = uvloop.run(measure(args, pin, quiet=False))
    print()
    for name, s in (("alone", out["local"]), ("Redis", out["redis"])):
        print(
            f"{name:>6}: {s['items_per_s']:>8,.0f} items/s | node {s['server_us_per_item']:.1f} "
            f"µs CPU an item | Redis {s['redis_us_per_item']:.1f} µs an item | "
            f"lost {s['lost']} | duplicates {s['duplicates']}",
            flush=True,
        )
    ratio = out["queue_redis_vs_local"]
    met = "MET" if ratio >= TARGET else "NOT MET"
    print(f"Redis / alone: {ratio:.2f} (target >= {TARGET}: {met})")
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)
    print(
        f"local_items_per_s={out['local_items_per_s']:.0f} redis_items_per_s="
        f"{out['redis_items_per_s']:.0f} server_cpu_per_item_ratio="
        f"{out['server_cpu_per_item_ratio']:.2f} redis_us_per_item={out['redis_us_per_item']:.1f} "
        f"queue_redis_vs_local={ratio:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()

"""Work queues through Redis: one node alone vs the same node with its queue kept in Redis.

Not a test. The end-to-end throughput run of bench/queues.py (its server, bench/_queues_server.py,
pinned to core 0; 4 Python consumers in this process on core 1, WebSocket, auto prefetch, CoDel
on both sides, ACKing each item at once; the server's producer keeps ``--backlog`` items
waiting), run in alternation without and with ``RUBRIS_REDIS_URL``: with it, every item goes
through Redis (enqueued in batches by one script, taken for the consumers' free prefetch by
another, its ACK settled by a third; cluster/redis/queues.py). ``redis-server`` (no
persistence) runs on core 1 with the load, as in bench/scaleout.py.

Figures per configuration, medians of every window of every round: items ACKed per second, the
server's CPU per item (its process's CPU-seconds over the window / items), and for Redis its
CPU per item over the whole round (on-CPU time of redis-server / items ACKed).

Last line: ``local_items_per_s=X redis_items_per_s=Y server_cpu_per_item_ratio=R
redis_us_per_item=U`` (R: the node's CPU per item with Redis / alone).
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


def proc_cpu(pid: int) -> float:
    """CPU-seconds of process ``pid`` so far (user + system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def one(args: argparse.Namespace, pin: bool, redis: RedisServer | None) -> dict[str, Any]:
    if redis is not None:
        os.environ["RUBRIS_REDIS_URL"] = redis.url
        assert redis.pid is not None
        cpu0 = proc_cpu(redis.pid)
    try:
        out = await run_throughput(args, pin)
    finally:
        os.environ.pop("RUBRIS_REDIS_URL", None)
    if redis is not None:
        assert redis.pid is not None
        acked = max(int(out["queue"]["acked"]), 1)
        out["redis_us_per_item"] = (proc_cpu(redis.pid) - cpu0) / acked * 1e6
        redis.flush()
    return out


async def amain(args: argparse.Namespace, pin: bool) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {"local": [], "redis": []}
    with RedisServer() as redis:
        assert redis.pid is not None
        if pin:
            os.sched_setaffinity(redis.pid, {LOAD_CORE})
        for r in range(args.rounds):
            for name in ("local", "redis"):
                print(f"--- round {r + 1}/{args.rounds}: {name}", flush=True)
                runs[name].append(await one(args, pin, redis if name == "redis" else None))
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


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the two")
    ap.add_argument("--repeats", type=int, default=3, help="windows per round")
    ap.add_argument("--window", type=float, default=2.0, help="seconds a window")
    ap.add_argument("--warmup", type=float, default=1.5, help="seconds before the windows")
    ap.add_argument("--backlog", type=int, default=5000, help="items kept waiting")
    args = ap.parse_args()
    run_args = argparse.Namespace(
        repeats=args.repeats,
        e2e_window=args.window,
        e2e_warmup=args.warmup,
        e2e_backlog=args.backlog,
        quiet_wait=2.0,
        drain=10.0,
        rounds=args.rounds,
    )
    pin = prepare_load(
        f"queues_redis: cores={os.cpu_count()} python={sys.version.split()[0]}, "
        f"{CONSUMERS} consumers, {args.rounds} rounds of local then Redis"
    )
    started = time.monotonic()
    runs = uvloop.run(amain(run_args, pin))
    local, redis = summary(runs["local"]), summary(runs["redis"])
    print()
    for name, s in (("alone", local), ("Redis", redis)):
        print(
            f"{name:>6}: {s['items_per_s']:>8,.0f} items/s | node {s['server_us_per_item']:.1f} "
            f"µs CPU an item | Redis {s['redis_us_per_item']:.1f} µs an item | "
            f"lost {s['lost']} | duplicates {s['duplicates']}",
            flush=True,
        )
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)
    ratio = redis["server_us_per_item"] / local["server_us_per_item"]
    print(
        f"local_items_per_s={local['items_per_s']:.0f} redis_items_per_s="
        f"{redis['items_per_s']:.0f} server_cpu_per_item_ratio={ratio:.2f} "
        f"redis_us_per_item={redis['redis_us_per_item']:.1f}",
        flush=True,
    )


if __name__ == "__main__":
    main()

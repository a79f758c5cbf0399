"""Faults at scale: what each everyday fault costs two nodes on one Redis, with 1,000 sessions.

Not a test. tests/test_faults.py's scenarios (tests/faultkit.py: the machinery, the load and
what is counted) at a larger scale: a fresh ``redis-server`` (append-only file, DEBUG enabled)
and two uvicorn nodes of tests/fault_app.py per scenario, ``--clients`` (1,000) sessions of the
project's Python client in this process behind tests/lbkit.py's balancer, a steady load through
node B (one publish per ring topic, ``--sends`` ``send_to`` and ``--items`` work items every
``--tick`` s), the fault in the middle:

    reset          every connection to node A reset by RST at once; clients resume via B
    blackhole      every path to node A dead without a reset, noticed by the heartbeat (2-3 s)
    kill           node A killed (SIGKILL) with its sessions and the work items it held
    redis_restart  Redis stopped and started again (appendonly yes), 1 s away
    redis_stall    Redis answers nobody for node_timeout + 1.5 s (DEBUG SLEEP)
    burst          every session of node A resumed via B at once, then one send_to from B to
                   each of them at once
    redis_stall_12 Redis answers nobody for 12 s, past the nodes' 5 s socket timeout
    redis_stall_30 the same for 30 s
    restart_burst  Redis away 3 s, then every session of node A resumed via B at once, then
                   one send_to to each at once
    relay_stall    the TCP path between the nodes and Redis forwards nothing for 15 s, closing
                   nothing, then carries on
    node_pause     node A stopped (SIGSTOP) 15 s, past node_timeout, then continued
    redis_oom      maxmemory under noeviction: every write refused (OOM) for 4 s
    client_kill    Redis kills every connection of the nodes (CLIENT KILL), twice
    flood          four publishers flood node B's API for 8 s while Redis stands still 3 s
    failover       (tests/failoverkit.py) a master, two replicas and three Sentinels; one node
                   on the Sentinels' URL, items and publishes; the master killed (SIGKILL):
                   once with wait_replicas=1, once with the default 0

The clients are all on node A for the faults of a node or a path, half on each node for the
faults of Redis. Each scenario takes 10-70 s, all of them about 6 minutes on 2 cores (357 s
for the fourteen before the failover rows); after the faults that move every client of a node,
its sessions are carried through Redis one frame at a time (the "settle s" column).

    python3 bench/faults.py                       # every row, 1,000 sessions
    python3 bench/faults.py --clients 200 --only reset,kill,failover

Per scenario, a table row of the counts (ring seqs expected, received, GAPed, lost without a
GAP, doubled; accepted publishes never numbered; sends ok / refused / unknown, lost, doubled,
refused yet delivered; work items accepted, lost, run twice, redelivered without a higher
attempt, left in Redis; clients reconnected, resumed, given new sessions; seconds to reconnect).

Last line, over all scenarios: ``silent_ring_loss=0 private_lost=0 private_doubled=0
queue_lost=0 queue_doubled=N queue_unmarked=0 false_refusals=0 accepted_lost=0 resumed=N/N
stall_long_frozen=0 frozen=0 outbox_over_limit=0 own_refused=0 failover_lost=0 failover_s=S
failover_default_lost=N failover_default_s=S`` (queue_lost: accepted items never delivered or
left in Redis; queue_doubled: work items run twice for any reason, queue_unmarked those whose
second run did not say so by its attempt; accepted_lost: publishes the API accepted that Redis
never numbered; resumed: sessions resumed of those whose node lived on when their connection
was dropped; frozen: nodes that answered no request for 10 s; outbox_over_limit: nodes whose
outbox passed its bound; own_refused: the application's own publishes refused for the outbox
during the flood; failover_*: items lost and seconds until service was back, with
wait_replicas=1 and with the default). ``private_gone_with_node`` (messages not yet
acknowledged to the sessions of the killed node, which the docs name as lost and the client
learns of by a new session) is printed apart and not in ``private_lost``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from tests.failoverkit import Failover, measure  # noqa: E402
from tests.faultkit import SCENARIOS, Scale, Tally, raise_nofile, scenario  # noqa: E402

AFTER_S = {
    "blackhole": 7.0,
    "redis_stall": 7.0,
    "redis_stall_12": 16.0,
    "redis_stall_30": 34.0,
    "relay_stall": 19.0,
    "node_pause": 19.0,
    "redis_oom": 7.0,
    "client_kill": 5.0,
    "flood": 10.0,
}
"""Seconds of load after the fault strikes: past its own length, with a few more."""

COLUMNS: list[tuple[str, str]] = [
    ("ring_expected", "ring seqs"),
    ("ring_gapped", "gap"),
    ("silent_ring_loss", "ring lost"),
    ("ring_doubled", "ring x2"),
    ("ring_unnumbered", "pub lost"),
    ("private_ok", "send ok"),
    ("private_refused", "refused"),
    ("private_unknown", "unknown"),
    ("private_lost", "priv lost"),
    ("private_doubled", "priv x2"),
    ("false_refusals", "false ref"),
    ("queue_accepted", "items"),
    ("queue_lost", "item lost"),
    ("queue_doubled", "item x2"),
    ("queue_unmarked", "unmarked"),
    ("queue_left", "left"),
]


def table(tallies: list[Tally]) -> str:
    head = [
        "scenario",
        *(label for _, label in COLUMNS),
        "resumed",
        "reconn s",
        "settle s",
        "ring/s",
        "s",
    ]
    rows = [head]
    for t in tallies:
        resumed = f"{t.resumed}/{t.resumes_expected}" if t.resumes_expected else "-"
        if t.new_sessions and not t.resumes_expected:
            resumed = f"new {t.new_sessions}"
        rows.append(
            [
                t.name,
                *(f"{getattr(t, key):,}" for key, _ in COLUMNS),
                resumed,
                f"{t.reconnect_s:.1f}" if t.reconnect_s else "-",
                f"{t.ring_settle_s:.1f}" + ("" if t.ring_settled else "!"),
                f"{t.ring_rate:,.0f}",
                f"{t.seconds:.0f}",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for n, r in enumerate(rows):
        lines.append(
            " | ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def details(t: Tally) -> str:
    out = [
        f"{t.name}: {SCENARIOS[t.name].description}; {t.clients} clients",
        f"  publishes accepted {t.publishes_accepted} refused {t.publishes_refused} unknown "
        f"{t.publishes_unknown}; clients with silent ring loss {t.clients_with_silent_loss}",
        f"  send_to outcomes {t.refusals or {}} (unanswered {t.private_unanswered}, unknown "
        f"delivered {t.unknown_delivered}, gone with the killed node {t.private_gone_with_node})",
        f"  items refused {t.queue_refused} unknown {t.queue_unknown}, redelivered "
        f"{t.queue_redelivered}; reconnected {t.reconnected}, new sessions {t.new_sessions}; "
        f"node log lines {t.node_log_lines}",
        f"  phases {t.phases}",
        f"  rings settled {t.ring_settled} in {t.ring_settle_s:.1f} s after the end marker, "
        f"{t.ring_rate:,.0f} ring messages/s to the clients meanwhile",
    ]
    if t.burst_sends:
        out.append(f"  burst: {t.burst_sends} concurrent send_to, {t.burst_failed} not ok")
    out.extend("  " + line for note in t.notes for line in note.splitlines()[:6])
    return "\n".join(out)


async def failovers(args: argparse.Namespace) -> list[Failover]:
    """The failover rows (tests/failoverkit.py): wait_replicas=1, then the default 0."""
    if args.only and "failover" not in args.only.split(","):
        return []
    out = []
    for wait in (1, 0):
        print(f"--- failover: master killed, Sentinels promote a replica (wait_replicas={wait})")
        f = await measure(wait, items=args.failover_items)
        print("  " + "\n  ".join(f.notes), flush=True)
        out.append(f)
    return out


async def amain(args: argparse.Namespace) -> list[Tally]:
    names = [n for n in SCENARIOS if not args.only or n in args.only.split(",")]
    tallies = []
    for name in names:
        scale = Scale(
            clients=args.clients,
            topics=args.topics,
            tick=args.tick,
            sends_per_tick=args.sends,
            items_per_tick=args.items,
            work_s=0.2,
            before_s=2.0,
            after_s=AFTER_S.get(name, 4.0),
            inflight_s=15.0,
        )
        print(f"--- {name}: {SCENARIOS[name].description} ({args.clients} sessions)", flush=True)
        t = await scenario(name, scale)
        print(details(t), flush=True)
        tallies.append(t)
    return tallies


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--clients", type=int, default=1000, help="sessions over the two nodes")
    ap.add_argument("--topics", type=int, default=1, help="ring topics every client follows")
    ap.add_argument("--tick", type=float, default=0.1, help="seconds between load rounds")
    ap.add_argument("--sends", type=int, default=20, help="send_to each round")
    ap.add_argument("--items", type=int, default=4, help="work items each round")
    ap.add_argument("--only", default="", help="comma-separated scenarios ('failover' too)")
    ap.add_argument("--failover-items", type=int, default=2000, help="work items a failover row")
    args = ap.parse_args()
    raise_nofile()
    started = time.monotonic()
    tallies = asyncio.run(amain(args))
    fails = asyncio.run(failovers(args))
    print()
    print(table(tallies))
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)
    resumed = sum(t.resumed for t in tallies)
    expected = sum(t.resumes_expected for t in tallies)
    long_stalls = [t for t in tallies if t.name in ("redis_stall_12", "redis_stall_30")]
    print(
        f"silent_ring_loss={sum(t.silent_ring_loss for t in tallies)} "
        f"private_lost={sum(t.private_lost for t in tallies)} "
        f"private_doubled={sum(t.private_doubled for t in tallies)} "
        f"queue_lost={sum(t.queue_lost + t.queue_left for t in tallies)} "
        f"queue_doubled={sum(t.queue_doubled for t in tallies)} "
        f"queue_unmarked={sum(t.queue_unmarked for t in tallies)} "
        f"false_refusals={sum(t.false_refusals for t in tallies)} "
        f"accepted_lost={sum(t.ring_unnumbered + t.flood_unnumbered for t in tallies)} "
        f"resumed={resumed}/{expected} "
        f"stall_long_frozen={sum(t.frozen for t in long_stalls)} "
        f"frozen={sum(t.frozen for t in tallies)} "
        f"outbox_over_limit={sum(t.outbox_over_limit for t in tallies)} "
        f"own_refused={sum(t.own_refused for t in tallies)}"
        + "".join(
            f" failover{'' if f.wait_replicas else '_default'}_lost={f.lost}"
            f" failover{'' if f.wait_replicas else '_default'}_s={f.seconds:.1f}"
            for f in fails
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()

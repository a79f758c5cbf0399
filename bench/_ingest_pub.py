"""The publishing half of bench/ingest.py (b): publishers in a process of their own.

Started by bench/ingest.py on the load core (it inherits the affinity), one process per phase,
so that the publishers share the core with the subscribers the way separate programs do (the
kernel's scheduler, not one event loop, divides the core). Not meant to be run by hand.

Modes:

    paced / unpaced  ``--publishers`` ``Publisher`` tasks (default ``RateLimiter``, or one
                     whose floor is its initial rate, so NAKs change nothing), each fed by an
                     open-loop generator offering ``--rate / --publishers`` messages/s
    blast            ``--publishers`` raw posters (bench/_ingest_load.py) that keep the intake
                     nearly full: 200-message requests, a 50 ms pause after a 429 and a 20 ms
                     pause after an answer whose fill is >= 80 %

It prints ``READY``, starts when it reads a line on stdin, and at the end prints one JSON
object: the start (CLOCK_MONOTONIC ns), its CPU seconds over the phase, and per publisher every
answer as [ns, status, fill, messages], what its generator scheduled and handed over, the
publisher's stats, its limiter's stats and how long the final flush took.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from typing import Any

import httpx
import orjson
import uvloop

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _ingest_load import Poster, PostStats, ndjson_request  # noqa: E402

from rubris_asgi.client.publisher import Publisher  # noqa: E402
from rubris_asgi.control.ratelimit import RateLimiter  # noqa: E402

PAD = "x" * 40


def cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class Run:
    """One publisher and what its generator and answers saw."""

    def __init__(self, k: int, url: str, token: str, paced: bool, batch: int) -> None:
        self.k = k
        self.answers: list[tuple[int, int, int, int]] = []
        self.scheduled = 0
        self.handed = 0
        self.errors = 0
        self.flush_s = 0.0
        answers = self.answers

        async def on_response(response: httpx.Response) -> None:
            fill = response.headers.get("rubris-fill", "")
            n = response.request.content.count(b"\n")
            answers.append(
                (time.monotonic_ns(), response.status_code, int(fill) if fill.isdigit() else -1, n)
            )

        client = httpx.AsyncClient(timeout=30.0, event_hooks={"response": [on_response]})
        limiter = None if paced else RateLimiter(initial=1e9, floor=1e9)
        self.pub = Publisher(url, token=token, batch=batch, limiter=limiter, client=client)

    async def generate(self, rate: float, start_ns: int, seconds: float, names: list[str]) -> None:
        """Open loop: message j is due at start + j / rate and is handed over as soon as the
        publisher takes it (``publish`` waits while a full batch cannot go), stamped then."""
        interval = 1e9 / rate
        end = start_ns + int(seconds * 1e9)
        total = int(rate * seconds)
        self.scheduled = total
        pub = self.pub
        n = len(names)
        offset = self.k * 7919
        j = 0
        try:
            while True:
                now = time.monotonic_ns()
                if now >= end:
                    break
                due = min(total, int((now - start_ns) / interval) + 1)
                while j < due:
                    data = {"t": time.monotonic_ns(), "k": self.k, "j": j, "pad": PAD}
                    await pub.publish(names[(j + offset) % n], data)
                    j += 1
                    if time.monotonic_ns() >= end:
                        break
                self.handed = j
                wait = (start_ns + j * interval - time.monotonic_ns()) / 1e9
                await asyncio.sleep(max(wait, 0.0005))
        except Exception:
            self.errors += 1
        self.handed = j

    async def close(self, limit: float) -> None:
        started = time.monotonic()
        try:
            await asyncio.wait_for(self.pub.aclose(), limit)
        except Exception:
            self.errors += 1
        self.flush_s = time.monotonic() - started

    def report(self) -> dict[str, Any]:
        st = self.pub.stats
        lim = self.pub.limiter.stats
        return {
            "answers": self.answers,
            "scheduled": self.scheduled,
            "handed": self.handed,
            "accepted": st.accepted,
            "requests": st.requests,
            "retries": st.retries,
            "refusals": st.refusals,
            "errors": self.errors,
            "flush_s": self.flush_s,
            "limiter": {
                "rate": lim.rate,
                "naks": lim.naks,
                "cuts": lim.cuts,
                "ignored": lim.naks_ignored,
            },
        }


async def go() -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print("READY", flush=True)
    await reader.readline()
    return time.monotonic_ns()


async def publish(args: argparse.Namespace) -> dict[str, Any]:
    names = [f"bench.{i}" for i in range(args.topics)]
    url = f"http://127.0.0.1:{args.port}/rubris"
    paced = args.mode == "paced"
    runs = [Run(k, url, args.token, paced, args.batch) for k in range(args.publishers)]
    start = await go()
    c0 = cpu()
    gens = [
        asyncio.create_task(r.generate(args.rate / args.publishers, start, args.seconds, names))
        for r in runs
    ]
    await asyncio.gather(*gens)
    c1 = cpu()
    await asyncio.gather(*(r.close(args.flush_limit) for r in runs))
    return {"start_ns": start, "cpu_s": c1 - c0, "runs": [r.report() for r in runs]}


async def blast(args: argparse.Namespace) -> dict[str, Any]:
    names = [f"bench.{i}" for i in range(args.topics)]
    per = 200
    reqs = []
    for b in range(16):
        lines = [
            orjson.dumps(
                {
                    "topic": names[(b * per + j) % len(names)],
                    "data": {"t": time.monotonic_ns(), "c": b * per + j, "pad": PAD},
                }
            )
            for j in range(per)
        ]
        body = b"\n".join(lines) + b"\n"
        reqs.append((ndjson_request("/rubris/api/publish", args.token, body), per))
    stats = PostStats()
    stats.recording = True
    posters = [Poster(args.port, reqs, stats, offset=i * 5) for i in range(args.publishers)]
    start = await go()
    c0 = cpu()
    tasks = [asyncio.create_task(p.run(retry_after=0.05, hold_above=80)) for p in posters]
    await asyncio.sleep(args.seconds)
    for p in posters:
        p.stop = True
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "start_ns": start,
        "cpu_s": cpu() - c0,
        "ok": stats.ok,
        "refused": stats.refused,
        "accepted": stats.ok_msgs,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["paced", "unpaced", "blast"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--rate", type=float, default=1000.0, help="messages/s, all together")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--flush-limit", type=float, default=30.0)
    ap.add_argument("--batch", type=int, default=1000, help="Publisher(batch=...)")
    args = ap.parse_args()
    run = blast if args.mode == "blast" else publish
    result = uvloop.run(run(args))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

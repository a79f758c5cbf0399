"""A reprice worker: ``python3 -m example_app.worker --url http://127.0.0.1:8000/rubris``.

It competes with the demo page's tabs (and any other workers) for the "reprice" jobs: each job
goes to one of them. It computes a "fair value" (a random walk stands in for real work that
takes ``--work`` seconds), publishes the result on "reprice.results", where the page shows who
did what, and returns, which ACKs the job. Kill it mid-job: the server gives its jobs to the
others at once, with attempt 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
import time

from rubris_asgi.client import Client, ConnectionLost, QueueItem


async def work(url: str, name: str, seconds: float, transport: str) -> None:
    rng = random.Random()
    async with Client(url, transport=transport) as client:  # type: ignore[arg-type]

        async def reprice(item: QueueItem) -> None:
            job = item.value
            started = time.monotonic()
            await asyncio.sleep(seconds * rng.uniform(0.5, 1.5))  # the "work"
            fair = round(job["last"] * rng.uniform(0.98, 1.02), 2)
            await client.publish(
                "reprice.results",
                {
                    "job": job["job"],
                    "symbol": job["symbol"],
                    "fair": fair,
                    "worker": name,
                    "attempt": item.attempt,
                    "ms": round((time.monotonic() - started) * 1000),
                },
            )  # returning ACKs the job; raising would give it back

        await client.consume("reprice", reprice)
        print(f"{name}: working reprice jobs from {url} (Ctrl-C to stop)", flush=True)
        # through server restarts the client reconnects by itself (one log line each time);
        # this returns only when it gives up, raising why
        await client.wait_closed()


def main() -> None:
    ap = argparse.ArgumentParser(description="work the demo's reprice jobs")
    ap.add_argument("--url", default="http://127.0.0.1:8000/rubris")
    ap.add_argument("--name", default=f"python-{os.getpid()}")
    ap.add_argument("--work", type=float, default=0.3, help="seconds a job takes, on average")
    ap.add_argument("--transport", choices=("websocket", "longpoll"), default="websocket")
    args = ap.parse_args()
    # the client's one line per lost connection, with the time it was lost
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    try:
        asyncio.run(work(args.url, args.name, args.work, args.transport))
    except KeyboardInterrupt:
        pass
    except ConnectionLost as exc:
        # a worker that cannot work says why and fails, so that a supervisor (systemd, k8s)
        # restarts it and an operator sees it, rather than a process that holds nothing
        print(f"{args.name}: stopped: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()

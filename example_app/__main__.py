"""``python3 -m example_app --port 8000``: serve the demo on 127.0.0.1.

``--workers N``: N processes sharing the port, the topics and one market through the Redis of
``RUBRIS_REDIS_URL`` (example_app/cluster.py).
"""

from __future__ import annotations

import argparse
import shutil

from rubris_asgi import serve


def main() -> None:
    ap = argparse.ArgumentParser(description="rubris_asgi demo: a live simulated market")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--log-level", default="info")
    ap.add_argument(
        "--workers", type=int, default=1, help="processes; more than one needs RUBRIS_REDIS_URL"
    )
    args = ap.parse_args()
    from .cluster import prepare_workers

    made_dir = prepare_workers(args.workers)  # the workers' shared token and stats directory
    print(f"rubris_asgi demo on http://{args.host}:{args.port}/")
    from .app import API_TOKEN, BATCH_FILE, REDIS_URL, app, rubris
    from .pipeline import command

    print(
        "print a trade on the tape from another program:\n"
        f"  curl -s http://{args.host}:{args.port}/rubris/api/publish"
        f" -H 'Authorization: Bearer {API_TOKEN}' -H 'Content-Type: application/json'"
        """ -d '{"topic": "trades", "data": {"id": 0, "symbol": "AAPL", "price": 1.0,"""
        """ "qty": 1, "side": "buy", "ts": 0}}'"""
    )
    print(
        f"operations page: http://{args.host}:{args.port}/rubris/ops"
        f" (any user name, password {API_TOKEN}); Prometheus metrics:"
        f" http://{args.host}:{args.port}/metrics"
    )
    # the token is this run's (random unless RUBRIS_API_TOKEN set it): the page cannot show it
    pipeline = command(API_TOKEN, f"http://{args.host}:{args.port}/rubris")
    print(f"run the Spark pipeline (the spark extra, Java 17+) against this demo:\n  {pipeline}")
    where = f"the SQLite file {BATCH_FILE}" if BATCH_FILE else "memory (RUBRIS_BATCHES: a file)"
    if REDIS_URL:
        where = f"Redis ({REDIS_URL}), with the queue's jobs"
    print(f"batches (the page's 'Reprice all' button) are kept in {where}")

    # drains rubris (GOODBYE 9 to every client) before uvicorn closes the sockets; per-message
    # deflate at the WebSocket layer stays off, rubris deflates each message itself
    if args.workers > 1:
        print(
            f"{args.workers} workers, one market (the ops page lists each worker);"
            f" topics, queues and batches shared through Redis ({REDIS_URL})"
        )
        try:  # each worker imports the app, builds its own Rubris and drains it
            serve(
                "example_app.app:app",
                host=args.host,
                port=args.port,
                workers=args.workers,
                log_level=args.log_level,
            )
        finally:
            if made_dir is not None:
                shutil.rmtree(made_dir, ignore_errors=True)
        return
    serve(app, rubris, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()

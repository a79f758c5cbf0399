"""``python -m example_app --port 8000``: serve the demo on 127.0.0.1."""

from __future__ import annotations

import argparse

from rubris_asgi import serve


def main() -> None:
    ap = argparse.ArgumentParser(description="rubris_asgi demo: a live simulated market")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args()
    print(f"rubris_asgi demo on http://{args.host}:{args.port}/")
    from .app import API_TOKEN, BATCH_FILE, app, rubris

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
    where = f"the SQLite file {BATCH_FILE}" if BATCH_FILE else "memory (RUBRIS_BATCHES: a file)"
    print(f"batches (the page's 'Reprice all' button) are kept in {where}")

    # drains rubris (GOODBYE 9 to every client) before uvicorn closes the sockets; per-message
    # deflate at the WebSocket layer stays off, rubris deflates each message itself
    serve(app, rubris, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()

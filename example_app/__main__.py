"""``python -m example_app --port 8000``: serve the demo on 127.0.0.1."""

from __future__ import annotations

import argparse

import uvicorn


def main() -> None:
    ap = argparse.ArgumentParser(description="rubris_asgi demo: a live simulated market")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args()
    print(f"rubris_asgi demo on http://{args.host}:{args.port}/")
    uvicorn.run(
        "example_app.app:app",
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        # rubris deflates each message itself; transport-level deflate would do it twice
        ws_per_message_deflate=False,
    )


if __name__ == "__main__":
    main()

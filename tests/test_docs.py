"""The docs' runnable example runs and says what the guide says it does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for transport in ("websocket", "longpoll"):
        assert f"[{transport}] refused: code 10, unknown symbol 'NOPE'" in out
        assert f"[{transport}] order: {{'status': 'accepted'}}" in out
        assert f"[{transport}] fill: {{'symbol': 'AAPL', 'qty': 5}}" in out
        assert f"[{transport}] stream: [3, 2, 1]" in out

"""The demo's late joiners (issue 25): a tab opened after the pipeline's catalog batch was
announced shows it, and a symbol selected after its bars were written draws them at once.

The demo runs as a subprocess (tests/test_browser.py's DemoServer); bars and announcements are
published through its HTTP API as the pipeline publishes them, so no Spark is needed. The page
subscribes to both rings with ``last`` (example_app/static/app.js).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser

from .test_browser import API_TOKEN, Demo, DemoServer, free_port

pytestmark = pytest.mark.browser

WAIT_MS = 10_000


def api(server: DemoServer, method: str, path: str, body: Any = None) -> Any:
    req = urllib.request.Request(
        f"{server.url}/rubris/api{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {API_TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5) as res:
        return json.loads(res.read() or b"null")


def bar(symbol: str, start: int, o: float, h: float, lo: float, c: float) -> dict[str, Any]:
    data = {"symbol": symbol, "start": start, "end": start + 5000, "open": o, "high": h}
    data |= {"low": lo, "close": c, "vwap": round((h + lo + c) / 3, 4), "volume": 100}
    return {"topic": f"bars.{symbol}", "data": data | {"trades": 1, "last_ts": start + 1000}}


def open_tab(chromium: Browser, server: DemoServer) -> tuple[Any, Demo]:
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(WAIT_MS)
    demo = Demo(context.new_page(), server)
    demo.open("/")
    demo.wait_open("websocket")
    return context, demo


@pytest.mark.timeout(120)
def test_a_late_tab_shows_the_announced_batch_and_held_bars(
    chromium: Browser, tmp_path: Path
) -> None:
    server = DemoServer(free_port(), tmp_path)
    server.start()
    try:
        # before any tab: a batch announced (open, then sealed with no items: complete) and
        # three bars of a symbol written
        batch = api(server, "POST", "/batches")["batch"]
        api(
            server,
            "POST",
            "/publish",
            {"topic": "pipeline.batches", "data": {"batch": batch, "state": "open"}},
        )
        sealed = api(server, "POST", f"/batches/{batch}/seal")
        api(
            server,
            "POST",
            "/publish",
            {"topic": "pipeline.batches", "data": {"batch": batch, **sealed}},
        )
        t0 = (int(time.time() * 1000) // 5000 - 3) * 5000
        context, demo = open_tab(chromium, server)
        try:
            symbol = demo.wait(
                "() => document.getElementById('pipeline').dataset.symbol || false",
                what="#pipeline to follow the selected symbol",
            )
            other = "MSFT" if symbol != "MSFT" else "AAPL"
            bars = [
                bar(other, t0, 100.0, 101.0, 99.5, 100.5),
                bar(other, t0 + 5000, 100.5, 100.8, 99.8, 100.0),
                bar(other, t0 + 10000, 100.0, 100.2, 99.9, 100.1),
            ]
            api(server, "POST", "/publish", bars)
            # the batch announced before the tab opened is shown, followed to its state
            demo.wait(
                "(id) => document.querySelector(`#pl-batches li[data-batch='${id}']`)"
                "?.dataset.state === 'complete'",
                batch,
                what="the batch announced before the tab opened",
            )
            assert demo.page.locator("#pl-batches-empty").is_hidden()
            # a symbol selected after its bars were written draws them at once
            demo.page.locator(f'#grid tr[data-symbol="{other}"]').click()
            demo.wait(
                "() => document.getElementById('pipeline').dataset.bars === '3'",
                what=f"the three bars {other}'s ring holds",
            )
            starts = demo.page.evaluate(
                "() => [...document.querySelectorAll('#candles g.candle')]"
                ".map((g) => Number(g.dataset.start))"
            )
            assert starts == [t0, t0 + 5000, t0 + 10000]
            demo.assert_clean()
        finally:
            context.close()
    finally:
        server.stop()

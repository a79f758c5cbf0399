"""The demo page's "Reprice all N symbols as one batch" in headless Chromium.

The example app runs in the test's own event loop (tests/server.py), so the test can ask its
``rubris.batches`` what the page shows; Chromium is launched as tests/test_browser.py launches
it. The page's own consumer works one job at a time for 150-450 ms, so a Python worker
(``example_app.worker``, in this loop too) that takes 10 ms a job does most of the work: the
batch is done in seconds, not the half minute one tab would take behind the simulator's backlog.

The app keeps its batches in memory (unless ``RUBRIS_BATCHES`` names a SQLite file); the test
runs in ``tmp_path`` all the same, so that nothing it does can leave a file in the repository.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from playwright.async_api import Browser, ConsoleMessage, Page

from rubris_asgi.batches import MemoryBatchStore

from .server import run_server
from .test_browser import ROOT, VIEWPORT, WAIT_MS

DONE_MS = 15_000  # bound of a batch's completion once someone works the queue
COMPLETE = re.compile(r"^50 / 50 done, complete in \d+\.\d s$")

# The batch row of the work-queue panel, as the page shows it.
BATCH = """() => {
    const box = document.getElementById('rq-batch');
    const button = document.getElementById('rq-batch-start');
    return {
        ...box.dataset,
        text: document.getElementById('rq-batch-text').textContent,
        hint: !document.getElementById('rq-batch-hint').hidden,
        button: button.textContent, enabled: !button.disabled,
        bar: document.getElementById('rq-batch-done').style.width,
    };
}"""


@pytest.fixture
def demo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[ModuleType]:
    """example_app.app, imported with the working directory in tmp_path."""
    monkeypatch.chdir(tmp_path)
    from example_app import app

    if not os.environ.get("RUBRIS_BATCHES"):
        assert isinstance(app.batch_store, MemoryBatchStore)
    yield app
    for where in (ROOT, tmp_path):  # rubris's default store was not used
        assert not list(where.glob("rubris-batches.sqlite3*")), where


@contextlib.asynccontextmanager
async def open_page(browser: Browser, url: str) -> AsyncIterator[tuple[Page, list[str]]]:
    """The demo page, with the console errors and page errors it records."""
    context = await browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(WAIT_MS)
    errors: list[str] = []

    def console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            errors.append(f"console: {msg.text}")

    try:
        page = await context.new_page()
        page.on("console", console)
        page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
        await page.goto(url + "/", wait_until="load")
        yield page, errors
    finally:
        await context.close()


@contextlib.asynccontextmanager
async def worker(url: str, name: str) -> AsyncIterator[None]:
    """``python3 -m example_app.worker --work 0.01`` in this event loop."""
    from example_app.worker import work

    task = asyncio.create_task(work(f"{url}/rubris", name, 0.01, "websocket"))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def wait(page: Page, expression: str, what: str, timeout: float = WAIT_MS) -> Any:
    try:
        handle = await page.wait_for_function(expression, timeout=timeout)
    except Exception as exc:
        raise AssertionError(
            f"timed out waiting for {what}; the batch row: {await page.evaluate(BATCH)}"
        ) from exc
    return await handle.json_value()


@pytest.mark.browser
async def test_reprice_all_as_one_batch(demo: ModuleType, browser: Browser) -> None:
    began = time.monotonic()
    rubris = demo.rubris
    async with run_server(demo.app) as url, open_page(browser, url) as (page, errors):
        await wait(
            page,
            "() => document.getElementById('reprice').dataset.state === 'working'"
            " && !document.getElementById('rq-batch-start').disabled",
            "the tab's consumer and the batch button",
        )
        row = await page.evaluate(BATCH)
        assert row["button"] == "Reprice all 50 symbols as one batch", row
        assert (row["state"], row["hint"]) == ("idle", False), row

        # Nobody works the queue: the batch waits, and the panel says why.
        await page.locator("#rq-work").uncheck()
        await wait(
            page,
            "() => document.getElementById('rq-consumers').dataset.value === '0'",
            "the queue's stats to count no consumer",
        )
        await page.locator("#rq-batch-start").click()
        await wait(
            page,
            "() => document.getElementById('rq-batch').dataset.state === 'running'"
            " && !document.getElementById('rq-batch-hint').hidden",
            "the running batch and the hint that nobody works the queue",
        )
        row = await page.evaluate(BATCH)
        assert row["state"] == "running" and not row["enabled"], row
        assert row["text"].startswith("0 / 50 done"), row
        assert (await rubris.batches.status(row["batch"])).to_json() == {
            "state": "sealed",
            "total": 50,
            "done": 0,
            "failed": 0,
            "completed": False,
        }
        # one running batch a session: the server refuses a second one
        refused = await page.evaluate(
            "() => window.rubris.call('reprice_all').then(() => null, (err) => err.message)"
        )
        assert refused and "still running" in refused, refused

        # The toggle on again and a fast Python worker: the batch completes.
        async with worker(url, "py-fast"):
            await page.locator("#rq-work").check()
            await wait(
                page,
                "() => document.getElementById('rq-batch').dataset.state === 'complete'",
                "the first batch to complete",
                timeout=DONE_MS,
            )
            first = await page.evaluate(BATCH)
            assert COMPLETE.match(first["text"]), first
            assert (first["done"], first["failed"], first["bar"]) == ("50", "0", "100%"), first
            assert (first["hint"], first["enabled"]) == (False, True), first

            # With the toggle on from the start: clicked, worked, complete.
            started = time.monotonic()
            await page.locator("#rq-batch-start").click()
            await wait(
                page,
                "() => { const box = document.getElementById('rq-batch');"
                f" return box.dataset.batch !== '{first['batch']}'"
                " && box.dataset.state === 'complete'; }",
                "the second batch to complete",
                timeout=DONE_MS,
            )
            took = time.monotonic() - started
        second = await page.evaluate(BATCH)
        assert COMPLETE.match(second["text"]), second
        assert (second["done"], second["failed"], second["hint"]) == ("50", "0", False), second
        assert 0 < int(second["ms"]) < took * 1000 + 500, (second, took)
        for batch in (first["batch"], second["batch"]):
            status = await rubris.batches.status(batch)
            assert (status.state.value, status.done, status.total) == ("complete", 50, 50)
        assert not errors, errors
    assert time.monotonic() - began < 30


def test_rubris_batches_names_a_sqlite_file(tmp_path: Path) -> None:
    """RUBRIS_BATCHES=path: the app keeps its batches in that SQLite file."""
    path = tmp_path / "demo-batches.sqlite3"
    code = (
        "from example_app.app import BATCH_FILE, batch_store; "
        "print(type(batch_store).__name__, batch_store.path == BATCH_FILE)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "RUBRIS_BATCHES": str(path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.split() == ["SQLiteBatchStore", "True"]
    assert not path.exists()  # made when the first batch opens

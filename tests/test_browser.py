"""The demo page in a real browser: headless Chromium driven by Playwright (sync API).

The demo app runs as a subprocess (``python3 -m example_app --port P``), so that the restart test
restarts a real process on the same port. Each test gets its own server and browser context; the
browser is shared by the module. Every wait is on a condition in the page, bounded by a timeout.

Console errors and uncaught page errors fail a test, except the connection errors that a
deliberate server restart (or blocking WebSockets) is expected to cause.

``RUBRIS_UPDATE_DOCS_SCREENSHOT=1`` also writes docs/images/demo.png (the docs' screenshot);
test-output/demo.png is written on every run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Page,
    Playwright,
    ViewportSize,
    sync_playwright,
)
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from .browserkit import CHROMIUM, CHROMIUM_ARGS, MISSING_CHROMIUM
from .netkit import free_port

ROOT = Path(__file__).resolve().parent.parent
VIEWPORT: ViewportSize = {"width": 1440, "height": 900}
WAIT_MS = 10_000  # default bound of one wait in the page
RECOVER_MS = 20_000  # bound of the reconnect after a server restart (backoff caps at 5 s)
SERVER_START_S = 20.0
PRICE = re.compile(r"^\d{1,3}(,\d{3})*\.\d{2}$")  # how the page formats a price: 1,234.56

# What a browser logs while the server is gone (or WebSockets are blocked): refused WebSocket
# handshakes and fetches, responses cut short by a kill, the 5xx of a server shutting down.
# Allowed only in the windows a test opens with Demo.allow_connection_errors.
CONNECTION_NOISE = re.compile(
    r"WebSocket connection to .* failed"
    r"|net::ERR_CONNECTION_(REFUSED|RESET|CLOSED)"
    # a request on a keep-alive socket of the killed process (seen once in CI, long-poll kill)
    r"|net::ERR_SOCKET_NOT_CONNECTED"
    r"|net::ERR_(EMPTY_RESPONSE|CONTENT_LENGTH_MISMATCH|INCOMPLETE_CHUNKED_ENCODING)"
    r"|Failed to load resource: the server responded with a status of 5\d\d"
    # a long-poll of the old session, answered by the new server
    r"|Failed to load resource: the server responded with a status of 404 .*/rubris/lp/"
)


# Makes the page's WebSockets fail while window.__wsBlocked is set (they go to a closed port),
# and keeps every socket in window.__sockets so a test can cut one.
WS_SWITCH = """(deadPort) => {
    const Real = window.WebSocket;
    window.__wsBlocked = false;
    window.__sockets = [];
    window.WebSocket = class extends Real {
        constructor(url, protocols) {
            const u = new URL(url);
            if (window.__wsBlocked) u.port = String(deadPort);
            super(u.href, protocols);
            window.__sockets.push(this);
        }
    };
}"""


# ---- the demo server ------------------------------------------------------------------------


API_TOKEN = "browser-test-token"


class DemoServer:
    """``python3 -m example_app`` on a fixed port; its output goes to a log file."""

    def __init__(self, port: int, log_dir: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_dir / f"server-{port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        assert self.proc is None, "already running"
        self.starts += 1
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "RUBRIS_API_TOKEN": API_TOKEN}
        with self.log_path.open("ab") as log:
            log.write(f"---- start #{self.starts} ----\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "example_app", "--port", str(self.port)],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + SERVER_START_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                self.proc = None
                raise AssertionError(f"the demo server exited at start-up:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/", timeout=2) as res:
                    if res.status == 200:
                        return
            except OSError as exc:
                last = exc
            time.sleep(0.05)
        raise AssertionError(
            f"the demo server did not answer GET / within {SERVER_START_S} s ({last}):\n"
            f"{self.log_tail()}"
        )

    def kill(self) -> None:
        """SIGKILL: the process dies without closing a thing, as in a crash."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def stop(self) -> None:
        """SIGTERM (uvicorn's graceful shutdown), then SIGKILL if it takes too long."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])


# ---- the page -------------------------------------------------------------------------------


@dataclass
class Demo:
    """A page of the demo with its console and page errors recorded."""

    page: Page
    server: DemoServer
    errors: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    allowed: list[tuple[int, int]] = field(default_factory=list)  # error index windows

    def __post_init__(self) -> None:
        self.page.on("console", self._on_console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))

    def _on_console(self, msg: ConsoleMessage) -> None:
        loc = msg.location
        where = f" ({loc.get('url', '')}:{loc.get('lineNumber', '')})" if loc else ""
        line = f"{msg.type}: {msg.text}{where}"
        self.console.append(line)
        if msg.type == "error":
            self.errors.append(line)

    def open(self, path: str = "/") -> None:
        self.page.goto(self.server.url + path, wait_until="load")
        self.wait("window.rubris !== undefined", what="the page to create window.rubris")
        # Every state change from now on, with the session it ended in.
        self.page.evaluate(
            """() => {
                window.__states = [];
                window.rubris.on('state', (e) => window.__states.push(
                    {...e, session: window.rubris.sessionId}));
            }"""
        )

    def states(self) -> list[dict[str, Any]]:
        return list(self.page.evaluate("() => window.__states"))

    def wait(self, expression: str, arg: Any = None, *, what: str, timeout: float = WAIT_MS) -> Any:
        """Wait until `expression` (a JS expression or function of `arg`) is truthy."""
        try:
            handle = self.page.wait_for_function(expression, arg=arg, timeout=timeout)
            return handle.json_value()
        except PlaywrightTimeoutError:
            raise AssertionError(
                f"timed out after {timeout / 1000:g} s waiting for {what}\n"
                f"page status: {self.status()}\n"
                f"console (last 15):\n  " + "\n  ".join(self.console[-15:]) + "\n"
                f"server log:\n{self.server.log_tail(15)}"
            ) from None

    def status(self) -> dict[str, Any]:
        try:
            return dict(
                self.page.evaluate(
                    """() => ({
                        transport: document.getElementById('status-transport').textContent,
                        state: document.getElementById('status-state').textContent,
                        resumed: document.getElementById('status-resumed').textContent,
                        notice: document.getElementById('status-notice').textContent,
                        client: window.rubris && {
                            state: window.rubris.state, transport: window.rubris.transport,
                            session: window.rubris.sessionId, stats: window.rubris.stats,
                        },
                    })"""
                )
            )
        except PlaywrightError as exc:
            return {"unavailable": str(exc)}

    def text(self, selector: str) -> str:
        return self.page.locator(selector).inner_text().strip()

    def stats(self) -> dict[str, Any]:
        return dict(self.page.evaluate("() => window.rubris.stats"))

    # ---- connection --------------------------------------------------------------------------

    def wait_open(self, transport: str, timeout: float = WAIT_MS) -> None:
        """The status bar says `transport`, open (painted from the client's state events)."""
        self.wait(
            """(t) => document.getElementById('status-state').textContent === 'open'
                   && document.getElementById('status-transport').textContent === t""",
            transport,
            what=f"#status-state 'open' over {transport}",
            timeout=timeout,
        )

    # ---- watchlist, tape ---------------------------------------------------------------------

    def last_prices(self) -> dict[str, str]:
        return dict(
            self.page.evaluate(
                """() => Object.fromEntries([...document.querySelectorAll('#grid tr[data-symbol]')]
                    .map((tr) => [tr.dataset.symbol, tr.querySelector('.last').textContent]))"""
            )
        )

    def wait_prices(self) -> dict[str, str]:
        """Wait for the watchlist to be built and priced; returns symbol → last."""
        self.wait(
            """() => {
                const cells = [...document.querySelectorAll('#grid tr[data-symbol] .last')];
                return cells.length > 0 && cells.every((td) => td.textContent !== '—');
            }""",
            what="every #grid .last cell to show a price",
        )
        prices = self.last_prices()
        bad = {s: p for s, p in prices.items() if not PRICE.match(p)}
        assert not bad, f"badly formatted prices: {bad}"
        return prices

    def wait_prices_change(self, before: dict[str, str]) -> list[str]:
        """Wait until some `.last` cell differs from `before`; returns the symbols that moved."""
        moved = self.wait(
            """(before) => {
                const moved = [...document.querySelectorAll('#grid tr[data-symbol]')]
                    .filter((tr) => {
                        const last = tr.querySelector('.last').textContent;
                        return last !== '—' && last !== before[tr.dataset.symbol];
                    })
                    .map((tr) => tr.dataset.symbol);
                return moved.length ? moved : false;
            }""",
            before,
            what="a #grid .last price to change",
        )
        return list(moved)

    def settle(self) -> None:
        """Let the page paint what it has received (it paints once per animation frame)."""
        self.page.evaluate("() => new Promise((done) => requestAnimationFrame(() => done()))")

    def mark_old(self, selector: str) -> None:
        """Tag the rows now in the page, so that new rows can be told apart."""
        self.page.evaluate(
            "(sel) => document.querySelectorAll(sel).forEach((el) => { el.dataset.old = '1'; })",
            selector,
        )

    def wait_new_trades(self) -> list[dict[str, Any]]:
        rows = self.wait(
            """() => {
                const rows = [...document.querySelectorAll('#tape tr[data-id]:not([data-old])')];
                return rows.length ? rows.map((tr) => ({
                    id: tr.dataset.id, symbol: tr.dataset.symbol, side: tr.dataset.side,
                    cells: [...tr.cells].map((td) => td.textContent),
                })) : false;
            }""",
            what="a new trade row in #tape",
        )
        return list(rows)

    # ---- order book --------------------------------------------------------------------------

    def book_updates(self) -> int:
        return int(self.page.locator("#book").get_attribute("data-updates") or "0")

    def wait_book_updates_above(self, symbol: str, n: int, timeout: float = WAIT_MS) -> int:
        return int(
            self.wait(
                """([symbol, n]) => {
                    const book = document.getElementById('book');
                    const u = Number(book.dataset.updates);
                    return book.dataset.symbol === symbol && u > n ? u : false;
                }""",
                [symbol, n],
                what=f"#book[data-symbol={symbol}] data-updates to grow past {n}",
                timeout=timeout,
            )
        )

    # ---- orders ------------------------------------------------------------------------------

    def submit_order(self, symbol: str, side: str, qty: str) -> dict[str, str]:
        """Fill in the ticket, submit it, wait for the answer; returns the #order-result."""
        form = self.page.locator("#order-form")
        form.locator("select[name=symbol]").select_option(symbol)
        form.locator("select[name=side]").select_option(side)
        form.locator("input[name=qty]").fill(qty)
        # Back to idle first, so an earlier identical answer cannot pass for this one.
        self.page.evaluate(
            "() => { const r = document.getElementById('order-result');"
            " r.dataset.status = 'idle'; r.textContent = ''; }"
        )
        form.locator("button[type=submit]").click()
        result = self.wait(
            """() => {
                const r = document.getElementById('order-result');
                return ['ok', 'error'].includes(r.dataset.status)
                    ? {status: r.dataset.status, text: r.textContent,
                       orderId: r.dataset.orderId ?? '', code: r.dataset.code ?? ''}
                    : false;
            }""",
            what=f"#order-result to answer {side} {qty} {symbol}",
        )
        return dict(result)

    def wait_fill(self, order_id: str) -> dict[str, Any]:
        row = self.wait(
            """(id) => {
                const sel = `#fills tr[data-order-id="${id}"]:not([data-old])`;
                const tr = document.querySelector(sel);
                if (!tr) return false;
                const cells = [...tr.cells].map((td) => td.textContent);
                return {symbol: tr.dataset.symbol, cells};
            }""",
            order_id,
            what=f"a #fills row for order {order_id}",
        )
        return dict(row)

    def order_round_trip(self, symbol: str, side: str, qty: int) -> None:
        """Place a valid order through the form; it is accepted and comes back as a fill."""
        # Order ids start again at 1 in a restarted server: only a new row can be this fill.
        self.mark_old("#fills tr")
        result = self.submit_order(symbol, side, str(qty))
        assert result["status"] == "ok", result
        assert result["text"].startswith("Accepted"), result
        assert result["orderId"].isdigit(), result
        fill = self.wait_fill(result["orderId"])
        _time, order, sym, side_text, qty_text, price = fill["cells"]
        assert fill["symbol"] == symbol and sym == symbol, fill
        assert order == result["orderId"], fill
        assert side_text == side.upper(), fill
        assert qty_text == f"{qty:,}", fill
        assert PRICE.match(price), fill
        assert self.page.locator("#fills-empty").is_hidden()

    # ---- errors ------------------------------------------------------------------------------

    def allow_connection_errors(self, start: int) -> None:
        """Errors from index `start` to now may be connection noise (checked in assert_clean)."""
        self.allowed.append((start, len(self.errors)))

    def assert_clean(self) -> None:
        def expected(i: int, line: str) -> bool:
            return any(a <= i < b for a, b in self.allowed) and bool(CONNECTION_NOISE.search(line))

        unexpected = [e for i, e in enumerate(self.errors) if not expected(i, e)]
        assert not unexpected, "browser errors:\n  " + "\n  ".join(unexpected)


def screenshot(page: Page) -> None:
    """test-output/demo.png, and docs/images/demo.png with RUBRIS_UPDATE_DOCS_SCREENSHOT=1."""
    # Best effort, for the picture only: a moment when the book (a step every tick, following)
    # agrees with the watchlist on the selected symbol's bid.
    with contextlib.suppress(PlaywrightTimeoutError):
        page.wait_for_function(
            """() => {
                const sym = document.getElementById('book').dataset.symbol;
                const row = document.querySelector(`#grid tr[data-symbol="${sym}"] .bid`);
                return row && row.textContent === document.getElementById('book-bid').textContent;
            }""",
            timeout=3000,
        )
    out = ROOT / "test-output" / "demo.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out))
    if os.environ.get("RUBRIS_UPDATE_DOCS_SCREENSHOT") == "1":
        docs = ROOT / "docs" / "images" / "demo.png"
        docs.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, docs)


# ---- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.path.exists(CHROMIUM):
        # Not a skip: CI installs chromium, and a suite that quietly skips hides a broken setup.
        pytest.fail(MISSING_CHROMIUM, pytrace=False)
    pw: Playwright = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()
    finally:
        pw.stop()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[DemoServer]:
    srv = DemoServer(free_port(), tmp_path)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def demo(browser: Browser, server: DemoServer) -> Iterator[Demo]:
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(WAIT_MS)
    try:
        yield Demo(context.new_page(), server)
    finally:
        context.close()


# ---- tests ----------------------------------------------------------------------------------


@pytest.mark.browser
def test_chromium_is_installed() -> None:
    # The other tests error at setup without it; this one says so as a plain failure.
    assert os.path.exists(CHROMIUM), MISSING_CHROMIUM


@pytest.mark.browser
def test_websocket_prices_and_trades(demo: Demo) -> None:
    demo.open("/")
    demo.wait_open("websocket")
    assert demo.text("#status-resumed") == "no"
    assert demo.text("#conn-pill-text") == "Live · WebSocket"

    before = demo.wait_prices()
    assert len(before) == 50
    demo.wait_prices_change(before)

    trades = demo.wait_new_trades()
    t = trades[0]
    assert t["symbol"] in before and t["side"] in ("buy", "sell"), t
    _time, sym, side, qty, price = t["cells"]
    assert sym == t["symbol"] and side == t["side"].upper(), t
    assert re.fullmatch(r"[\d,]+", qty) and PRICE.match(price), t

    demo.wait(
        "() => Number(document.getElementById('status-rate').textContent) > 0",
        what="#status-rate to count messages",
    )
    stats = demo.stats()
    assert stats["frames"] > 0 and stats["messages"] > stats["frames"], stats
    demo.assert_clean()


@pytest.mark.browser
def test_order_book_as_a_live_table(demo: Demo) -> None:
    """The book is a keyed topic (issue 37): 100 price levels held by the page as a table, its
    changes mostly PATCHes, and the page shows what the deltas save against whole books."""
    demo.open("/")
    demo.wait_open("websocket")
    demo.wait_prices()
    demo.wait("() => document.getElementById('book').dataset.symbol === 'AAPL'", what="AAPL book")

    symbol = "NVDA"  # not the first row, which the page selects by itself
    demo.page.locator(f"#grid tr[data-symbol={symbol}]").click()
    demo.wait(
        "(s) => document.getElementById('book-title-symbol').textContent === s",
        symbol,
        what=f"the book title to name {symbol}",
    )
    row_class = demo.page.locator(f"#grid tr[data-symbol={symbol}]").get_attribute("class")
    assert "selected" in (row_class or "").split(), row_class
    first = demo.wait_book_updates_above(symbol, 0)
    demo.wait_book_updates_above(symbol, first)  # the counter keeps growing: live updates

    # The ladder is painted from the table: 50 levels a side around the quote.
    demo.wait(
        "() => Number(document.getElementById('book-codec').dataset.patches) > 0",
        what="#book-codec to count PATCHes",
    )
    assert re.fullmatch(r"\d+% patches", demo.text("#book-codec")), demo.text("#book-codec")
    levels: list[list[str]] = demo.page.evaluate(
        """() => [...document.querySelectorAll('#book-levels tr')].map((tr) =>
            [...tr.cells].map((td) => td.textContent))"""
    )
    assert len(levels) == 50
    for bid_qty, bid, ask, ask_qty in levels:
        assert PRICE.match(bid) and PRICE.match(ask), (bid, ask)
        assert re.fullmatch(r"[\d,]+", bid_qty) and re.fullmatch(r"[\d,]+", ask_qty)
    px = [[float(c.replace(",", "")) for c in row[1:3]] for row in levels]
    bids, asks = [b for b, _ in px], [a for _, a in px]
    assert bids == sorted(bids, reverse=True) and asks == sorted(asks), "a ladder out of order"
    assert bids[0] < asks[0]
    last = float(demo.last_prices()[symbol].replace(",", ""))
    assert abs(bids[0] - last) / last < 0.02, (bids[0], last, f"not {symbol}'s book")

    # what the deltas save: bytes a second of entries, against the same book sent whole
    demo.wait(
        "() => /% less$/.test(document.getElementById('book-saving').textContent)",
        what="#book-saving to say how much less the deltas take",
    )
    wire, whole = (demo.text(sel) for sel in ("#book-wire", "#book-whole"))
    assert re.fullmatch(r"[\d.]+ (B|KB)/s", wire) and re.fullmatch(r"[\d.]+ (B|KB)/s", whole)
    saving = int(demo.text("#book-saving").split("%")[0])
    assert saving > 30, (wire, whole, saving)  # the bench measures it (bench/tables.py)
    demo.assert_clean()


@pytest.mark.browser
def test_who_watches_a_book_and_my_positions(demo: Demo, browser: Browser) -> None:
    """Presence across tabs and users: two tabs of one browser are one member ("you ×2"),
    another browser is another; a closed tab's user leaves at once. An order makes a position,
    marked to the market."""
    demo.open("/")
    demo.wait_open("websocket")
    me = demo.text("#me")
    assert re.fullmatch(r"trader-[a-z0-9]+", me), me
    demo.wait("() => document.getElementById('watching').dataset.members === '1'", what="me")
    assert demo.text("#watching") == "you"

    second_tab = demo.page.context.new_page()  # same browser, same cookie: the same user
    second_tab.goto(demo.server.url + "/")
    other = browser.new_context(viewport=VIEWPORT)
    other_page = other.new_page()
    other_page.goto(demo.server.url + "/")
    other_name = other_page.wait_for_function(
        "() => /^trader-/.test(document.getElementById('me').textContent) &&"
        " document.getElementById('me').textContent",
        timeout=WAIT_MS,
    ).json_value()
    assert other_name != me
    demo.wait(
        "() => document.getElementById('watching').dataset.members === '2'",
        what="two members: this user (two tabs) and the other browser's",
    )
    demo.wait(
        "(o) => document.getElementById('watching').textContent === `you ×2${o}`",
        other_name,
        what="#watching to show both",
    )
    # the other user's only tab closed as a user closes a tab (its unload handlers run: the
    # context's close tears the page down without them, and the UNSUBSCRIBE sent on pagehide
    # was then sometimes dropped with the socket): it leaves at once
    other_page.close(run_before_unload=True)
    demo.wait(
        "() => document.getElementById('watching').textContent === 'you ×2'",
        what="the other user gone",
    )
    other.close()
    second_tab.close()
    demo.wait("() => document.getElementById('watching').textContent === 'you'", what="one tab")

    demo.page.locator("#order-form input[name=qty]").fill("250")
    demo.page.locator("#order-form button.submit").click()
    demo.wait(
        "() => document.querySelector('#positions tr[data-symbol=AAPL]') !== null",
        what="a position in AAPL",
    )
    qty, avg, last, pnl = demo.page.evaluate(
        """() => [...document.querySelector('#positions tr[data-symbol=AAPL]').cells]
            .slice(1).map((td) => td.textContent)"""
    )
    assert qty == "250" and PRICE.match(avg) and PRICE.match(last), (qty, avg, last)
    assert re.fullmatch(r"[+-]?[\d,]+\.\d\d", pnl), pnl
    demo.assert_clean()


@pytest.mark.browser
def test_forced_longpoll(demo: Demo) -> None:
    demo.open("/?transport=longpoll")
    demo.wait_open("longpoll")
    assert demo.text("#conn-pill-text") == "Live · long-poll"
    demo.wait_prices_change(demo.wait_prices())
    demo.wait_new_trades()
    demo.wait_book_updates_above("AAPL", 0)  # deflated pushes decode over long-poll too
    assert demo.stats()["compressed"] > 0
    demo.order_round_trip("TSLA", "buy", 42)
    assert demo.page.evaluate("() => window.rubris.transport") == "longpoll"
    demo.assert_clean()


@pytest.mark.browser
@pytest.mark.parametrize(
    ("transport", "how"),
    [("websocket", "kill"), ("websocket", "terminate"), ("longpoll", "kill")],
)
def test_server_restart(demo: Demo, transport: str, how: str) -> None:
    demo.open("/" if transport == "websocket" else f"/?transport={transport}")
    demo.wait_open(transport)
    demo.wait_prices_change(demo.wait_prices())
    demo.wait_new_trades()
    demo.wait_book_updates_above("AAPL", 0)
    demo.order_round_trip("AAPL", "buy", 3)
    old_session = demo.page.evaluate("() => window.rubris.sessionId")
    seen = len(demo.states())

    noise_from = len(demo.errors)
    if how == "kill":
        demo.server.kill()  # SIGKILL: sockets die with the process, no GOODBYE
    else:
        demo.server.stop()  # SIGTERM: uvicorn closes WebSockets with 1012
    demo.wait(
        "() => document.getElementById('status-state').textContent === 'reconnecting'",
        what="#status-state 'reconnecting' once the server is gone",
    )
    demo.settle()  # what arrived before the end is painted, so not mistaken for what follows
    demo.mark_old("#tape tr")
    before = demo.last_prices()
    updates = demo.book_updates()

    demo.server.start()  # a new process on the same port: new sessions, new epochs
    demo.wait_open(transport, timeout=RECOVER_MS)
    demo.allow_connection_errors(noise_from)
    session = demo.page.evaluate("() => window.rubris.sessionId")
    assert session and session != old_session
    # A new server cannot resume the old session: the first open after the restart is a new
    # session, and the page subscribed everything again.
    first_open = next(e for e in demo.states()[seen:] if e["state"] == "open")
    assert first_open["resumed"] is False and first_open["session"] != old_session, first_open

    demo.wait_prices_change(before)  # the re-subscribed snapshots…
    demo.wait_prices_change(demo.last_prices())  # …and live updates after them
    demo.wait_new_trades()
    demo.wait_book_updates_above("AAPL", updates)
    demo.order_round_trip("AAPL", "sell", 7)  # `fills` was re-subscribed before the call
    assert demo.page.locator("#fills tr").count() == 2
    demo.assert_clean()


@pytest.mark.browser
def test_dropped_websocket_resumes(demo: Demo) -> None:
    demo.page.add_init_script(script=f"({WS_SWITCH})({free_port()})")
    demo.open("/")
    demo.wait_open("websocket")
    demo.wait_prices()
    demo.order_round_trip("META", "buy", 11)
    session = demo.page.evaluate("() => window.rubris.sessionId")
    frames = demo.stats()["frames"]

    # Cut the socket under the client, as a network drop would (the client's own close() would
    # not reconnect).
    demo.page.evaluate("() => window.__sockets.forEach((ws) => ws.close())")
    demo.wait(
        "(n) => window.rubris.state === 'open' && window.rubris.stats.frames > n"
        " && document.getElementById('status-resumed').textContent === 'yes'",
        frames,
        what="the client to reconnect and resume",
    )
    assert demo.page.evaluate("() => window.rubris.sessionId") == session
    assert demo.text("#status-state") == "open"
    demo.wait(
        "() => document.getElementById('status-notice').textContent.includes('session resumed')",
        what="the 'session resumed' notice",
    )
    demo.wait_prices_change(demo.last_prices())
    demo.order_round_trip("META", "sell", 12)
    assert demo.page.locator("#fills tr").count() == 2  # nothing replayed twice
    assert demo.stats()["gaps"] == 0
    demo.assert_clean()


@pytest.mark.browser
def test_websocket_back_after_fallback(demo: Demo) -> None:
    """WebSockets fail for a while after having worked: long-poll carries the session meanwhile,
    and the page goes back to WebSocket once they work again (same session throughout)."""
    demo.page.add_init_script(script=f"({WS_SWITCH})({free_port()})")
    demo.open("/")
    demo.wait_open("websocket")
    demo.wait_prices()
    demo.order_round_trip("AMD", "buy", 5)
    session = demo.page.evaluate("() => window.rubris.sessionId")
    seen = len(demo.states())

    noise_from = len(demo.errors)
    demo.page.evaluate(
        "() => { window.__wsBlocked = true; window.__sockets.forEach((ws) => ws.close()); }"
    )
    demo.wait_open("longpoll")
    sockets = demo.page.evaluate("() => window.__sockets.length")
    demo.wait_prices_change(demo.last_prices())
    demo.order_round_trip("AMD", "sell", 6)
    # One probe for a WebSocket fails while they are still blocked; a later one gets through.
    demo.wait("(n) => window.__sockets.length > n", sockets, what="a WebSocket probe")
    assert demo.page.evaluate("() => window.rubris.transport") == "longpoll"
    demo.page.evaluate("() => { window.__wsBlocked = false; }")
    demo.wait(
        "(n) => window.__states.slice(n).some((e) => e.state === 'open'"
        " && e.transport === 'websocket')",
        seen,
        what="the session to open on a WebSocket again",
        timeout=RECOVER_MS,
    )
    demo.wait_open("websocket")
    demo.allow_connection_errors(noise_from)

    assert demo.page.evaluate("() => window.rubris.sessionId") == session
    opens = [e for e in demo.states()[seen:] if e["state"] == "open"]
    assert [(e["transport"], e["resumed"]) for e in opens] == [
        ("longpoll", True),
        ("websocket", True),
    ], demo.states()
    demo.wait_prices_change(demo.last_prices())
    demo.order_round_trip("AMD", "buy", 7)
    assert demo.page.locator("#fills tr").count() == 3
    assert demo.stats()["gaps"] == 0
    demo.assert_clean()


@pytest.mark.browser
def test_longpoll_fallback_when_websockets_never_work(demo: Demo) -> None:
    """WebSockets blocked from the start (a proxy that refuses them): auto settles on long-poll
    and stays there, without probing for WebSockets again."""
    demo.page.add_init_script(script=f"({WS_SWITCH})({free_port()}); window.__wsBlocked = true;")
    demo.page.goto(demo.server.url + "/", wait_until="load")
    demo.wait_open("longpoll")
    assert demo.text("#conn-pill-text") == "Live · long-poll"
    demo.wait_prices_change(demo.wait_prices())
    demo.order_round_trip("QCOM", "buy", 9)
    demo.page.wait_for_timeout(1500)  # longer than the first probe would wait
    assert demo.page.evaluate("() => window.__sockets.length") == 1
    assert demo.page.evaluate("() => window.rubris.transport") == "longpoll"
    demo.allow_connection_errors(0)  # the one refused WebSocket is the point of this test
    demo.assert_clean()


@pytest.mark.browser
def test_order_fill_and_rejections(demo: Demo) -> None:
    demo.open("/")
    demo.wait_open("websocket")
    demo.wait_prices()
    assert demo.page.locator("#fills tr").count() == 0
    demo.order_round_trip("MSFT", "buy", 1234)
    demo.order_round_trip("GOOG", "sell", 10_000)
    assert demo.page.locator("#fills tr").count() == 2

    for qty in ("0", "20000", "-5"):
        result = demo.submit_order("MSFT", "buy", qty)
        assert result["status"] == "error", result
        assert "qty must be a whole number from 1 to 10000" in result["text"], result
        assert result["code"] == "10", result  # REJECTED: the server's answer, not the page's
    result = demo.submit_order("MSFT", "buy", "2.5")
    assert result == {
        "status": "error",
        "text": "Quantity must be a whole number.",
        "orderId": "",
        "code": "input",
    }
    assert demo.page.locator("#fills tr").count() == 2  # no fill for a refused order
    assert demo.page.locator("#order-form button[type=submit]").is_enabled()

    demo.order_round_trip("MSFT", "buy", 1234)  # the form still works after refusals
    # A live-looking page for the screenshot: prices, tape, book and chart filled in.
    demo.wait_book_updates_above("AAPL", 1)
    demo.wait(
        "() => document.querySelector('#chart .chart-line').getAttribute('points').length > 0",
        what="the price chart to be drawn",
    )
    screenshot(demo.page)
    demo.assert_clean()


@pytest.mark.browser
def test_slow_handler_sends_nak(demo: Demo) -> None:
    """A page whose handlers fall behind says so with NAK (protocol.md section 8)."""
    demo.open("/")
    demo.wait_open("websocket")
    demo.page.evaluate(
        """async () => {
            const { connect } = await import('/rubris/client.js');
            // a second client with a small inbound queue and handlers that take 15 ms each
            const slow = connect('/rubris', { inboundLimit: 40 });
            window.slowClient = slow;
            const busy = () => { const t = performance.now(); while (performance.now() - t < 15); };
            for (const s of await slow.call('symbols')) slow.subscribe('prices.' + s.symbol, busy);
            slow.subscribe('trades', busy);
        }"""
    )
    demo.wait(
        "() => window.slowClient.stats.naks > 0",
        what="the slow client to send a NAK",
        timeout=20_000,
    )
    # it told the server and carries on: still open, still receiving
    before = demo.page.evaluate("() => window.slowClient.stats.messages")
    demo.wait(
        "(n) => window.slowClient.state === 'open' && window.slowClient.stats.messages > n",
        before,
        what="the slow client to keep receiving after its NAK",
    )
    demo.page.evaluate("() => window.slowClient.close()")
    demo.assert_clean()


@pytest.mark.browser
def test_close_reasons_fit_a_close_frame(demo: Demo) -> None:
    """A close reason is cut to 123 UTF-8 bytes at a character boundary; a longer one would make
    WebSocket.close throw and leave the socket open."""
    demo.open("/")
    cut = demo.page.evaluate(
        r"""async () => {
            const { closeReason } = await import('/rubris/client/websocket.js');
            const reasons = ['ok', 'x'.repeat(200), '\u00e9'.repeat(100), '\u6f22'.repeat(60),
                             '\u{1F600}'.repeat(40), 'a' + '\u6f22'.repeat(41)];
            const out = [];
            for (const r of reasons) {
                const c = closeReason(r);
                const ws = new WebSocket(location.origin.replace('http', 'ws') + '/rubris/ws');
                let closed = true;
                try { ws.close(1000, c); } catch { closed = false; }
                out.push([r, c, new TextEncoder().encode(c).length, closed]);
            }
            return out;
        }"""
    )
    for reason, short, nbytes, closed in cut:
        assert closed, short  # WebSocket.close accepted it
        assert nbytes == len(short.encode()) <= 123 and reason.startswith(short)
        if len(reason.encode()) <= 123:
            assert short == reason
        else:  # cut as late as it can be: the next character would not have fitted
            assert 123 - nbytes < len(reason[len(short)].encode())
    demo.assert_clean()


@pytest.mark.browser
def test_a_trade_published_over_the_http_api_reaches_the_tape(demo: Demo) -> None:
    """Another program prints a trade through POST /rubris/api/publish; the page shows it."""
    demo.open("/")
    demo.wait_open("websocket")
    demo.wait_new_trades()
    trade = {"id": 987654321, "symbol": "AAPL", "price": 123.45, "qty": 777, "side": "sell"}
    body = json.dumps([{"topic": "trades", "data": {**trade, "ts": int(time.time() * 1000)}}])
    req = urllib.request.Request(
        f"{demo.server.url}/rubris/api/publish",
        data=body.encode(),
        headers={"Authorization": f"Bearer {API_TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5) as res:
        assert res.status == 200 and json.loads(res.read())["accepted"] == 1
    row = demo.wait(
        """() => {
            const tr = document.querySelector('#tape tr[data-id="987654321"]');
            return tr ? [...tr.cells].map((td) => td.textContent) : false;
        }""",
        what="the published trade in #tape",
    )
    _time, sym, side, qty, price = row
    assert (sym, side, qty, price) == ("AAPL", "SELL", "777", "123.45")
    demo.assert_clean()


# ---- the work queue panel -------------------------------------------------------------------


def start_worker(
    server: DemoServer, name: str, transport: str, log_dir: Path
) -> subprocess.Popen[bytes]:
    """``python3 -m example_app.worker`` against `server`, its output in a log file."""
    with (log_dir / f"worker-{name}.log").open("ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "example_app.worker",
                "--url",
                f"{server.url}/rubris",
                "--name",
                name,
                "--work",
                "0.05",
                "--transport",
                transport,
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


# The panel's reading of the "reprice.stats" snapshot.
QUEUE_STATS = """() => Object.fromEntries(
    ['waiting', 'outstanding', 'consumers', 'acked', 'returned', 'dead'].map((k) => {
        const v = document.getElementById('rq-' + k).dataset.value;
        return [k, v === undefined ? null : Number(v)];
    }))"""

# The rows of #rq-results: who did which job, at which attempt.
RESULT_ROWS = """() => [...document.querySelectorAll('#rq-results tr')].map((tr) => ({
    job: tr.dataset.job, worker: tr.dataset.worker, kind: tr.dataset.kind,
    attempt: tr.dataset.attempt, mine: tr.classList.contains('mine'),
    cells: [...tr.cells].map((td) => td.textContent),
    retry: tr.querySelector('td.attempt').classList.contains('retry'),
}))"""


@pytest.mark.browser
@pytest.mark.parametrize("transport", ["websocket", "longpoll"])
def test_work_queue_panel(demo: Demo, transport: str, tmp_path: Path) -> None:
    """The tab works reprice jobs (its own rows marked) next to a Python worker; the stats
    count both; unticking "This tab works jobs" stops the tab's consumer."""
    began = time.monotonic()
    # Every result this tab hands the server (the reprice_result RPC), from the first: the
    # client is wrapped as the page creates it, before its consumer can start.
    demo.page.add_init_script(
        """(() => {
            window.__resultCalls = [];
            let client;
            Object.defineProperty(window, 'rubris', {
                configurable: true,
                get: () => client,
                set: (c) => {
                    client = c;
                    const call = c.call.bind(c);
                    c.call = (method, args) => {
                        if (method === 'reprice_result') window.__resultCalls.push({
                            job: args.job,
                            state: document.getElementById('reprice')?.dataset.state,
                        });
                        return call(method, args);
                    };
                },
            });
        })()"""
    )
    demo.open(f"/?transport={transport}")
    demo.wait_open(transport)
    panel = demo.page.locator("#reprice")
    me = panel.get_attribute("data-worker") or ""
    assert re.fullmatch(r"tab-[0-9a-f]{4}", me), me
    assert demo.text("#rq-name") == me
    assert demo.page.locator("#rq-work").is_checked()
    assert demo.text(".queue-hint") == (
        f"Add workers: python3 -m example_app.worker --url {demo.server.url}/rubris"
    )

    # This tab's results come back on the ring, marked as its own; the stats count its work.
    demo.wait(
        "(me) => [...document.querySelectorAll('#rq-results tr.mine')]"
        ".some((tr) => tr.dataset.worker === me)",
        me,
        what=f"a result by this tab ({me}) in #rq-results",
    )
    mine = [r for r in demo.page.evaluate(RESULT_ROWS) if r["worker"] == me]
    assert mine and all(r["mine"] and r["kind"] == "mine" for r in mine), mine
    job, symbol, fair, worker, _attempt, took = mine[0]["cells"]
    assert re.fullmatch(r"#\d+", job) and symbol and PRICE.match(fair), mine[0]
    assert worker == f"{me} (this tab)" and took.endswith(" ms"), mine[0]
    demo.wait(
        f"() => {{ const s = ({QUEUE_STATS})(); return s.consumers >= 1 && s.acked >= 1; }}",
        what="#rq-consumers ≥ 1 and #rq-acked ≥ 1",
    )
    assert int(panel.get_attribute("data-done") or "0") >= 1
    assert panel.get_attribute("data-state") == "working"

    # Another tab's result on a later attempt: another colour, the attempt marked.
    demo.page.evaluate(
        """() => window.rubris.call('reprice_result', {job: 99999, symbol: 'AAPL', fair: 1.5,
            worker: 'tab-beef', attempt: 3, ms: 7})"""
    )
    demo.wait(
        "() => document.querySelector('#rq-results tr[data-job=\"99999\"]') !== null",
        what="the result of tab-beef in #rq-results",
    )
    row = next(r for r in demo.page.evaluate(RESULT_ROWS) if r["job"] == "99999")
    assert (row["kind"], row["mine"], row["retry"]) == ("tab", False, True), row
    assert row["cells"][2:] == ["1.50", "tab-beef", "↻ 3", "7 ms"], row

    # A Python worker joins: its results show up, and the stats count two consumers.
    proc = start_worker(demo.server, "py-test", transport, tmp_path)
    try:
        demo.wait(
            "() => document.querySelector('#rq-results tr[data-worker=\"py-test\"]') !== null",
            what="a result by py-test in #rq-results",
            timeout=15_000,
        )
        row = next(r for r in demo.page.evaluate(RESULT_ROWS) if r["worker"] == "py-test")
        assert (row["kind"], row["mine"]) == ("py", False), row
        demo.wait(
            f"() => ({QUEUE_STATS})().consumers >= 2",
            what="#rq-consumers to count the tab and py-test",
        )

        # Untick: the tab lets go of the queue; py-test carries on alone.
        demo.page.locator("#rq-work").uncheck()
        demo.wait(
            "() => document.getElementById('reprice').dataset.state === 'off'",
            what="#reprice[data-state=off] after unticking",
        )
        done = int(panel.get_attribute("data-done") or "0")
        called = demo.page.evaluate("() => window.__resultCalls.map((c) => c.job)")
        demo.page.evaluate(
            """(me) => {
                window.__afterStop = {mine: [], others: 0};
                window.rubris.subscribe('reprice.results', (r) => {
                    if (r.worker === me) window.__afterStop.mine.push(r.job);
                    else window.__afterStop.others++;
                });
            }""",
            me,
        )
        demo.wait(
            f"() => ({QUEUE_STATS})().consumers === 1",
            what="#rq-consumers to drop to 1 (py-test alone)",
        )
        demo.wait(
            "() => window.__afterStop.others > 0",
            what="py-test to go on working after the tab stopped",
        )
        demo.page.wait_for_timeout(500)
        after = demo.page.evaluate("() => window.__afterStop")
        # The tab works nothing once off. Results it handed over before may still come back
        # afterwards: a ring gives a client one message a frame, and over long-poll each frame
        # is a poll's round trip, so its own last result can queue behind py-test's.
        calls = demo.page.evaluate("() => window.__resultCalls")
        assert calls[len(called) :] == [], calls
        assert all(c["state"] != "off" for c in calls), calls
        assert set(after["mine"]) <= set(called), (after, called)
        assert int(panel.get_attribute("data-done") or "0") == done
        assert demo.text("#rq-state").startswith("off")
    finally:
        stop_process(proc)
    assert time.monotonic() - began < 30
    demo.assert_clean()

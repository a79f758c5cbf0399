"""The demo page's text is all there to read, at 1280x800 and at 1024x768 (issue 36).

A new user found the work queue's "In progress" and "Dead letters" figures cut short
("DEAD LETTE…") and the status bar's notice (why the server closed the session, what the page
does next) cut off or, at 1024 wide, not shown at all. The demo runs as a subprocess
(tests/test_browser.py's ``DemoServer``); one page per window size opens it, then the server
stops, which sends every session GOODBYE 9 and puts its reason in the status bar. Nothing this
test names may be clipped (by its own box or an ancestor's) or covered by another element, and
at 1024 wide, where the panels scroll, the status bar must not cover the last of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, ViewportSize

from .netkit import free_port
from .test_browser import WAIT_MS, Demo, DemoServer

pytestmark = pytest.mark.browser

SIZES: list[ViewportSize] = [{"width": 1280, "height": 800}, {"width": 1024, "height": 768}]

READ = [
    ".queue-summary .label",
    ".queue-summary .num",
    ".queue-hint",
    "#rq-command",
    ".statusbar .stat",
]
"""What a user reads: the queue's figures and the command for more workers, the status bar."""

BOOK = [".book-wire .label", "#book-wire", "#book-whole", ".watching-row .label", "#watching-count"]
"""What the book panel says of its deltas against whole books, and how many watch it (issue
37), read where the page opens (at 1024 wide the queue is scrolled to below)."""

HIDDEN = """(selectors) => {
    // each element of `selectors` whose text is not all in view: cut by its own box (text
    // overflowing an ellipsis), by an ancestor that clips, by the window, or covered by another
    // element at its middle
    const out = [];
    for (const el of document.querySelectorAll(selectors.join(","))) {
        if (!el.getClientRects().length) continue;
        const r = el.getBoundingClientRect();
        const text = el.textContent.trim();
        const why = [];
        if (el.clientWidth && el.scrollWidth > el.clientWidth + 1) why.push("overflows its box");
        const out_x = r.left < -0.5 || r.right > innerWidth + 0.5;
        if (out_x || r.top < -0.5 || r.bottom > innerHeight + 0.5) why.push("outside the window");
        for (let a = el.parentElement; a && a !== document.documentElement; a = a.parentElement) {
            const cs = getComputedStyle(a);
            if (cs.overflowX === "visible" && cs.overflowY === "visible") continue;
            const box = a.getBoundingClientRect();
            if (r.left < box.left - 0.5 || r.right > box.right + 0.5
                || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5)
                why.push(`clipped by ${a.tagName.toLowerCase()}.${a.className}`);
        }
        const top = document.elementFromPoint((r.left + r.right) / 2, (r.top + r.bottom) / 2);
        if (top && !el.contains(top) && !top.contains(el))
            why.push(`covered by ${top.tagName.toLowerCase()}.${top.className}`);
        if (why.length) out.push(`${text || el.className}: ${why.join(", ")}`);
    }
    return out;
}"""


def hidden(demo: Demo, selectors: list[str]) -> list[Any]:
    return list(demo.page.evaluate(HIDDEN, selectors))


def test_the_queue_figures_and_the_status_bar_are_readable(
    chromium: Browser, tmp_path: Path
) -> None:
    server = DemoServer(free_port(), tmp_path)
    server.start()
    demos: list[tuple[ViewportSize, Demo]] = []
    try:
        for size in SIZES:
            context = chromium.new_context(viewport=size)
            context.set_default_timeout(WAIT_MS)
            demo = Demo(context.new_page(), server)
            demo.open("/")
            demo.wait_open("websocket")
            demo.wait(
                "() => /\\d/.test(document.getElementById('rq-waiting').textContent)"
                " && document.getElementById('rq-command').textContent.includes('/rubris')",
                what="the work queue's figures and the worker command",
            )
            demos.append((size, demo))
        for size, demo in demos:
            where = f"{size['width']}x{size['height']}"
            demo.wait(
                "() => /% less$/.test(document.getElementById('book-saving').textContent)",
                what="the book's figures",
            )
            assert hidden(demo, BOOK) == [], where
            # at 1024 wide the panels scroll between the bars, the queue last: scrolled to the
            # end, it is all above the status bar, not under it (at 1280 nothing scrolls)
            demo.page.evaluate("() => { document.querySelector('main').scrollTop = 1e6; }")
            demo.settle()
            assert hidden(demo, READ) == [], where
            assert demo.text("#rq-command").startswith("python3 -m example_app.worker"), where

        server.stop()  # GOODBYE 9 to every session: its reason goes to the status bar
        for size, demo in demos:
            demo.wait(
                "() => document.getElementById('status-notice').textContent"
                ".startsWith('Server closed the session: ')",
                what="the GOODBYE's notice",
            )
            notice = demo.text("#status-notice")
            assert "(code 9)" in notice, notice
            assert hidden(demo, ["#status-notice", ".statusbar .stat"]) == [], size
    finally:
        for _size, demo in demos:
            demo.page.context.close()
        server.stop()

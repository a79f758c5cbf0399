"""The guide's TypeScript example (docs/guide.md, "In a Vite + TypeScript app"), as written,
against the demo, in headless Chromium.

Issue 36: the example read ``price.px``, a field the demo's prices do not have (it showed
"AAPL undefined"), and placed an order without subscribing to ``fills`` first, which the demo
refuses. Here the ``src/main.ts`` block is taken from the guide as it stands, compiled with the
strict settings of a Vite ``vanilla-ts`` project against the ``rubris-client`` declarations (the
tests/typescript project's node_modules: TypeScript and the package linked from
rubris_asgi/static), and run as a module of a page of the demo's own origin, ``rubris-client``
mapped to the demo's ``/rubris/client.js`` as a bundler would resolve it. The page must show a
price of AAPL, the order accepted and its fill, and no refusal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Route, sync_playwright

from .browserkit import CHROMIUM, CHROMIUM_ARGS, HAVE_CHROMIUM, MISSING_CHROMIUM
from .netkit import free_port
from .test_browser import WAIT_MS, Demo, DemoServer
from .test_typescript import PROJECT, ensure_node_modules, run, tool

pytestmark = [pytest.mark.node, pytest.mark.browser]

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide.md"

TSCONFIG = {
    # what `npm create vite@7 -- --template vanilla-ts` writes, less its bundler-only options
    "compilerOptions": {
        "target": "ES2022",
        "module": "ESNext",
        "lib": ["ES2022", "DOM", "DOM.Iterable"],
        "moduleResolution": "bundler",
        "types": [],
        "skipLibCheck": True,
        "strict": True,
        "noUnusedLocals": True,
        "noUnusedParameters": True,
        "noFallthroughCasesInSwitch": True,
        "verbatimModuleSyntax": True,
        "outDir": "dist",
        "rootDir": "src",
    },
    "include": ["src"],
}

PAGE = """<!doctype html>
<meta charset="utf-8">
<title>the guide's main.ts</title>
<script type="importmap">{"imports": {"rubris-client": "/rubris/client.js"}}</script>
<script type="module" src="/guide-ts/main.js"></script>
"""


def main_ts() -> str:
    """The guide's ``// src/main.ts`` block, as written."""
    blocks = re.findall(r"```ts\n(.*?)```", GUIDE.read_text(), re.S)
    [main] = [b for b in blocks if b.startswith("// src/main.ts\n")]
    return main


def compile_main(project: Path) -> str:
    """main.ts compiled (strict) in a Vite-like project at ``project``; the JavaScript."""
    node = tool("node")
    ensure_node_modules()
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.ts").write_text(main_ts())
    (project / "tsconfig.json").write_text(json.dumps(TSCONFIG))
    # rubris-client and TypeScript as the project's own dependencies would give them
    (project / "node_modules").symlink_to(PROJECT / "node_modules", target_is_directory=True)
    tsc = str(PROJECT / "node_modules" / "typescript" / "bin" / "tsc")
    done = run([node, tsc, "-p", str(project), "--pretty", "false"], timeout=120)
    assert done.returncode == 0, f"the guide's main.ts:\n{done.stdout}{done.stderr}"
    return (project / "dist" / "main.js").read_text()


@pytest.fixture
def lna_chromium() -> Iterator[Browser]:
    """Chromium as the other browser tests start it, less its Local Network Access checks: the
    page here is made up by the test (Playwright's ``route.fulfill``), so Chromium cannot tell
    it came from 127.0.0.1 and would refuse it the WebSocket to the loopback address that a page
    really served from there (a Vite dev server, the demo) may open."""
    if not HAVE_CHROMIUM:
        pytest.fail(MISSING_CHROMIUM, pytrace=False)
    with sync_playwright() as pw:
        args = [*CHROMIUM_ARGS, "--disable-features=LocalNetworkAccessChecks"]
        b = pw.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            yield b
        finally:
            b.close()


def test_the_guides_typescript_example_works_against_the_demo(
    lna_chromium: Browser, tmp_path: Path
) -> None:
    script = compile_main(tmp_path / "app")
    server = DemoServer(free_port(), tmp_path)
    server.start()
    try:
        context = lna_chromium.new_context()
        context.set_default_timeout(WAIT_MS)
        page = context.new_page()
        demo = Demo(page, server)

        def serve(route: Route) -> None:
            if route.request.url.endswith("/main.js"):
                route.fulfill(body=script, content_type="text/javascript")
            else:
                route.fulfill(body=PAGE, content_type="text/html")

        page.route(f"{server.url}/guide-ts/**", serve)
        page.goto(f"{server.url}/guide-ts/")
        lines = demo.wait(
            """() => {
                const lines = document.body.innerText.split("\\n");
                const done = (l) => l.startsWith("filled ") || l.startsWith("refused: ");
                return lines.some(done) && lines;
            }""",
            what="the fill of the guide's order (or its refusal)",
        )
        text = "\n".join(lines)
        assert "open over websocket" in lines, (text, demo.console)
        assert any(re.fullmatch(r"AAPL \d+(\.\d+)?", line) for line in lines), text
        assert any(re.fullmatch(r"order \d+ accepted", line) for line in lines), text
        assert any(re.fullmatch(r"filled buy 10 AAPL at \d+(\.\d+)?", line) for line in lines)
        assert "undefined" not in text and "refused" not in text, text
        assert demo.errors == [], demo.errors
        context.close()
    finally:
        server.stop()

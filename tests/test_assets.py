"""The browser files: client.js and its ES modules, served from memory with revalidation."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from rubris_asgi import Rubris
from rubris_asgi.server.assets import STATIC, Assets


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with Rubris() as rubris:  # started, as under a lifespan
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client


def test_every_js_file_under_static_is_in_the_table() -> None:
    names = set(Assets().files)
    assert "client.js" in names
    assert names == {p.relative_to(STATIC).as_posix() for p in STATIC.rglob("*.js")}


async def test_client_js_is_served_with_an_etag_and_revalidated(http: httpx.AsyncClient) -> None:
    r = await http.get("/client.js")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/javascript")
    assert r.headers["cache-control"] == "no-cache"
    etag = r.headers["etag"]
    assert re.fullmatch(r'"[0-9a-f]{24}"', etag)
    assert r.content == (STATIC / "client.js").read_bytes()

    again = await http.get("/client.js", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == etag
    weak = await http.get("/client.js", headers={"If-None-Match": f'"other", W/{etag}'})
    assert weak.status_code == 304
    stale = await http.get("/client.js", headers={"If-None-Match": '"stale"'})
    assert stale.status_code == 200 and stale.content == r.content


async def test_head_gives_the_length_without_the_body(http: httpx.AsyncClient) -> None:
    r = await http.head("/client.js")
    assert r.status_code == 200 and r.content == b""
    assert int(r.headers["content-length"]) == len((STATIC / "client.js").read_bytes())


def imports(source: str) -> list[str]:
    """The relative specifiers of a module's static imports and re-exports."""
    found = re.findall(r"""(?:import|export)\s[^;'"]*?from\s+["'](\.[^"']+)["']""", source)
    return found + re.findall(r"""^import\s+["'](\.[^"']+)["']""", source, re.MULTILINE)


def test_client_js_names_every_module_so_a_page_loads_them_in_one_round_trip() -> None:
    direct = {spec.removeprefix("./") for spec in imports((STATIC / "client.js").read_text())}
    client = {name for name in Assets().files if not name.startswith("ops/")}  # the ops page's
    assert direct == client - {"client.js"}


async def test_every_module_client_js_imports_is_served(http: httpx.AsyncClient) -> None:
    """Follow the relative imports from client.js: each must resolve to a served module."""
    seen: set[str] = set()
    todo = ["client.js"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        url = "/" + name
        r = await http.get(url)
        assert r.status_code == 200, url
        assert r.headers["cache-control"] == "no-cache"
        base = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
        for spec in imports(r.text):
            parts = (base + spec).split("/")
            resolved: list[str] = []
            for part in parts:
                if part == "..":
                    resolved.pop()
                elif part != ".":
                    resolved.append(part)
            todo.append("/".join(resolved))
    client = {name for name in Assets().files if not name.startswith("ops/")}  # the ops page's
    assert seen == client, "a module under static/client/ is not reachable from client.js"


@pytest.mark.parametrize(
    "path",
    [
        "/client/nothing.js",
        "/client/../app.py",
        "/client/%2e%2e/app.py",
        "/client/..%2fapp.py",
        "/client//etc/passwd",
        "/client/client.js/x",
    ],
)
async def test_nothing_outside_the_table_is_served(http: httpx.AsyncClient, path: str) -> None:
    r = await http.get(path)
    assert r.status_code == 404
    assert b"import" not in r.content

"""``GET {mount}/api/topics/{name}`` (server/http/topics.py): what a shared topic holds, by seq."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from rubris_asgi import Codec, Config, Limits, Reject, Rubris, Session
from rubris_asgi.protocol import COMPRESSED

TOKEN = "read-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def make(**kwargs: Any) -> Rubris:
    kwargs.setdefault("api_token", TOKEN)
    limits = kwargs.pop("limits", Limits())
    rubris = Rubris(Config(limits=limits), batches=False, **kwargs)

    @rubris.shared("trades.{symbol}", ring=8)
    async def trades(session: Session, symbol: str) -> None:
        return None

    @rubris.shared("status", snapshot=True)
    async def status(session: Session) -> None:
        return None

    @rubris.shared("log", ring=16, codec=Codec.TEXT)
    async def log(session: Session) -> None:
        return None

    @rubris.shared("blobs", ring=16, codec=Codec.BYTES)
    async def blobs(session: Session) -> None:
        return None

    @rubris.shared("files.{path:path}", ring=4)
    async def files(session: Session, path: str) -> None:
        return None

    @rubris.private("inbox")
    async def inbox(session: Session) -> None:
        return None

    @rubris.queue("jobs")
    async def jobs(session: Session) -> None:
        return None

    return rubris


@pytest.fixture
async def api() -> AsyncIterator[tuple[Rubris, httpx.AsyncClient]]:
    async with make() as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            yield rubris, http


async def read(http: httpx.AsyncClient, name: str, **params: Any) -> dict[str, Any]:
    r = await http.get(f"/api/topics/{name}", params=params, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    body: dict[str, Any] = orjson.loads(r.content)
    assert r.headers["rubris-fill"] == str(body["fill"])
    return body


def seqs(body: dict[str, Any]) -> list[int]:
    return [m["seq"] for m in body["messages"]]


async def test_a_ring_read_by_after_and_limit(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    for i in range(1, 6):
        assert rubris.publish("trades.A", {"i": i, "px": i / 10}) == i
    epoch = rubris.engine.topics["trades.A"].epoch
    body = await read(http, "trades.A")
    assert body == {
        "topic": "trades.A",
        "mode": "ring",
        "codec": "json",
        "epoch": epoch,
        "head": 5,
        "oldest": 1,
        "messages": [{"seq": i, "data": {"i": i, "px": i / 10}} for i in range(1, 6)],
        "fill": 0,
    }
    assert seqs(await read(http, "trades.A", after=2, limit=2)) == [3, 4]
    assert seqs(await read(http, "trades.A", after=4, limit=10_000)) == [5]
    # at or past the head: no messages, the cheap way to read the numbers
    for after in (5, 99, 2**64 - 1):
        body = await read(http, "trades.A", after=after, limit=1)
        assert body["messages"] == [] and body["head"] == 5 and body["epoch"] == epoch


async def test_another_epoch_reads_from_the_start(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    for i in range(4):
        rubris.publish("trades.A", i)
    epoch = rubris.engine.topics["trades.A"].epoch
    assert seqs(await read(http, "trades.A", epoch=epoch, after=3)) == [4]
    # the reader's seq 3 belongs to a numbering that restarted: everything held comes back
    assert seqs(await read(http, "trades.A", epoch=epoch + 1, after=3)) == [1, 2, 3, 4]
    assert seqs(await read(http, "trades.A", epoch=0, after=3)) == [1, 2, 3, 4]


async def test_an_overrun_ring_moves_its_oldest(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    for i in range(1, 4):
        rubris.publish("trades.A", i)
    first = await read(http, "trades.A")
    assert seqs(first) == [1, 2, 3] and first["oldest"] == 1
    for i in range(4, 21):  # 20 published into a ring of 8: it holds 13..20
        rubris.publish("trades.A", i)
    body = await read(http, "trades.A", epoch=first["epoch"], after=3)
    assert body["head"] == 20 and body["oldest"] == 13
    # the reader at 3 sees for itself that 4..12 are gone: oldest > after + 1
    assert seqs(body) == list(range(13, 21))
    assert [m["data"] for m in body["messages"]] == list(range(13, 21))
    assert seqs(await read(http, "trades.A", after=15, limit=3)) == [16, 17, 18]


async def test_a_snapshot_holds_its_latest_value(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    body = await read(http, "status")
    assert body["mode"] == "snapshot" and body["head"] == 0 and body["oldest"] == 1
    assert body["messages"] == []
    assert "status" in rubris.engine.topics  # created empty, as a subscriber would
    for i in range(3):
        rubris.publish("status", {"state": i})
    body = await read(http, "status")
    assert body["head"] == 3 and body["oldest"] == 3
    assert body["messages"] == [{"seq": 3, "data": {"state": 2}}]
    assert (await read(http, "status", after=1))["messages"] == [{"seq": 3, "data": {"state": 2}}]
    assert (await read(http, "status", after=3))["messages"] == []


async def test_text_and_bytes_topics(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    rubris.publish("log", 'héllo "world"\n')
    rubris.publish("log", b"\xff not utf-8")  # bytes pass as they are, even on a text topic
    body = await read(http, "log")
    assert body["codec"] == "text"
    assert body["messages"] == [
        {"seq": 1, "data": 'héllo "world"\n'},
        {"seq": 2, "data": "\ufffd not utf-8"},
    ]
    blobs = [b"\x00\xff\x10", b"", bytes(range(256))]
    for blob in blobs:
        rubris.publish("blobs", blob)
    body = await read(http, "blobs")
    assert body["codec"] == "bytes"
    assert [base64.b64decode(m["data_b64"]) for m in body["messages"]] == blobs
    assert all("data" not in m for m in body["messages"])


async def test_raw_json_payloads_are_spliced(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    rubris.publish("trades.A", b'{"pre": "encoded", "n": [1, 2]}')
    rubris.publish("trades.A", b"")  # no JSON value at all: null, the answer stays JSON
    rubris.publish("trades.A", None)
    body = await read(http, "trades.A")
    assert [m["data"] for m in body["messages"]] == [{"pre": "encoded", "n": [1, 2]}, None, None]


async def test_compressed_payloads_are_inflated() -> None:
    async with make(compress_at=256) as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            big = {"rows": [{"symbol": "AAPL", "bid": 189.25, "n": i} for i in range(200)]}
            rubris.publish("trades.A", {"small": 1})
            rubris.publish("trades.A", big)
            rubris.publish("log", "line " * 2000)
            t = rubris.engine.topics["trades.A"]
            assert not t.ring[1][0] & COMPRESSED and t.ring[2][0] & COMPRESSED
            assert len(t.ring[2]) < len(orjson.dumps(big)) // 2
            body = await read(http, "trades.A")
            assert [m["data"] for m in body["messages"]] == [{"small": 1}, big]
            assert rubris.engine.topics["log"].ring[1][0] & COMPRESSED
            assert (await read(http, "log"))["messages"][0]["data"] == "line " * 2000


async def test_a_page_stops_at_the_body_limit() -> None:
    async with make(limits=Limits(api_body=2500)) as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            for i in range(6):
                rubris.publish("trades.A", {"i": i, "pad": "x" * 1000})
            body = await read(http, "trades.A")
            assert seqs(body) == [1, 2]  # the third would pass 2500 bytes of payload
            assert seqs(await read(http, "trades.A", after=2)) == [3, 4]
            for _ in range(2):
                rubris.publish("status", "y" * 5000)
            # one message always comes, however large: a reader never stalls on it
            assert seqs(await read(http, "status")) == [2]


async def test_a_name_with_slashes(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    rubris.publish("files.a/b.txt", "x")
    body = await read(http, "files.a/b.txt")
    assert body["topic"] == "files.a/b.txt" and body["messages"] == [{"seq": 1, "data": "x"}]


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("after=-1", "after"),
        ("after=x", "after"),
        ("after=1.5", "after"),
        ("after=", "after"),
        (f"after={2**64}", "after"),
        ("epoch=abc", "epoch"),
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
        ("limit=%EF%BC%91", "limit"),  # a full-width digit is not a digit here
    ],
)
async def test_bad_parameters_are_named(
    api: tuple[Rubris, httpx.AsyncClient], query: str, name: str
) -> None:
    _rubris, http = api
    r = await http.get(f"/api/topics/trades.A?{query}", headers=AUTH)
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(f"?{name}= must be an integer")
    assert r.json()["index"] is None and r.headers["rubris-fill"] == "0"


@pytest.mark.parametrize("name", ["nothing.here", "inbox", "jobs", "trades"])
async def test_only_shared_topics_can_be_read(
    api: tuple[Rubris, httpx.AsyncClient], name: str
) -> None:
    rubris, http = api
    r = await http.get(f"/api/topics/{name}", headers=AUTH)
    assert r.status_code == 404
    assert r.json() == {
        "error": f"no shared channel offers the topic {name!r}",
        "index": None,
        "fill": 0,
    }
    assert name not in rubris.engine.topics


async def test_credentials_and_the_hook() -> None:
    asked: list[tuple[str, str]] = []

    async def authorize(request: Any, topic: str) -> bool:
        asked.append((request.method, topic))
        if topic == "status":
            raise Reject("status is private to the desk")
        return topic.startswith("trades.") and request.headers.get("x-team") == "desk"

    async with make(api_token=TOKEN, authorize_api=authorize) as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                r = await http.get("/api/topics/trades.A", headers=headers)
                assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
                assert r.json()["error"] == "a valid bearer token is required"
            assert asked == []
            desk = {**AUTH, "x-team": "desk"}
            r = await http.get("/api/topics/trades.A", headers=desk)
            assert r.status_code == 200 and asked == [("GET", "trades.A")]
            r = await http.get("/api/topics/trades.A", headers=AUTH)
            assert r.status_code == 403 and r.json()["index"] is None
            r = await http.get("/api/topics/status", headers=desk)
            assert r.status_code == 403
            assert r.json()["error"] == "status is private to the desk"
            # refused before the name is looked up: a 403, not a 404, for a name nobody offers
            r = await http.get("/api/topics/inbox", headers=desk)
            assert r.status_code == 403
            assert "status" not in rubris.engine.topics


async def test_off_unless_configured_and_503_while_shutting_down() -> None:
    async with make(api_token=None) as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            assert (await http.get("/api/topics/trades.A")).status_code == 404
    rubris = make()
    await rubris.start()
    transport = httpx.ASGITransport(app=rubris)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        await rubris.drain()
        r = await http.get("/api/topics/trades.A", headers=AUTH)
        assert r.status_code == 503 and r.json()["error"] == "server shutting down"
    await rubris.stop()


async def test_too_many_topics_is_503() -> None:
    async with make(limits=Limits(max_topics=1)) as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            assert (await http.get("/api/topics/trades.A", headers=AUTH)).status_code == 200
            r = await http.get("/api/topics/trades.B", headers=AUTH)
            assert r.status_code == 503 and "too many topics" in r.json()["error"]

"""The HTTP API (protocol.md section 8b): answers, errors with nothing accepted, the fill."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from rubris_asgi import Codec, Config, Limits, Reject, Rubris, Session, Timing
from rubris_asgi.client import Client

from .server import run_server

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NDJSON = {"Content-Type": "application/x-ndjson", **AUTH}


def make(**kwargs: Any) -> Rubris:
    kwargs.setdefault("api_token", TOKEN)
    limits = kwargs.pop("limits", Limits())
    timing = Timing(poll_timeout=1.0, session_timeout=5.0)  # a waiting poll ends soon at exit
    rubris = Rubris(Config(limits=limits, timing=timing), **kwargs)

    @rubris.shared("prices.{symbol}", ring=256)
    async def prices(session: Session, symbol: str) -> None:
        return None

    @rubris.shared("status", snapshot=True)
    async def status(session: Session) -> None:
        return None

    @rubris.shared("log", ring=64, codec=Codec.TEXT)
    async def log(session: Session) -> None:
        return None

    @rubris.shared("blobs", ring=64, codec=Codec.BYTES)
    async def blobs(session: Session) -> None:
        return None

    @rubris.private("inbox")
    async def inbox(session: Session) -> None:
        return None

    return rubris


@pytest.fixture
async def api() -> AsyncIterator[tuple[Rubris, httpx.AsyncClient]]:
    async with make() as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            yield rubris, http


def ndjson(entries: list[Any]) -> bytes:
    return b"\n".join(orjson.dumps(e) for e in entries) + b"\n"


def pending(rubris: Rubris) -> int:
    return rubris.engine.intake.count + sum(t.seq for t in rubris.engine.topics.values())


async def test_publish_json_and_ndjson(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    r = await http.post("/api/publish", json={"topic": "prices.A", "data": {"p": 1}}, headers=AUTH)
    assert r.status_code == 200
    assert r.json() == {"accepted": 1, "duplicates": 0, "fill": 0}
    assert r.headers["rubris-fill"] == "0"
    entries = [{"topic": f"prices.S{i % 7}", "data": {"i": i}} for i in range(1000)]
    r = await http.post("/api/publish", content=ndjson(entries), headers=NDJSON)
    assert r.status_code == 200 and r.json()["accepted"] == 1000
    r = await http.post("/api/publish", json=entries[:10], headers=AUTH)
    assert r.json()["accepted"] == 10
    for _ in range(500):
        if rubris.engine.intake.count == 0:
            break
        await asyncio.sleep(0.005)
    t = rubris.engine.topics["prices.S3"]
    assert t.seq == len([e for e in entries if e["topic"] == "prices.S3"]) + 1  # +1 from the list
    assert rubris.stats().intake.accepted == 1011


async def test_codecs(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    ok = [
        {"topic": "log", "data": "a line"},
        {"topic": "blobs", "data_b64": base64.b64encode(b"\x00\xff").decode()},
        {"topic": "status", "data": None},
    ]
    r = await http.post("/api/publish", json=ok, headers=AUTH)
    assert r.status_code == 200, r.text
    bad = [
        ({"topic": "log", "data": 5}, "a text topic takes a string"),
        ({"topic": "blobs", "data": "x"}, "data_b64"),
        ({"topic": "blobs", "data_b64": "!!"}, "not valid base64"),
        ({"topic": "status", "data_b64": "AA=="}, "only for bytes topics"),
        ({"topic": "status"}, "no data"),
    ]
    for entry, reason in bad:
        r = await http.post("/api/publish", json=[ok[0], entry], headers=AUTH)
        assert r.status_code == 400 and reason in r.json()["error"], (entry, r.text)
        assert r.json()["index"] == 1


@pytest.mark.parametrize(
    ("body", "content_type", "status", "index", "reason"),
    [
        (b"{not json", "application/json", 400, None, "not JSON"),
        (b"[]", "application/json", 400, None, "non-empty list"),
        (b"5", "application/json", 400, None, "entry or a non-empty list"),
        (b'[{"topic":"prices.A","data":1}, 5]', "application/json", 400, 1, "must be an object"),
        (b'[{"topic":"prices.A","data":1,"id":"x"}]', "application/json", 400, 0, "unknown field"),
        (b'[{"topic":"","data":1}]', "application/json", 400, 0, "non-empty string"),
        (b'[{"topic":7,"data":1}]', "application/json", 400, 0, "non-empty string"),
        (b'[{"topic":"prices.A","data":1},{"topic":"nope","data":1}]', None, 404, 1, "nope"),
        (b'[{"topic":"inbox","data":1}]', "application/json", 404, 0, "no shared channel"),
        (b'{"topic":"prices.A","data":1}\n\n{bad\n', "application/x-ndjson", 400, 2, "line 2"),
        (b"\n\n", "application/x-ndjson", 400, None, "no entries"),
        (b'{"topic":"prices.A","data":1}', "text/plain", 415, None, "application/json"),
    ],
)
async def test_bad_requests_accept_nothing(
    api: tuple[Rubris, httpx.AsyncClient],
    body: bytes,
    content_type: str | None,
    status: int,
    index: int | None,
    reason: str,
) -> None:
    rubris, http = api
    headers = {"Content-Type": content_type or "application/json", **AUTH}
    r = await http.post("/api/publish", content=body, headers=headers)
    assert r.status_code == status, r.text
    answer = r.json()
    assert reason in answer["error"] and answer["index"] == index
    assert answer["fill"] == 0 and r.headers["rubris-fill"] == "0"
    assert pending(rubris) == 0  # nothing of the request was taken


async def test_message_over_the_maximum_is_refused_by_index(
    api: tuple[Rubris, httpx.AsyncClient],
) -> None:
    rubris, http = api
    huge = "x" * (rubris.engine.pool.config.block_size * rubris.engine.pool.config.max_scale)
    entries = [{"topic": "prices.A", "data": 1}, {"topic": "prices.A", "data": huge}]
    r = await http.post("/api/publish", json=entries, headers=AUTH)
    assert r.status_code == 400 and r.json()["index"] == 1
    assert "exceeds the maximum" in r.json()["error"]
    assert pending(rubris) == 0


async def test_credentials() -> None:
    async with make() as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            entry = {"topic": "prices.A", "data": 1}
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                r = await http.post("/api/publish", json=entry, headers=headers)
                assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
                assert "rubris-fill" in r.headers
            assert pending(rubris) == 0


async def test_the_api_is_off_unless_configured() -> None:
    async with make(api_token=None) as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            r = await http.post("/api/publish", json={"topic": "prices.A", "data": 1})
            assert r.status_code == 404


async def test_authorisation_hook_per_topic() -> None:
    asked: list[tuple[str, str | None]] = []

    async def authorize(request: Any, topic: str) -> bool:
        asked.append((topic, request.headers.get("x-team")))
        if topic == "$api":  # before the body is read: may this caller send one at all?
            return request.headers.get("x-team") is not None
        if topic == "status":
            raise Reject("status is read-only")
        return topic.startswith("prices.") and request.headers.get("x-team") == "pricing"

    async with make(api_token=None, authorize_api=authorize) as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            team = {"x-team": "pricing"}
            body = [{"topic": "prices.A", "data": i} for i in range(3)]
            r = await http.post("/api/publish", json=body, headers=team)
            assert r.status_code == 200
            # "$api" first, before the body; then once per topic of a request
            assert asked == [("$api", "pricing"), ("prices.A", "pricing")]
            r = await http.post("/api/publish", json=body, headers={"x-team": "other"})
            assert r.status_code == 403 and r.json()["index"] == 0
            r = await http.post("/api/publish", json=[*body, {"topic": "status", "data": 1}])
            assert r.status_code == 403
            r = await http.post(
                "/api/publish", json=[*body, {"topic": "status", "data": 1}], headers=team
            )
            assert r.status_code == 403 and r.json() == {
                "error": "status is read-only",
                "index": 3,
                "fill": r.json()["fill"],
            }
            await asyncio.sleep(0.05)
            assert rubris.engine.topics["prices.A"].seq == 3  # only the first request


async def test_body_limit() -> None:
    async with make(limits=Limits(api_body=1000)) as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            entries = [{"topic": "prices.A", "data": "x" * 50} for _ in range(30)]
            r = await http.post("/api/publish", content=ndjson(entries), headers=NDJSON)
            assert r.status_code == 413 and "1000 bytes" in r.json()["error"]

            async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
                for _ in range(30):
                    yield ndjson(entries[:1])

            r = await http.post("/api/publish", content=chunks(), headers=NDJSON)
            assert r.status_code == 413
            assert pending(rubris) == 0


async def test_a_full_intake_answers_429_and_takes_nothing() -> None:
    async with make(limits=Limits(intake_messages=1000)) as rubris:
        # the scheduler is stopped from draining: what is accepted stays in the intake
        rubris.engine.scheduler.intake = None
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            entries = [{"topic": "prices.A", "data": i} for i in range(300)]
            fills = []
            for _ in range(3):
                r = await http.post("/api/publish", content=ndjson(entries), headers=NDJSON)
                assert r.status_code == 200
                fills.append(r.json()["fill"])
            assert fills == [30, 60, 90]  # the fill rises under the flood
            r = await http.post("/api/publish", content=ndjson(entries), headers=NDJSON)
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert r.headers["rubris-fill"] == "90" and r.json()["fill"] == 90
            assert rubris.engine.intake.count == 900 and rubris.stats().intake.refused == 300
            r = await http.post("/api/publish", content=ndjson(entries[:100]), headers=NDJSON)
            assert r.status_code == 200 and r.json()["fill"] == 100
            # the cycle drains again: everything accepted reaches its topic, in order
            rubris.engine.scheduler.intake = rubris.engine.intake
            rubris.engine.scheduler.intake_pending()
            t = rubris.engine.topics["prices.A"]
            for _ in range(2000):
                if rubris.engine.intake.count == 0:
                    break
                await asyncio.sleep(0.001)
            assert t.seq == 1000


async def test_shutdown_refuses_with_503() -> None:
    rubris = make()
    await rubris.start()
    transport = httpx.ASGITransport(app=rubris)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        await rubris.drain()
        r = await http.post("/api/publish", json={"topic": "prices.A", "data": 1}, headers=AUTH)
        assert r.status_code == 503
    await rubris.stop()


@pytest.mark.parametrize("transport", ["websocket", "longpoll"])
async def test_published_over_http_reaches_subscribers_in_order(transport: str) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    rubris = make()
    app = Starlette(routes=[Mount("/rubris", rubris)], lifespan=rubris.lifespan)
    async with run_server(app) as base:
        async with Client(f"{base}/rubris", transport=transport) as client:
            sub = await client.subscribe("prices.A")
            entries = [{"topic": "prices.A", "data": {"i": i}} for i in range(200)]
            async with httpx.AsyncClient(base_url=base) as http:
                for chunk in (entries[:100], entries[100:]):
                    r = await http.post(
                        "/rubris/api/publish", content=ndjson(chunk), headers=NDJSON
                    )
                    assert r.status_code == 200
            got = []
            while len(got) < 200:
                value, info = await sub.get(timeout=10)
                got.append(value["i"])
            assert got == list(range(200))  # nothing lost, no GAP: the ring was never lapped
            assert sub.gaps == []

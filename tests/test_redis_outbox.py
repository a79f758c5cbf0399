"""The outbox toward Redis: its bound holds on every path, outside publishers never take the
application's share, and a Redis that refuses writes loses nothing (issue 35, item 3).

One node on a real ``redis-server``; Redis is held still by ``CLIENT PAUSE`` (every command
waits, none times out) while publishes arrive, so the outbox fills as it does when Redis is
slower than the publishers; or made to refuse writes by ``maxmemory`` under ``noeviction``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from rubris_asgi import BrokerUnavailable, Limits, Rubris
from rubris_asgi.cluster import RedisBroker

from .apps import make_rubris, starlette_app
from .rediskit import RedisServer, redis_server  # noqa: F401 (the fixture)
from .server import run_server

pytestmark = pytest.mark.redis

TOKEN = "secret"
OUTBOX = 200
SHARE = 0.25
TAKEN_MAX = OUTBOX - int(OUTBOX * SHARE)
"""What outside publishers' messages may fill of the outbox: 150."""


@pytest.fixture
def url(redis_server: RedisServer) -> str:  # noqa: F811 (the fixture)
    redis_server.flush()
    return redis_server.url


@contextlib.asynccontextmanager
async def node(url: str, **overrides: Any) -> AsyncIterator[tuple[Rubris, str, httpx.AsyncClient]]:
    broker = RedisBroker(url, outbox_messages=OUTBOX, app_share=SHARE)
    rubris = make_rubris(broker=broker, api_token=TOKEN, batches=False, **overrides)
    async with run_server(starlette_app(rubris)) as base:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=10) as http:
            yield rubris, base, http


async def head(r: Redis, topic: str) -> int:
    return int(await r.hget(f"rubris:t:{topic}", "s") or 0)


async def until(cond: Any, what: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if await cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not reached in {timeout} s: {what}")


def publish_body(topic: str, start: int, n: int) -> list[dict[str, Any]]:
    return [{"topic": topic, "data": i} for i in range(start, start + n)]


async def test_an_api_flood_while_redis_is_slow_never_passes_the_bound_nor_takes_the_apps_share(
    url: str,
) -> None:
    """Redis held still for 1.5 s while the API takes 1,000 messages in ten requests: the
    outbox holds at most its outside part (150) of them, the rest wait in the intake; the
    application's own 50 publishes meanwhile are all taken (its share), the 51st is refused
    saying truly why; afterwards every accepted message is numbered once."""
    async with node(url) as (rubris, _base, http), Redis.from_url(url) as r:
        assert await rubris.publish_async("ring.flood", -1) == 1  # the scripts are loaded
        assert await rubris.publish_async("ring.own", -1) == 1
        await r.execute_command("CLIENT", "PAUSE", 1500, "ALL")
        for k in range(10):
            answer = await http.post(
                "/rubris/api/publish", json=publish_body("ring.flood", k * 100, 100)
            )
            assert answer.status_code == 200, answer.text
        await asyncio.sleep(0.2)  # cycles ran: the intake moved what the outbox had room for
        st = rubris.stats()
        assert st.broker.pending == TAKEN_MAX, st.broker
        assert st.intake.pending == 1000 - TAKEN_MAX, st.intake
        for i in range(OUTBOX - TAKEN_MAX):
            rubris.publish("ring.own", i)  # never refused: the application's share
        with pytest.raises(
            BrokerUnavailable,
            match=rf"{OUTBOX} publishes wait to be sent to Redis.*outbox_messages={OUTBOX}",
        ):
            rubris.publish("ring.own", 999)
        assert rubris.stats().broker.pending == OUTBOX
        await until(
            lambda: _all_numbered(r, {"ring.flood": 1001, "ring.own": 51}), "all numbered", 15
        )
        st = rubris.stats()
        assert st.broker.pending_peak == OUTBOX and st.intake.pending == 0, st
        assert st.broker.numbered == 1000 + 50 + 2 and st.broker.refused == 1, st.broker


async def _all_numbered(r: Redis, heads: dict[str, int]) -> bool:
    return all([await head(r, t) == n for t, n in heads.items()])


async def test_a_full_intake_refuses_a_whole_request_with_429_and_its_fill(url: str) -> None:
    """The intake is what outside publishers fill while Redis is slow: once it cannot take a
    whole request, the API refuses all of it (429, Retry-After, Rubris-Fill), nothing taken;
    what it took is numbered once when Redis goes on."""
    limits = Limits(intake_messages=400)
    async with node(url, limits=limits) as (rubris, _base, http), Redis.from_url(url) as r:
        assert await rubris.publish_async("ring.flood", -1) == 1
        await r.execute_command("CLIENT", "PAUSE", 1500, "ALL")
        codes = []
        for k in range(8):
            answer = await http.post(
                "/rubris/api/publish", json=publish_body("ring.flood", k * 100, 100)
            )
            codes.append(answer.status_code)
            if answer.status_code != 200:
                assert answer.status_code == 429, answer.text
                assert answer.headers["Retry-After"] == "1"
                assert int(answer.headers["Rubris-Fill"]) >= 75
            await asyncio.sleep(0.05)
        accepted = codes.count(200)
        # the outbox's outside part (150) and the intake (400) hold 550: five requests
        assert accepted == 5, codes
        assert rubris.stats().broker.pending_peak <= TAKEN_MAX
        await until(lambda: _all_numbered(r, {"ring.flood": 1 + 100 * accepted}), "numbered", 15)
        assert rubris.stats().broker.numbered == 1 + 100 * accepted


async def test_a_redis_that_refuses_writes_loses_nothing_and_says_so() -> None:
    """``maxmemory`` reached under ``noeviction``: Redis refuses every write. What the node had
    accepted stays in its outbox and is numbered once Redis takes writes again; meanwhile each
    publish, API request and item is refused saying Redis refuses writes (not that it is away,
    nor a lie that it failed after all)."""
    with RedisServer(persist=True) as server:
        async with node(server.url) as (rubris, _base, http), Redis.from_url(server.url) as r:
            assert await rubris.publish_async("ring.oom", 0) == 1
            used = int((await r.info("memory"))["used_memory"])
            await r.config_set("maxmemory-policy", "noeviction")
            await r.config_set("maxmemory", used // 2)
            accepted = [0]
            for i in range(1, 40):  # the first ones are accepted before the refusal is seen
                try:
                    rubris.publish("ring.oom", i)
                    accepted.append(i)
                except BrokerUnavailable as exc:
                    assert "Redis refuses writes" in str(exc) and "maxmemory" in str(exc), exc
                await asyncio.sleep(0.02)
            assert len(accepted) < 40, "never refused"
            st = rubris.stats().broker
            assert not st.up and st.pending >= 1, st
            answer = await http.post("/rubris/api/publish", json=publish_body("ring.oom", 100, 3))
            assert answer.status_code == 503, answer.text
            assert "Redis refuses writes" in answer.json()["error"], answer.text
            with pytest.raises(BrokerUnavailable, match="Redis refuses writes"):
                await rubris.publish_async("ring.oom", 1000)
            await r.config_set("maxmemory", 0)
            await until(lambda: _all_numbered(r, {"ring.oom": len(accepted)}), "numbered", 10)
            await until(lambda: _up(rubris), "taking publishes again")
            assert await rubris.publish_async("ring.oom", 2000) == len(accepted) + 1
            # the ring of 8 in Redis: the newest, each accepted value once, numbered in order
            entries = [
                e.split(b":", 2) for e in reversed(await r.lrange("rubris:r:ring.oom", 0, -1))
            ]
            want = [*accepted, 2000][-8:]
            assert [int(p) for _, _, p in entries] == want, entries
            assert [int(s) for s, _, _ in entries] == list(
                range(len(accepted) + 2 - len(want), len(accepted) + 2)
            )


async def _up(rubris: Rubris) -> bool:
    return rubris.stats().broker.up

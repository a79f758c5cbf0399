"""Publishers outside the process against a real server: batching, pacing, retries, errors."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from rubris_asgi import Config, Limits, Rubris, Session, Timing
from rubris_asgi.client import Client
from rubris_asgi.client.publisher import Publisher, PublishError, SyncPublisher
from rubris_asgi.control.ratelimit import RateLimiter

from .server import run_server

TOKEN = "t0ken"


def make(intake: int = 100_000) -> Rubris:
    rubris = Rubris(
        Config(
            limits=Limits(intake_messages=intake),
            timing=Timing(poll_timeout=1.0, session_timeout=5.0),
        ),
        api_token=TOKEN,
    )

    @rubris.shared("ticks.{n}", ring=1024)
    async def ticks(session: Session, n: str) -> None:
        return None

    @rubris.shared("chat", ring=1024, client_publish=True)
    async def chat(session: Session) -> None:
        return None

    return rubris


@pytest.fixture
async def served() -> AsyncIterator[tuple[Rubris, str]]:
    rubris = make(intake=2000)
    app = Starlette(routes=[Mount("/rubris", rubris)], lifespan=rubris.lifespan)
    async with run_server(app) as base:
        yield rubris, f"{base}/rubris"


def hold_intake(rubris: Rubris) -> None:
    """Stop the cycle from draining the intake, as an overloaded server would."""
    rubris.engine.scheduler.intake = None


def release_intake(rubris: Rubris) -> None:
    rubris.engine.scheduler.intake = rubris.engine.intake
    rubris.engine.scheduler.intake_pending()


async def receive(sub: Any, n: int) -> list[Any]:
    got = []
    while len(got) < n:
        value, _info = await sub.get(timeout=10)
        got.append(value)
    return got


async def test_batches_arrive_in_order(served: tuple[Rubris, str]) -> None:
    rubris, url = served
    async with Client(url) as client:
        sub = await client.subscribe("ticks.1")
        async with Publisher(url, token=TOKEN, batch=500) as pub:
            await pub.publish_many(("ticks.1", i) for i in range(1800))
        assert pub.stats.accepted == 1800 and pub.stats.requests == 4  # 500, 500, 500, 300
        assert await receive(sub, 1800) == list(range(1800))


async def test_a_partial_batch_goes_after_linger(served: tuple[Rubris, str]) -> None:
    rubris, url = served
    async with Client(url) as client:
        sub = await client.subscribe("ticks.2")
        pub = Publisher(url, token=TOKEN, linger=0.02)
        try:
            await pub.publish("ticks.2", {"x": 1})
            value, _ = await sub.get(timeout=5)  # no flush: the linger timer sent it
            assert value == {"x": 1} and pub.stats.requests == 1
        finally:
            await pub.aclose()


async def test_429_is_retried_and_nothing_is_lost_or_doubled(served: tuple[Rubris, str]) -> None:
    rubris, url = served
    async with Client(url) as client:
        sub = await client.subscribe("ticks.3")
        hold_intake(rubris)
        loop = asyncio.get_running_loop()
        loop.call_later(0.5, release_intake, rubris)
        limiter = RateLimiter(floor=1_000_000.0)  # pacing off: only the 429s hold it back
        async with Publisher(url, token=TOKEN, batch=400, limiter=limiter) as pub:
            await pub.publish_many(("ticks.3", i) for i in range(4000))  # twice the intake
        assert pub.stats.refusals > 0 and pub.stats.retries >= pub.stats.refusals
        assert pub.stats.accepted == 4000
        assert await receive(sub, 4000) == list(range(4000))


async def test_the_publisher_slows_on_fill_and_recovers(served: tuple[Rubris, str]) -> None:
    rubris, url = served
    limiter = RateLimiter(initial=50_000.0, floor=100.0, step=0.05)
    hold_intake(rubris)
    async with Publisher(url, token=TOKEN, batch=200, limiter=limiter) as pub:
        for i in range(6):  # 1,200 of 2,000: the answers say 10 %, 20 %, ... 60 %
            await pub.publish_many(("ticks.4", i * 200 + j) for j in range(200))
        assert pub.stats.fill == 60
        slowed = limiter.rate
        assert slowed <= 25_000.0  # a fill >= 50 % halved it at least
        release_intake(rubris)
        await asyncio.sleep(0.6)  # the intake drains; the next answer says 0 %
        await pub.publish("ticks.4", "last")
        await pub.flush()
        assert pub.stats.fill < 50
        assert limiter.rate > slowed  # rising stepwise while the fill stays low
    assert limiter.stats.cuts >= 1


async def test_refusals_are_not_retried(served: tuple[Rubris, str]) -> None:
    rubris, url = served
    async with Publisher(url, token=TOKEN) as pub:
        await pub.publish("ticks.5", 1)
        await pub.publish("nowhere", 2)
        with pytest.raises(PublishError) as info:
            await pub.flush()
        assert info.value.status == 404 and info.value.index == 1
        assert pub.stats.retries == 0
    async with Publisher(url, token="wrong") as pub:
        await pub.publish("ticks.5", 1)
        with pytest.raises(PublishError) as info:
            await pub.flush()
        assert info.value.status == 401


async def test_connection_errors_are_retried_then_reported() -> None:
    pub = Publisher("http://127.0.0.1:9/rubris", token=TOKEN, retry_for=0.3)
    await pub.publish("ticks.1", 1)
    with pytest.raises(PublishError) as info:
        await pub.flush()
    assert info.value.status == 0 and "within 0.3 s" in str(info.value)
    assert pub.stats.retries >= 1
    await pub._http.aclose()


async def test_sync_publisher_from_a_thread(served: tuple[Rubris, str]) -> None:
    rubris, url = served
    async with Client(url) as client:
        sub = await client.subscribe("ticks.6")
        errors: list[BaseException] = []

        def work() -> None:
            try:
                with SyncPublisher(url, token=TOKEN, batch=100) as pub:
                    pub.publish_many(("ticks.6", i) for i in range(250))
                    pub.flush()
                    pub.publish("ticks.6", b"\x00raw")  # bytes go as data_b64 ...
            except PublishError as exc:  # ... which a JSON topic refuses, by index
                errors.append(exc)

        thread = threading.Thread(target=work)
        thread.start()
        await asyncio.to_thread(thread.join)
        assert [e.status for e in errors if isinstance(e, PublishError)] == [400]
        assert await receive(sub, 250) == list(range(250))


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["websocket", "longpoll"])
async def test_a_publishing_client_gets_flow_and_slows(transport: str) -> None:
    rubris = make(intake=100)
    app = Starlette(routes=[Mount("/rubris", rubris)], lifespan=rubris.lifespan)
    async with run_server(app) as base:
        async with Client(f"{base}/rubris", transport=transport) as client:
            hold_intake(rubris)
            for i in range(60):
                await client.publish("chat", {"i": i})
            for _ in range(200):
                if client.stats.flow:
                    break
                await asyncio.sleep(0.01)
            assert client.stats.flow >= 50  # FLOW reached the publishing session
            assert client.publish_limiter.rate <= 500_000.0  # halved from 1,000,000/s
            assert client.publish_limiter.stats.cuts == 1
            release_intake(rubris)
            for _ in range(300):
                if client.stats.flow and client.stats.flow < 50:
                    break
                await asyncio.sleep(0.01)
            assert client.stats.flow < 50  # and the all-clear once it drained
            assert rubris.engine.topics["chat"].seq == 60

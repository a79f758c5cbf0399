"""Prometheus metrics and the ops endpoints after a scripted run on a real server.

The run: a WebSocket subscriber that reads, a long-poll subscriber that does not poll while its
ring is lapped (a GAP), a subscribe to an unknown topic (REJECTED 3), a NAK, and a client that
stops reading (blocked writes, penalties, then GOODBYE 7). The scrape must name all of it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.routing import Mount, Route

from rubris_asgi import Codec, Config, Rubris, Session, Timing, WriterConfig
from rubris_asgi.ops.metrics import Metrics
from rubris_asgi.protocol import (
    Gap,
    Hello,
    Nak,
    Push,
    Rejected,
    Subscribe,
    encode_frame,
)
from tests.server import run_server
from tests.wirekit import (
    lp_collect,
    lp_hello,
    raw_ws_handshake,
    recv_until,
    until,
    ws_client_frame,
    ws_hello,
    ws_open,
)

TOKEN = "s3cret"
MAX_BLOCKED = 0.6


def make_app(**kw: Any) -> tuple[Starlette, Rubris]:
    rubris = Rubris(
        Config(
            writer=WriterConfig(max_blocked=MAX_BLOCKED),
            timing=Timing(session_timeout=5.0, poll_timeout=1.0),
        ),
        api_token=TOKEN,
        batches=False,
        **kw,
    )

    @rubris.shared("ring.{name}", ring=4)
    async def ring(session: Session, name: str) -> None:
        return None

    @rubris.shared("fat", ring=64, codec=Codec.BYTES, compress_at=None)
    async def fat(session: Session) -> None:
        return None

    app = Starlette(
        routes=[Route("/metrics", Metrics(rubris)), Mount("/rubris", rubris)],
        lifespan=rubris.lifespan,
    )
    return app, rubris


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample by (name, labels without ``worker``)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "worker"))
            out[(s.name, labels)] = s.value
    return out


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.mark.slow
async def test_a_scripted_run_shows_in_the_metrics() -> None:
    app, rubris = make_app()
    async with run_server(app) as base:
        port = int(base.rsplit(":", 1)[1])
        async with (
            await ws_open(base) as ws,
            httpx.AsyncClient(base_url=base + "/rubris") as lp,
            httpx.AsyncClient(base_url=base) as http,
        ):
            await ws_hello(ws, Subscribe(1, "ring.a", 0, 0, b""), Subscribe(2, "nope", 0, 0, b""))
            await recv_until(ws, lambda m: isinstance(m, Rejected))
            welcome = await lp_hello(lp, Subscribe(1, "ring.b", 0, 0, b""))
            topics = rubris.engine.topics
            await until(lambda: "ring.b" in topics and len(topics["ring.b"].subs) == 1)
            # the long-poll client is not polling: ten publishes lap its ring of four
            for i in range(10):
                rubris.publish("ring.b", i)
            rubris.publish("ring.a", "hello")
            await recv_until(ws, lambda m: isinstance(m, Push))
            gap = await lp_collect(lp, welcome.session, lambda m: isinstance(m, Gap))
            assert isinstance(gap, Gap)
            await ws.send(encode_frame([Nak(75)]))
            await until(lambda: rubris.engine.telemetry.naks == 1)

            # a client that stops reading: blocked writes, penalties, then GOODBYE 7
            stalled, status, _ = await raw_ws_handshake(port, rcvbuf=4096)
            assert status == 101
            hello = encode_frame([Hello(1, ""), Subscribe(1, "fat", 0, 0, b"")])
            await asyncio.get_running_loop().sock_sendall(stalled, ws_client_frame(hello))
            await until(lambda: "fat" in topics and len(topics["fat"].subs) == 1)
            tel = rubris.engine.telemetry
            loop = asyncio.get_running_loop()
            drained = False
            for _ in range(400):
                if tel.closed_blocked:
                    break
                rubris.publish("fat", b"x" * 65536)
                await asyncio.sleep(0.01)
                if tel.blocked_writes and not drained:
                    # read a little, once, late: that write completes after blocked_after (a
                    # failed send and its penalty); then the client stops for good
                    await asyncio.sleep(0.1)
                    drained = True
                    deadline = loop.time() + 2
                    while not tel.failed_sends and loop.time() < deadline:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(loop.sock_recv(stalled, 65536), 0.05)
            await until(lambda: tel.closed_blocked == 1, timeout=MAX_BLOCKED + 2)
            stalled.close()

            r = await http.get("/metrics")
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/plain")
            m = scrape(r.text)

        # sessions: the WebSocket, the long-poll one (the stalled one has ended)
        assert value(m, "rubris_sessions", transport="websocket", state="connected") == 1
        assert value(m, "rubris_sessions", transport="longpoll", state="connected") == 1
        assert value(m, "rubris_sessions_opened_total") == 3
        assert value(m, "rubris_subscriptions", kind="shared") == 2
        assert value(m, "rubris_topics", kind="shared") == 3
        # deliveries: at least the ring message, the GAP, the SUBSCRIBED and REJECTED answers
        assert value(m, "rubris_published_messages_total") >= 11
        assert value(m, "rubris_messages_delivered_total") >= 4
        assert value(m, "rubris_frames_total") >= 3
        assert value(m, "rubris_sent_bytes_total") > 65536
        assert value(m, "rubris_gaps_total") == 1
        assert value(m, "rubris_errors_total", kind="rejected", code="3") == 1
        assert value(m, "rubris_naks_received_total") == 1
        assert value(m, "rubris_sessions_paced") in (0, 1)  # present; the NAK pacing ends in ~0.2 s
        # the stalled client
        assert value(m, "rubris_blocked_writes_total") >= 1
        assert value(m, "rubris_failed_sends_total") >= 1
        assert value(m, "rubris_penalty_seconds_total") > 0
        assert value(m, "rubris_slow_consumer_closes_total", reason="blocked") == 1
        assert value(m, "rubris_slow_consumer_closes_total", reason="backlog") == 0
        assert value(m, "rubris_errors_total", kind="goodbye", code="7") == 1
        # pool, intake, histograms
        assert value(m, "rubris_pool_leases_limit", size_class="block") == 4096
        assert value(m, "rubris_pool_leases_total", size_class="block") >= 3
        assert value(m, "rubris_intake_fill_ratio") == 0
        cycles = value(m, "rubris_cycles_total")
        assert value(m, "rubris_cycle_duration_seconds_count") == cycles
        assert value(m, "rubris_cycle_duration_seconds_bucket", le="+Inf") == cycles
        lat = value(m, "rubris_publish_to_frame_seconds_count")
        assert lat >= 2  # the ring.a message and the fat ones that went out
        assert value(m, "rubris_publish_to_frame_seconds_bucket", le="+Inf") == lat
        # one worker, labelled
        assert sum(1 for (name, _l) in m if name == "rubris_worker_info") == 1


async def test_queue_metrics_and_intake() -> None:
    rubris = Rubris(api_token=TOKEN, batches=False)

    @rubris.queue("jobs", prefetch=1)
    async def jobs(session: Session) -> None:
        return None

    @rubris.shared("news", ring=16)
    async def news(session: Session) -> None:
        return None

    app = Starlette(
        routes=[Route("/metrics", Metrics(rubris, registry=False)), Mount("/rubris", rubris)],
        lifespan=rubris.lifespan,
    )
    async with run_server(app) as base, httpx.AsyncClient(base_url=base) as http:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        r = await http.post(
            "/rubris/api/enqueue",
            json=[{"topic": "jobs", "data": i} for i in range(3)],
            headers=auth,
        )
        assert r.status_code == 200, r.text
        r = await http.post("/rubris/api/publish", json={"topic": "news", "data": 1}, headers=auth)
        assert r.status_code == 200, r.text
        r = await http.post("/rubris/api/publish", json={"topic": "nope", "data": 1}, headers=auth)
        assert r.status_code == 404
        await until(lambda: rubris.engine.intake.stats.published == 1)
        m = scrape((await http.get("/metrics")).text)
    assert value(m, "rubris_queue_enqueued_total", queue="jobs") == 3
    assert value(m, "rubris_queue_depth", queue="jobs") == 3
    assert value(m, "rubris_queue_unacked", queue="jobs") == 0
    assert value(m, "rubris_queue_consumers", queue="jobs") == 0
    assert value(m, "rubris_intake_accepted_total") == 1
    assert value(m, "rubris_api_refusals_total", status="404") == 1
    # registry=False: rubris' metrics alone, no process metrics of the default registry
    assert not any(name.startswith("process_") for name, _l in m)


async def test_the_default_registry_comes_along_with_one_worker() -> None:
    app, _rubris = make_app()
    async with run_server(app) as base, httpx.AsyncClient(base_url=base) as http:
        r = await http.get("/metrics")
        openmetrics = await http.get(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        post = await http.post("/metrics")
    names = {f.name for f in text_string_to_metric_families(r.text)}
    assert "process_cpu_seconds" in names or "python_info" in names
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.rstrip().endswith("# EOF")
    assert post.status_code == 405


def _basic(user: str, password: str) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


async def test_the_ops_page_and_stats_refuse_without_authorisation() -> None:
    app, rubris = make_app(ops=True)
    async with run_server(app) as base, httpx.AsyncClient(base_url=base + "/rubris") as http:
        for path in ("/ops", "/ops/stats", "/ops/ops.js"):
            r = await http.get(path)
            assert r.status_code == 401, path
            assert r.headers["www-authenticate"] == 'Basic realm="rubris ops"'
            assert (
                await http.get(path, headers={"Authorization": "Bearer wrong"})
            ).status_code == 401
            assert (await http.get(path, headers=_basic("ops", "wrong"))).status_code == 401
            assert (await http.get(path, headers=_basic("x", TOKEN))).status_code == 200, path
        page = await http.get("/ops", headers=_basic("ops", TOKEN))
        assert '<script type="module" src="/rubris/ops/ops.js">' in page.text
        r = await http.get("/ops/stats", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
        assert r.headers["cache-control"] == "no-store"
        body = orjson.loads(r.content)
        [worker] = body["workers"]
        assert worker["self"] is True
        # what the Errors table shows (api_refusals): the wrong token and the wrong password
        # of each path, not the 401 without credentials that every browser visit starts with
        # (it brings up the login prompt)
        assert rubris.engine.telemetry.api_refusals == {401: 6}
        assert set(worker) >= {
            "worker",
            "sessions",
            "counters",
            "gauges",
            "pool",
            "histograms",
            "errors",
            "topics_busiest",
            "queues",
            "slowest",
        }


async def test_the_ops_page_asks_the_authorisation_hook() -> None:
    asked: list[str] = []

    def authorize(request: Any, name: str) -> bool:
        asked.append(name)
        return request.headers.get("x-role") == "ops"

    rubris = Rubris(authorize_api=authorize, ops=True, batches=False)
    app = Starlette(routes=[Mount("/rubris", rubris)], lifespan=rubris.lifespan)
    async with run_server(app) as base, httpx.AsyncClient(base_url=base + "/rubris") as http:
        assert (await http.get("/ops/stats")).status_code == 403
        assert (await http.get("/ops/stats", headers={"x-role": "ops"})).status_code == 200
    assert asked == ["$ops", "$ops"]
    # the hook's refusal is counted, though the request sent no Authorization: only a 401
    # asks a browser for credentials
    assert rubris.engine.telemetry.api_refusals == {403: 1}


async def test_ops_is_off_by_default_and_needs_authorisation() -> None:
    app, _rubris = make_app()
    async with run_server(app) as base, httpx.AsyncClient(base_url=base + "/rubris") as http:
        r = await http.get("/ops/stats", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 404
    with pytest.raises(ValueError, match="api_token or authorize_api"):
        Rubris(ops=True)


def test_importing_rubris_loads_no_prometheus() -> None:
    import subprocess
    import sys

    code = "import sys, rubris_asgi; print('prometheus_client' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

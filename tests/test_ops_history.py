"""The ops page's figures that issue 27 (item 7) was about: publish to frame by transport, and
the server's history of the page's last five minutes.

Publish to frame: a long-poll session can be sent a frame only while one of its polls waits,
with one message of each topic per frame, so its messages also wait for the client's polls;
that figure is kept apart from WebSocket's, with the server's part of it beside it. Sans-IO,
with a fake clock: every latency is exact.

History: the ring of samples (an injected clock), what a sample holds, the endpoint that serves
it (a real server, no page ever open), and several workers sharing a directory.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from rubris_asgi import Rubris, Session
from rubris_asgi.engine.buffers import FrameBuffer
from rubris_asgi.engine.engine import Engine
from rubris_asgi.engine.telemetry import HISTOGRAMS
from rubris_asgi.ops.history import SPAN, TOP, History
from rubris_asgi.ops.observer import Observer
from rubris_asgi.ops.workers import WorkerBoard
from rubris_asgi.protocol import Mode, Subscribe
from tests.enginekit import FakeClock, connect
from tests.netkit import free_port, stop_process
from tests.server import run_server
from tests.wirekit import ws_hello, ws_open
from tests.workers_app import TOKEN as WORKERS_TOKEN

TOKEN = "hist-token"


class Wall:
    """An injected wall clock."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# publish to frame, by transport


class PollSink:
    """A long-poll session's transport as the engine sees it: a frame goes out only while a
    poll waits (``poll``), and ``last_seen`` is when that poll came (server/longpoll.py)."""

    def __init__(self, engine: Engine, s: Session) -> None:
        self.engine = engine
        self.session = s
        self.frames: list[bytes] = []
        self.last_seen = 0.0
        self.writing_since = 0.0  # FrameSink's: a poll takes its frame at once

    def poll(self) -> None:
        self.last_seen = self.engine.clock()
        self.engine.set_ready(self.session)

    def write_now(self, frame: bytes) -> bool:
        return False

    def send_frame(self, frame: bytes, lease: FrameBuffer) -> None:
        self.frames.append(frame)
        self.engine.pool.release(lease)  # answered; not ready until the client polls again

    def superseded(self) -> None:
        return None


def _longpoll(e: Engine) -> tuple[Session, PollSink]:
    s = e.open_session()
    s.transport = "longpoll"
    sink = PollSink(e, s)
    e.attach(s, sink, ready=False)
    return s, sink


def test_long_poll_waits_for_its_polls_and_is_measured_apart() -> None:
    clock = FakeClock()
    e = Engine(clock=clock)
    t = e.topic("ticks", Mode.RING, ring=64)
    ws, _ = connect(e)
    lp, sink = _longpoll(e)
    e.subscribe(ws, t, 1, 0, 0)
    e.subscribe(lp, t, 1, 0, 0)
    sink.poll()
    e.scheduler.run_cycle()  # SUBSCRIBED to both
    e.publish(t, 1)
    clock.advance(0.002)
    e.scheduler.run_cycle()  # the WebSocket session has it 2 ms after the publish
    clock.advance(1.5)  # the long-poll client comes back 1.5 s later
    sink.poll()
    clock.advance(0.003)
    e.scheduler.run_cycle()
    tel = e.telemetry
    assert (tel.latency.count, tel.latency.sum) == (1, pytest.approx(0.002))
    assert (tel.longpoll.count, tel.longpoll.sum) == (1, pytest.approx(1.505))
    # the server's part: from the poll's arrival (after the publish) to the frame
    assert (tel.longpoll_ready.count, tel.longpoll_ready.sum) == (1, pytest.approx(0.003))


def test_a_topic_faster_than_the_polls_queues_up_one_message_per_frame() -> None:
    """The cause of the demo's p99 in seconds: three trades a poll, one per frame."""
    clock = FakeClock()
    e = Engine(clock=clock)
    t = e.topic("trades", Mode.RING, ring=4096)
    lp, sink = _longpoll(e)
    e.subscribe(lp, t, 1, 0, 0)
    sink.poll()
    e.scheduler.run_cycle()  # SUBSCRIBED
    tel = e.telemetry
    waits = []
    for _ in range(10):  # the client polls every 200 ms; three trades come meanwhile
        for _ in range(3):
            clock.advance(0.2 / 3)
            e.publish(t, "trade")
        sink.poll()
        before = tel.longpoll.sum
        e.scheduler.run_cycle()
        waits.append(tel.longpoll.sum - before)
    assert len(sink.frames) == 11 and t.seq == 30
    # frame j took trade j, published at j/15 s and sent at the j-th poll (0.2 j s): the wait
    # grows by 133 ms a poll, without end, while the backlog grows by two trades a poll
    assert waits == pytest.approx([j * (0.2 - 0.2 / 3) for j in range(1, 11)])
    assert t.seq - 10 == 20
    # while the server answered every poll at once
    assert tel.longpoll_ready.sum == pytest.approx(0.0)
    assert tel.latency.count == 0


# the history ring


def _engine() -> tuple[Engine, FakeClock]:
    clock = FakeClock()
    return Engine(clock=clock), clock


def test_the_ring_keeps_five_minutes_and_drops_the_oldest() -> None:
    e, _ = _engine()
    wall = Wall()
    h = History(e, "host:1", wall=wall)
    assert h.samples.maxlen == 300 and SPAN == 300.0
    for _ in range(400):
        h.sample()
        wall.now += 1.0
    assert len(h.samples) == 300
    first = orjson.loads(h.samples[0][1])
    assert first["time"] == pytest.approx(1_700_000_000.0 + 100)  # the first 100 are gone
    last = wall.now - 1.0
    assert len(h.recent(last)) == 300
    # a worker whose loop was held up: what it holds is older than the last five minutes
    wall.now = last + 200
    assert len(h.recent()) == 100
    times = [at for at, _ in h.recent()]
    assert times == sorted(times) == [orjson.loads(data)["time"] for _, data in h.recent()]
    # the memory: the JSON bytes of each sample, about 0.7 kB for an engine with nothing in it
    assert 300 * 500 < h.nbytes < 300 * 1000


def test_a_sample_holds_what_the_charts_draw() -> None:
    e, clock = _engine()
    wall = Wall()
    h = History(e, "host:1", wall=wall)
    t = e.topic("ticks", Mode.RING)
    quiet = e.topic("quiet", Mode.SNAPSHOT)
    s, _ = connect(e)
    e.subscribe(s, t, 1, 0, 0)
    e.publish(quiet, 0)
    e.scheduler.run_cycle()
    first = orjson.loads(h.sample())
    assert first["topics_busiest"] == []  # no rates before a second sample
    for i in range(5):
        e.publish(t, i)
        clock.advance(0.01)
        e.scheduler.run_cycle()
    wall.now += 2.0
    second = orjson.loads(h.sample())
    assert second["worker"] == "host:1"
    assert second["time"] - first["time"] == pytest.approx(2.0)
    assert second["topics_busiest"] == [{"name": "ticks", "rate": 2.5}]  # 5 in 2 s
    counters = second["counters"]
    assert counters["published_messages"] - first["counters"]["published_messages"] == 5
    assert counters["messages_delivered"] == e.scheduler.stats.messages
    assert counters["cycles"] == e.scheduler.stats.cycles
    tel = e.telemetry
    assert set(second["histograms"]) == set(HISTOGRAMS)
    assert second["histograms"]["publish_to_frame_seconds"] == tel.latency.counts
    assert sum(second["histograms"]["publish_to_frame_seconds"]) == 5
    assert second["sessions"]["websocket"] == {"connected": 1, "detached": 0, "closing": 0}
    assert second["sessions"]["longpoll"] == {"connected": 0, "detached": 0, "closing": 0}
    assert second["pool"]["block"]["limit"] == e.config.pool.blocks
    assert second["gauges"] == {"intake_fill_ratio": 0.0}
    bounds = h.bounds()
    for name, counts in second["histograms"].items():
        assert len(counts) == len(bounds[name]) + 1, name


def test_a_sample_keeps_only_the_busiest_topics() -> None:
    e, _ = _engine()
    wall = Wall()
    h = History(e, "host:1", wall=wall)
    topics = [e.topic(f"t{i:02}", Mode.RING) for i in range(TOP + 5)]
    h.sample()
    for i, t in enumerate(topics):
        for _ in range(i + 1):
            e.publish(t, "x")
    wall.now += 1.0
    busiest = orjson.loads(h.sample())["topics_busiest"]
    assert [b["name"] for b in busiest] == [f"t{i:02}" for i in range(TOP + 4, 4, -1)]


# the endpoint


def _app() -> tuple[Starlette, Rubris]:
    rubris = Rubris(api_token=TOKEN, ops=True, batches=False)

    @rubris.shared("ticks", ring=64)
    async def ticks(session: Session) -> None:
        return None

    app = Starlette(routes=[Mount("/rubris", rubris)], lifespan=rubris.lifespan)
    return app, rubris


@pytest.mark.slow
async def test_the_stats_endpoint_serves_the_history_taken_without_a_page() -> None:
    app, rubris = _app()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with run_server(app) as base, httpx.AsyncClient(base_url=base + "/rubris") as http:
        for i in range(30):  # no request meanwhile: the server samples on its own
            rubris.publish("ticks", {"i": i})
            await asyncio.sleep(0.1)
        r = await http.get("/ops/stats?history=1", headers=auth)
        assert r.status_code == 200
        body = orjson.loads(r.content)
        history = body["history"]
        assert history["interval"] == 1.0 and history["span"] == 300.0
        samples = history["samples"]
        assert len(samples) >= 2
        [worker] = body["workers"]
        assert {s["worker"] for s in samples} == {worker["worker"]}
        times = [s["time"] for s in samples]
        assert times == sorted(times) and times[-1] <= body["time"] + 1.0
        assert samples[-1]["counters"]["published_messages"] >= 10
        for name, bounds in history["bounds"].items():
            assert bounds == worker["histograms"][name]["bounds"]
            assert len(samples[-1]["histograms"][name]) == len(bounds) + 1
        # the live polls do not carry it
        plain = orjson.loads((await http.get("/ops/stats", headers=auth)).content)
        assert "history" not in plain
        # behind the same authorisation as the page
        assert (await http.get("/ops/stats?history=1")).status_code == 401
        basic = base64.b64encode(f"ops:{TOKEN}".encode()).decode()
        r = await http.get("/ops/stats?history=1", headers={"Authorization": f"Basic {basic}"})
        assert r.status_code == 200 and orjson.loads(r.content)["history"]["samples"]


def test_without_the_ops_page_nothing_is_sampled() -> None:
    rubris = Rubris(api_token=TOKEN, batches=False)
    assert rubris.board.history is None and not rubris.board.running


# several workers


def _board(directory: Path, pid: int, wall: Wall, span: float = SPAN) -> WorkerBoard:
    """A worker of its own (engine, observer, board) that says its pid is ``pid``."""
    e, _ = _engine()
    observer = Observer(e, wall=wall)
    observer.pid = pid
    observer.worker = f"{observer.host}:{pid}"
    board = WorkerBoard(observer, directory, history=True)
    assert board.history is not None
    board.history = History(e, observer.worker, span=span, wall=wall)
    return board


def test_every_worker_history_is_served_by_whichever_answers(tmp_path: Path) -> None:
    wall = Wall()
    a = _board(tmp_path, 10_001, wall)
    b = _board(tmp_path, 10_002, wall)
    for _ in range(5):
        a.tick()
        wall.now += 0.4  # the workers sample out of step
        b.tick()
        wall.now += 0.6
    snaps = a.snapshots()
    assert [s["worker"] for s in snaps] == [a.observer.worker, b.observer.worker]
    history = a.histories(snaps)
    assert history is not None
    samples: list[Any] = [orjson.loads(orjson.dumps(s)) for s in history["samples"]]
    by_worker = [s["worker"] for s in samples]
    assert by_worker.count(a.observer.worker) == 5 and by_worker.count(b.observer.worker) == 5
    times = [s["time"] for s in samples]
    assert times == sorted(times)  # one timeline, as the page replays it
    # a worker gone (its snapshot file removed) is not served, nor its history
    b.close()
    history = a.histories(a.snapshots())
    assert history is not None
    assert {s["worker"] for s in orjson.loads(orjson.dumps(history["samples"]))} == {
        a.observer.worker
    }
    a.close()
    assert list(tmp_path.iterdir()) == []


def test_the_history_file_stays_bounded(tmp_path: Path) -> None:
    wall = Wall()
    a = _board(tmp_path, 10_003, wall, span=5.0)
    assert a.history is not None and a.history_path is not None
    for n in range(1, 24):
        a.tick()
        wall.now += 1.0
        lines = a.history_path.read_bytes().splitlines()
        assert len(lines) <= 10, n
    # right after a rewrite it is the ring itself
    assert [orjson.loads(x) for x in lines[-5:]] == [
        orjson.loads(data) for _, data in a.history.samples
    ]
    a.close()


@pytest.mark.slow
async def test_two_uvicorn_workers_serve_one_history_that_adds_up(tmp_path: Path) -> None:
    """``uvicorn --workers 2`` (tests/workers_app.py): whichever worker answers serves both
    workers' samples, and a second's samples add up to the sessions the live figures count."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stats = tmp_path / "stats"
    env = {**os.environ, "RUBRIS_STATS_DIR": str(stats)}
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "uvicorn", "tests.workers_app:app", "--workers", "2"],
        *["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        *["--no-access-log", "--ws-per-message-deflate", "false"],
        env=env,
        stdin=subprocess.DEVNULL,
    )
    auth = {"Authorization": f"Bearer {WORKERS_TOKEN}"}
    sockets = []
    try:
        fresh = httpx.Limits(max_keepalive_connections=0)  # a new connection, any worker
        async with httpx.AsyncClient(base_url=base, limits=fresh, timeout=5) as http:
            for _ in range(300):
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/rubris/ops/stats", headers=auth)).status_code == 200:
                        if len(list(stats.glob("history-*.jsonl"))) == 2:
                            break
                await asyncio.sleep(0.1)
            assert len(list(stats.glob("history-*.jsonl"))) == 2, "two workers did not start"
            for _ in range(8):
                ws = await ws_open(base)
                await ws_hello(ws, Subscribe(1, "ticks", 0, 0, b""))
                sockets.append(ws)
            await asyncio.sleep(3.5)  # three samples of each worker with every session open
            answered = set()
            for _ in range(20):  # until each worker has answered (the kernel picks)
                if len(answered) == 2:
                    break
                body = orjson.loads(
                    (await http.get("/rubris/ops/stats?history=1", headers=auth)).content
                )
                workers = [w["worker"] for w in body["workers"]]
                answered.add(workers[0])
                samples = body["history"]["samples"]
                assert {x["worker"] for x in samples} == set(workers)
                live = sum(w["sessions"]["websocket"]["connected"] for w in body["workers"])
                latest = {x["worker"]: x for x in samples}  # oldest first: the last one wins
                sampled = sum(x["sessions"]["websocket"]["connected"] for x in latest.values())
                assert live == sampled == 8
    finally:
        for ws in sockets:
            with contextlib.suppress(Exception):
                await ws.close()
        await stop_process(proc)
    # a worker that stops takes its history file with it
    assert list(stats.glob("history-*")) == []

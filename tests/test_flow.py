"""Pacing rules with a fake clock: the blocked-writer penalty (seed 001) and NAK rate control.

Everything here is deterministic: the clock only moves when a test moves it, so the assertions
are exact arithmetic, not timings.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rubris_asgi import Config, FlowConfig, Rubris, Timing, WriterConfig
from rubris_asgi.engine.engine import Engine
from rubris_asgi.engine.flow import current_interval, nak_strength, on_nak, on_write_done
from rubris_asgi.engine.session import Session, SessionState
from rubris_asgi.protocol import Hello, Mode, Nak, Push, decode_frame
from rubris_asgi.server.websocket import WebSocketConnection

from .enginekit import FakeClock, RecordingSink, connect

W = WriterConfig(slot=0.010, blocked_writer_scaler=1, failed_send_reset=1.0, blocked_after=0.050)
F = FlowConfig(base_interval=0.010, window=0.050, recover_step=0.100)


def session() -> Session:
    return Session("s", "s.t")


# --------------------------------------------------------------------- blocked-writer penalty


def test_a_fast_write_is_not_a_failed_send() -> None:
    s = session()
    assert on_write_done(s, started=10.0, now=10.049, cfg=W) == 0.0
    assert s.failed_sends == 0


def test_penalty_grows_one_slot_per_blocked_write() -> None:
    s = session()
    now = 10.0
    pauses = []
    for _ in range(5):
        pauses.append(on_write_done(s, started=now, now=now + 0.1, cfg=W))
        now += 0.2  # blocked writes 0.2 s apart: well inside the 1 s reset time
    assert s.failed_sends == 5
    assert pauses == pytest.approx([0.010, 0.020, 0.030, 0.040, 0.050])


def test_penalty_with_a_scaler_steps_every_nth_blocked_write() -> None:
    """(failed_sends / scaler) x slot, in whole steps: one more slot every nth blocked write."""
    cfg = WriterConfig(slot=0.010, blocked_writer_scaler=3, failed_send_reset=1.0)
    s = session()
    pauses = [on_write_done(s, 0.0 + i * 0.1, 0.06 + i * 0.1, cfg) for i in range(7)]
    assert pauses == pytest.approx([0.0, 0.0, 0.010, 0.010, 0.010, 0.020, 0.020])


def test_failed_count_resets_after_the_reset_time_without_blocked_writes() -> None:
    s = session()
    on_write_done(s, 10.0, 10.1, W)
    on_write_done(s, 10.2, 10.3, W)
    assert s.failed_sends == 2
    # the next blocked write ends 1.0 s after the last: not yet "longer than" the reset time
    assert on_write_done(s, 11.2, 11.3, W) == pytest.approx(0.030)
    # the gap is now 1.01 s > 1.0 s: the count starts again
    assert on_write_done(s, 12.21, 12.31, W) == pytest.approx(0.010)
    assert s.failed_sends == 1
    assert s.last_failed == 12.31


def test_fast_writes_between_blocked_ones_do_not_reset_the_count() -> None:
    s = session()
    on_write_done(s, 10.0, 10.1, W)
    for i in range(10):
        assert on_write_done(s, 10.1 + i * 0.05, 10.11 + i * 0.05, W) == 0.0
    assert on_write_done(s, 10.7, 10.8, W) == pytest.approx(0.020)


def test_held_session_is_not_served_until_the_pause_ends() -> None:
    clock = FakeClock()
    e = Engine(Config(), clock=clock)
    s, sink = connect(e)
    t = e.topic("t", Mode.SNAPSHOT)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()
    sink.take()
    e.scheduler.hold(s, clock.now + 0.030)
    e.publish(t, 1)
    e.scheduler.run_cycle()
    assert sink.frames == []
    assert e.scheduler.next_timer() == pytest.approx(clock.now + 0.030)
    clock.advance(0.029)
    e.scheduler.run_cycle()
    assert sink.frames == []
    clock.advance(0.001)
    e.scheduler.run_cycle()
    assert [[m.payload for m in f if isinstance(m, Push)] for f in sink.take()] == [[b"1"]]


def test_a_longer_hold_extends_a_shorter_one() -> None:
    clock = FakeClock()
    e = Engine(Config(), clock=clock)
    s, sink = connect(e)
    t = e.topic("t", Mode.SNAPSHOT)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()
    sink.take()
    e.scheduler.hold(s, clock.now + 0.010)
    e.scheduler.hold(s, clock.now + 0.050)
    e.scheduler.hold(s, clock.now + 0.020)  # shorter: changes nothing
    e.publish(t, 1)
    clock.advance(0.030)
    e.scheduler.run_cycle()
    assert sink.frames == []
    clock.advance(0.020)
    e.scheduler.run_cycle()
    assert len(sink.take()) == 1


# --------------------------------------------------------------------- through the transport


class GatedSend:
    """An ASGI ``send`` that, like uvicorn's, waits while the socket is not writable."""

    def __init__(self) -> None:
        self.writable = asyncio.Event()
        self.writable.set()
        self.frames: list[bytes] = []
        self.closed: list[int] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        await self.writable.wait()
        if message["type"] == "websocket.send":
            self.frames.append(message["bytes"])
        elif message["type"] == "websocket.close":
            self.closed.append(message.get("code", 1000))


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def ws_rubris(clock: FakeClock) -> tuple[Rubris, Session, WebSocketConnection, GatedSend]:
    rubris = Rubris(Config(writer=W), clock=clock)
    send = GatedSend()
    scope = {"type": "websocket", "path": "/ws", "headers": [], "query_string": b""}
    conn = WebSocketConnection(rubris.websocket, scope, _never, send)  # type: ignore[arg-type]
    s = rubris.engine.open_session()
    conn.session = s
    rubris.engine.attach(s, conn)
    return rubris, s, conn, send


async def test_blocked_write_through_the_transport_earns_the_penalty() -> None:
    clock = FakeClock()
    rubris, s, conn, send = ws_rubris(clock)
    e = rubris.engine
    t = e.topic("t", Mode.RING)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()
    assert len(send.frames) == 1 and conn.writing is None  # written at once: no task

    send.writable.clear()  # the socket buffer is full
    e.publish(t, "a")
    e.scheduler.run_cycle()
    assert conn.writing is not None and conn.writing_since == clock.now
    assert not s.ready and e.pool.stats.in_use_block == 1  # the frame keeps its lease
    e.publish(t, "b")
    assert e.scheduler.run_cycle() == 0  # not ready: nothing more for it

    clock.advance(0.2)  # blocked for 200 ms > blocked_after
    send.writable.set()
    await conn.writing
    assert conn.writing is None and conn.writing_since == 0.0
    assert e.pool.stats.in_use_block == 0
    assert s.failed_sends == 1
    assert s.hold_until == pytest.approx(clock.now + 0.010)
    assert e.scheduler.run_cycle() == 0  # held for one slot
    clock.advance(0.010)
    assert e.scheduler.run_cycle() == 1
    got = [m.payload for f in send.frames for m in decode_frame(f) if isinstance(m, Push)]
    assert got == [b'"a"', b'"b"']


async def test_session_blocked_past_max_blocked_is_ended() -> None:
    clock = FakeClock()
    rubris = Rubris(Config(writer=WriterConfig(max_blocked=0.5)), clock=clock)
    send = GatedSend()
    scope = {"type": "websocket", "path": "/ws", "headers": [], "query_string": b""}
    conn = WebSocketConnection(rubris.websocket, scope, _never, send)  # type: ignore[arg-type]
    conn.ws.client_state = conn.ws.application_state = type(conn.ws.client_state).CONNECTED
    await rubris.start()
    try:
        e = rubris.engine
        s = e.open_session()
        conn.session = s
        e.attach(s, conn)
        rubris.websocket.connections.add(conn)
        t = e.topic("t", Mode.RING)
        e.subscribe(s, t, 1, 0, 0)
        send.writable.clear()
        e.publish(t, "x")
        for _ in range(20):
            await asyncio.sleep(0.01)
            if conn.writing is not None:
                break
        assert conn.writing is not None
        clock.advance(0.4)
        await asyncio.sleep(0.3)  # a housekeeping round: not yet past the limit
        assert s.id in e.sessions
        clock.advance(0.2)
        for _ in range(100):
            await asyncio.sleep(0.02)
            if s.id not in e.sessions:
                break
        assert s.id not in e.sessions
        assert conn not in rubris.websocket.connections and conn.closed
        assert e.pool.stats.in_use_block == 0  # the stuck frame's lease came back
    finally:
        send.writable.set()
        await rubris.stop()
        for task in list(conn._tasks):
            await task
    # the socket drains: GOODBYE 7 goes out after all, then the close (1013, try again later)
    byes = [m for f in send.frames for m in decode_frame(f) if type(m).__name__ == "Goodbye"]
    assert [b.code for b in byes] == [7]  # type: ignore[attr-defined]
    assert send.closed == [1013]


# --------------------------------------------------------------------- NAK pacing


@pytest.mark.parametrize(
    ("fill", "strength"),
    [(0, 0), (49, 0), (50, 1), (74, 1), (75, 2), (86, 2), (87, 3), (99, 3), (100, 4), (255, 4)],
)
def test_nak_strength(fill: int, strength: int) -> None:
    assert nak_strength(fill) == strength


def test_each_nak_level_doubles_the_interval() -> None:
    for fill, interval in [(50, 0.010), (75, 0.020), (87, 0.040), (100, 0.080)]:
        assert on_nak(session(), fill, 10.0, F) == pytest.approx(interval)


def test_strongest_nak_in_a_window_wins() -> None:
    s = session()
    assert on_nak(s, 50, 10.000, F) == pytest.approx(0.010)
    assert on_nak(s, 100, 10.010, F) == pytest.approx(0.080)  # stronger: takes over
    assert on_nak(s, 75, 10.020, F) == pytest.approx(0.080)  # weaker in the window: ignored
    assert on_nak(s, 50, 10.050, F) == pytest.approx(0.080)
    assert s.nak_fill == 100 and s.nak_at == 10.010


def test_nak_below_fifty_percent_changes_nothing() -> None:
    s = session()
    assert on_nak(s, 10, 10.0, F) == 0.0
    assert s.nak_interval == 0.0


def test_recovery_halves_the_interval_each_step_back_to_unlimited() -> None:
    s = session()
    on_nak(s, 100, 10.0, F)  # 80 ms
    seen = [current_interval(s, 10.0 + k * 0.1 + 0.001, F) for k in range(6)]
    assert seen == pytest.approx([0.080, 0.040, 0.020, 0.010, 0.005, 0.0])
    assert s.nak_interval == 0.0 and s.nak_fill == 0  # fully recovered and forgotten
    assert current_interval(s, 20.0, F) == 0.0


def test_a_nak_after_the_window_keeps_the_stronger_of_the_two() -> None:
    s = session()
    on_nak(s, 100, 10.0, F)  # 80 ms
    # 150 ms later the interval has recovered one step, to 40 ms; a 50 % NAK (10 ms) keeps 40
    assert on_nak(s, 50, 10.150, F) == pytest.approx(0.040)
    # and recovery now counts from this NAK
    assert current_interval(s, 10.249, F) == pytest.approx(0.040)
    assert current_interval(s, 10.251, F) == pytest.approx(0.020)
    # a 100 % NAK after the window raises it again
    assert on_nak(s, 100, 10.300, F) == pytest.approx(0.080)


def test_nak_paces_frames_in_the_cycle() -> None:
    # whole and half seconds: exact in binary floating point, so the schedule is exact
    flow = FlowConfig(base_interval=1.0, window=5.0, recover_step=10.0)
    clock = FakeClock()
    clock.now = 0.0
    e = Engine(Config(flow=flow), clock=clock)
    s, sink = connect(e)
    t = e.topic("t", Mode.RING)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()
    sink.take()
    on_nak(s, 87, clock.now, flow)  # 4 s between frames
    times: list[float] = []
    for i in range(80):
        clock.now = i * 0.5
        e.publish(t, i)
        if e.scheduler.run_cycle():
            times.append(clock.now)
    # 4 s apart until the first recovery step (at 10 s) halves it to 2 s, the next (20 s) to
    # 1 s, the next (30 s) to 0.5 s; the hold that was set before a step is served out first
    expected = [0.0, 4.0, 8.0, 12.0, 14.0, 16.0, 18.0]
    expected += [20.0 + k for k in range(11)]
    expected += [30.5 + k * 0.5 for k in range(19)]
    assert times == expected
    # nothing lost: the ring hands over one message a frame, in order
    got = [int(m.payload) for f in sink.take() for m in f if isinstance(m, Push)]
    assert got == list(range(len(times)))
    clock.now = 40.0  # four steps: 0.25 s < half the base interval, so back to unlimited
    assert current_interval(s, clock.now, flow) == 0.0 and s.nak_interval == 0.0


async def test_nak_from_the_wire_reaches_the_session() -> None:
    clock = FakeClock()
    rubris = Rubris(Config(flow=F), clock=clock)
    s = rubris.engine.open_session()
    await rubris.dispatcher.handle(s, [Nak(100)])
    assert s.nak_interval == pytest.approx(0.080) and s.nak_fill == 100


def test_a_session_is_not_expired_while_its_welcome_is_being_written() -> None:
    """A new session is detached until its transport attaches it, after WELCOME is written;
    under granian that write always completes later. The session timeout counts from the
    HELLO, not from the clock's zero; a resume restarts it the same way."""
    clock = FakeClock()
    clock.advance(1000.0)
    rubris = Rubris(Config(timing=Timing(session_timeout=5.0)), clock=clock)
    e = rubris.engine
    s, resumed = rubris.gateway.open_or_resume([Hello(1, "")], None)
    assert not resumed and e.expire() == []
    clock.advance(4.9)
    assert e.expire() == []
    clock.advance(0.2)
    assert e.expire() == [s]  # never attached: it times out like any detached session

    s = e.open_session()
    clock.advance(4.9)  # detached for most of the timeout, then the client comes back
    again, resumed = rubris.gateway.open_or_resume([Hello(1, s.resume_token)], None)
    assert again is s and resumed
    clock.advance(4.9)
    assert e.expire() == []


def test_the_expiry_walks_only_the_sessions_without_a_connection() -> None:
    """Four times a second the housekeeping looks for sessions to expire: it walks those
    without a connection (new, or detached), never the connected ones (10,000 of them cost a
    few % of a core), and a session leaves that set when it attaches or ends."""
    clock = FakeClock()
    clock.advance(1000.0)
    e = Engine(Config(timing=Timing(session_timeout=5.0)), clock=clock)
    connected = [connect(e)[0] for _ in range(100)]
    assert not e.unattached
    gone, _ = connect(e)
    e.detach(gone)
    back, _ = connect(e)
    e.detach(back)
    new = e.open_session()
    assert list(e.unattached) == [gone, back, new]
    e.attach(back, RecordingSink(e, back))
    clock.advance(5.1)
    assert e.expire() == [gone, new]
    assert not e.unattached and all(s.state is SessionState.CONNECTED for s in connected + [back])
    e.detach(back)
    e.end_session(back)  # ended before its timeout (a GOODBYE): forgotten here too
    assert not e.unattached

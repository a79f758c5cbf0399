"""What the engine measures for operators: the cycle's duration and publish to frame.

Sans-IO with a fake clock, so every latency is exact: the clock stands still inside a cycle,
which makes the interpolated hand-over time of a frame the cycle's time.
"""

from __future__ import annotations

import pytest

from rubris_asgi.engine.engine import Engine
from rubris_asgi.engine.telemetry import LATENCY_BOUNDS, PROBES, Histogram
from rubris_asgi.protocol import Mode
from tests.enginekit import FakeClock, connect


def test_histogram_buckets_like_prometheus() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 1.0, 3.0):
        h.observe(v)
    h.observe(0.5, weight=3)
    # le semantics: a value equal to a bound is in that bound's bucket
    assert h.counts == [2, 5, 1]
    assert h.count == 8
    assert h.sum == pytest.approx(0.05 + 0.1 + 0.5 + 1.0 + 3.0 + 1.5)
    assert h.quantile(0.5) == pytest.approx(0.1 + 0.9 * (4 - 2) / 5)
    assert h.quantile(1.0) == 1.0  # in +Inf: the last bound, as histogram_quantile says
    assert Histogram((1.0,)).quantile(0.5) is None
    with pytest.raises(ValueError):
        Histogram((1.0, 0.5))


def _engine() -> tuple[Engine, FakeClock]:
    clock = FakeClock()
    return Engine(clock=clock), clock


def test_every_cycle_is_timed() -> None:
    e, _ = _engine()
    for _ in range(5):
        e.scheduler.run_cycle()
    assert e.telemetry.cycle.count == 5


def test_publish_to_frame_of_a_ring_message() -> None:
    e, clock = _engine()
    s, sink = connect(e)
    t = e.topic("ticks", Mode.RING)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()  # SUBSCRIBED
    clock.advance(1.0)
    e.publish(t, 1)
    clock.advance(0.030)  # the scheduler was busy: the message waits 30 ms
    e.scheduler.run_cycle()
    lat = e.telemetry.latency
    assert lat.count == 1
    assert lat.sum == pytest.approx(0.030)
    assert lat.counts[LATENCY_BOUNDS.index(0.05)] == 1


def test_a_lapped_ring_times_the_oldest_message_it_still_holds() -> None:
    e, clock = _engine()
    s, sink = connect(e)
    t = e.topic("ticks", Mode.RING, ring=2)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()
    for _ in range(3):  # seq 1 is lost; 2 (at +0.2 s) is the oldest held
        clock.advance(0.1)
        e.publish(t, "x")
    clock.advance(0.1)
    e.scheduler.run_cycle()
    assert e.telemetry.latency.count == 1
    assert e.telemetry.latency.sum == pytest.approx(0.2)


def test_a_snapshot_first_value_is_not_latency_the_next_one_is() -> None:
    e, clock = _engine()
    t = e.topic("price", Mode.SNAPSHOT)
    e.publish(t, 1)  # long before anyone subscribes
    clock.advance(60)
    s, sink = connect(e)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()
    assert e.telemetry.latency.count == 0
    e.publish(t, 2)
    clock.advance(0.004)
    e.scheduler.run_cycle()
    assert e.telemetry.latency.count == 1
    assert e.telemetry.latency.sum == pytest.approx(0.004)


def test_a_resumed_session_replay_is_not_latency() -> None:
    e, clock = _engine()
    s, sink = connect(e)
    t = e.topic("ticks", Mode.RING)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()
    e.detach(s)
    e.publish(t, "while away")
    clock.advance(5)
    e.attach(s, sink)
    e.scheduler.run_cycle()
    assert sink.frames  # the replay went out
    assert e.telemetry.latency.count == 0


def test_an_intake_message_waits_from_its_arrival() -> None:
    e, clock = _engine()
    s, sink = connect(e)
    t = e.topic("ticks", Mode.RING)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()
    assert e.offer([(t, b"1"), (t, b"2")])
    clock.advance(0.010)
    e.scheduler.run_cycle()  # the intake gives a subscribed ring one message a cycle
    clock.advance(0.010)
    e.scheduler.run_cycle()
    assert e.telemetry.latency.count == 2
    assert e.telemetry.latency.sum == pytest.approx(0.010 + 0.020)


def test_sampling_weights_stand_for_every_session_served() -> None:
    e, clock = _engine()
    t = e.topic("ticks", Mode.RING)
    n = 1000
    for _ in range(n):
        s, _sink = connect(e)
        e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()
    e.publish(t, 1)
    clock.advance(0.002)
    e.scheduler.run_cycle()
    lat = e.telemetry.latency
    step = n // PROBES
    # PROBES samples (one more when n is not a multiple), each standing for step sessions
    assert n - step <= lat.count <= n + step
    assert lat.sum == pytest.approx(0.002 * lat.count)


def test_a_held_session_is_timed_when_it_is_served() -> None:
    e, clock = _engine()
    s, sink = connect(e)
    t = e.topic("ticks", Mode.RING)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()
    e.scheduler.hold(s, clock.now + 0.5)  # a penalty: the message waits for it
    e.publish(t, 1)
    e.scheduler.run_cycle()
    assert e.telemetry.latency.count == 0
    clock.advance(0.5)
    e.scheduler.run_cycle()
    assert e.telemetry.latency.count == 1
    assert e.telemetry.latency.sum == pytest.approx(0.5)

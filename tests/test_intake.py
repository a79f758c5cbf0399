"""The intake's rules, sans-IO: bounded, all or nothing, one ring message a cycle, FLOW levels."""

from __future__ import annotations

import pytest

from rubris_asgi.config import Config, Limits
from rubris_asgi.engine.engine import Engine
from rubris_asgi.engine.intake import flow_level
from rubris_asgi.errors import MessageTooLarge
from rubris_asgi.protocol import Flow, Mode

from .enginekit import FakeClock, connect, pushes


def engine(messages: int = 100, nbytes: int = 1 << 20) -> tuple[Engine, FakeClock]:
    clock = FakeClock()
    limits = Limits(intake_messages=messages, intake_bytes=nbytes)
    return Engine(Config(limits=limits), clock=clock), clock


def flows(frames: list[list[object]]) -> list[int]:
    return [m.fill for f in frames for m in f if isinstance(m, Flow)]


def test_a_ring_topic_takes_one_message_a_cycle_in_order() -> None:
    e, _ = engine()
    t = e.topic("r", Mode.RING)
    s, sink = connect(e)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()
    sink.take()
    assert e.offer([(t, b'"%d"' % i) for i in range(5)])
    assert e.intake.count == 5 and t.seq == 0  # nothing reaches the topic before a cycle
    got = []
    for _ in range(5):
        e.scheduler.run_cycle()
        got += [p for f in sink.take() for _, _, p in pushes(f)]
        assert t.seq == len(got)  # one a cycle: the subscriber never falls behind its ring
    assert got == [b'"%d"' % i for i in range(5)]
    assert e.intake.count == 0 and e.intake.bytes == 0 and not e.scheduler.has_work()


def test_a_snapshot_topic_takes_its_last_value_at_once() -> None:
    e, _ = engine()
    t = e.topic("s", Mode.SNAPSHOT)
    s, sink = connect(e)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()
    sink.take()
    assert e.offer([(t, b"1"), (t, b"2"), (t, b"3")])
    e.scheduler.run_cycle()
    assert [p for f in sink.take() for _, _, p in pushes(f)] == [b"3"]
    assert e.intake.count == 0 and e.intake.bytes == 0
    assert e.intake.stats.conflated == 2 and e.intake.stats.published == 1


def test_topics_drain_side_by_side() -> None:
    e, _ = engine()
    a, b = e.topic("a", Mode.RING), e.topic("b", Mode.RING)
    s, _sink = connect(e)
    e.subscribe(s, a, 1, 0, 0)
    e.subscribe(s, b, 2, 0, 0)
    assert e.offer([(a, b"1"), (a, b"2"), (b, b"3")])
    e.scheduler.run_cycle()
    assert (a.seq, b.seq) == (1, 1)
    e.scheduler.run_cycle()
    assert (a.seq, b.seq) == (2, 1) and e.intake.count == 0


def test_a_ring_topic_nobody_subscribes_to_takes_everything_at_once() -> None:
    e, _ = engine()
    lonely, watched = e.topic("lonely", Mode.RING), e.topic("watched", Mode.RING)
    s, _sink = connect(e)
    e.subscribe(s, watched, 1, 0, 0)
    assert e.offer([(lonely, b"%d" % i) for i in range(10)] + [(watched, b"1"), (watched, b"2")])
    e.scheduler.run_cycle()
    assert (lonely.seq, watched.seq) == (10, 1)  # nobody to lap on `lonely`
    assert e.intake.count == 1 and e.intake.bytes == 1


def test_a_request_that_does_not_fit_is_refused_whole() -> None:
    e, _ = engine(messages=10, nbytes=100)
    t = e.topic("r", Mode.RING)
    assert e.offer([(t, b"x")] * 8)
    assert not e.offer([(t, b"y")] * 3)  # 11 > 10: none of the three is taken
    assert e.intake.count == 8 and e.intake.stats.refused == 3
    assert e.offer([(t, b"y")] * 2)
    assert e.intake.fill == 100
    big = e.topic("big", Mode.RING)
    e2, _ = engine(messages=10, nbytes=100)
    assert not e2.offer([(big, b"z" * 101)])  # the byte bound too
    assert e2.intake.count == 0 and e2.intake.bytes == 0


def test_fill_is_the_larger_ratio() -> None:
    e, _ = engine(messages=100, nbytes=1000)
    t = e.topic("r", Mode.RING)
    assert e.offer([(t, b"x" * 100)] * 3)  # 3 % by count, 30 % by bytes
    assert e.intake.fill == 30
    assert e.offer([(t, b"")] * 57)  # 60 % by count
    assert e.intake.fill == 60


def test_an_idle_scheduler_is_woken() -> None:
    woken = []
    e = Engine(Config(), clock=FakeClock(), wake=lambda: woken.append(1))
    e.scheduler.idle = True
    assert e.offer([(e.topic("r", Mode.RING), b"1")])
    assert woken == [1] and e.scheduler.has_work()


def test_flow_levels() -> None:
    assert [flow_level(f) for f in (0, 49, 50, 74, 75, 86, 87, 99, 100)] == [
        0,
        0,
        50,
        50,
        75,
        75,
        87,
        87,
        100,
    ]


def test_recent_publishers_get_flow_on_the_way_up_and_once_below_50() -> None:
    e, clock = engine(messages=100)
    t = e.topic("r", Mode.RING)
    pub, sink = connect(e)
    e.subscribe(pub, t, 1, 0, 0)  # a subscriber: the ring drains one message a cycle
    other, other_sink = connect(e)  # never published: never told
    assert e.offer([(t, b"1")] * 40, pub)
    assert e.offer([(t, b"1")] * 15, pub)  # 55 %: crosses 50
    assert e.offer([(t, b"1")] * 5, pub)  # 60 %: same level, nothing new
    assert e.offer([(t, b"1")] * 20, pub)  # 80 %: crosses 75
    e.scheduler.run_cycle()  # drains one (79 %) and sends the FLOWs
    assert flows(sink.take()) == [55, 80]
    for _ in range(30):  # down to 49 %: one FLOW when it falls below 50
        e.scheduler.run_cycle()
    assert flows(sink.take()) == [49]
    assert flows(other_sink.take()) == []
    clock.advance(1.5)  # the publisher has been quiet for over a second
    assert e.offer([(t, b"1")] * 40)  # anonymous (HTTP API) publisher: 89 %
    e.scheduler.run_cycle()
    assert flows(sink.take()) == []
    assert e.intake.stats.flows == 3


def test_a_message_too_large_for_any_frame_is_refused_before_the_intake() -> None:
    e, _ = engine()
    max_size = e.pool.config.block_size * e.pool.config.max_scale
    e.check_payload(max_size - 64)
    with pytest.raises(MessageTooLarge, match="exceeds the maximum"):
        e.check_payload(max_size)

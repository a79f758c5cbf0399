"""The scheduler's rules (seed 000 and 001) as assertions on the frames it produces."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from rubris_asgi.config import Config, WriterConfig
from rubris_asgi.engine.buffers import PoolConfig
from rubris_asgi.engine.engine import Engine
from rubris_asgi.errors import MessageTooLarge, QueueFull
from rubris_asgi.protocol import Ack, Gap, Mode, Push, Subscribed
from rubris_asgi.server.direct import Outbox
from rubris_asgi.server.runtime import run_scheduler

from .enginekit import FakeClock, RecordingSink, connect, pushes


def make_engine(**pool: int) -> Engine:
    cfg = Config(pool=PoolConfig(**pool)) if pool else Config()
    return Engine(cfg, clock=FakeClock())


def letters(frame: list[object]) -> list[str]:
    return [orjson.loads(m.payload) for m in frame if isinstance(m, Push)]  # type: ignore[attr-defined]


def drain(engine: Engine, cycles: int = 10) -> None:
    for _ in range(cycles):
        engine.scheduler.run_cycle()


def test_seed_example_one_message_per_topic_per_cycle() -> None:
    """Topics [a b c], [d e f] and snapshot [g] give frames [a d g], [b e], [c f]."""
    e = make_engine()
    s, sink = connect(e)
    t1 = e.topic("t1", Mode.RING)
    t2 = e.topic("t2", Mode.RING)
    t3 = e.topic("t3", Mode.SNAPSHOT)
    for i, t in enumerate((t1, t2, t3)):
        e.subscribe(s, t, i, 0, 0)
    drain(e, 1)
    sink.take()
    for x in "abc":
        e.publish(t1, x)
    for x in "def":
        e.publish(t2, x)
    e.publish(t3, "g")
    drain(e, 5)
    assert [letters(f) for f in sink.take()] == [["a", "d", "g"], ["b", "e"], ["c", "f"]]


def test_private_batch_depth_gives_mini_batches() -> None:
    """Private topics with batch 5: [a b c], [d e f] and snapshot [g] give [a b c d e f g]."""
    e = make_engine()
    s, sink = connect(e)
    p1 = e.subscribe_private(s, "p1", 1, batch=5)
    p2 = e.subscribe_private(s, "p2", 2, batch=5)
    t3 = e.topic("t3", Mode.SNAPSHOT)
    e.subscribe(s, t3, 3, 0, 0)
    drain(e, 1)
    sink.take()
    for x in "abc":
        e.send_nowait(s, p1, x)
    for x in "def":
        e.send_nowait(s, p2, x)
    e.publish(t3, "g")
    drain(e, 3)
    assert [letters(f) for f in sink.take()] == [["a", "b", "c", "d", "e", "f", "g"]]


def test_private_without_batch_takes_one_per_cycle() -> None:
    e = make_engine()
    s, sink = connect(e)
    p1 = e.subscribe_private(s, "p1", 1)
    drain(e, 1)
    sink.take()
    for x in "abc":
        e.send_nowait(s, p1, x)
    drain(e, 5)
    assert [letters(f) for f in sink.take()] == [["a"], ["b"], ["c"]]


def test_direct_queue_goes_first() -> None:
    e = make_engine()
    s, sink = connect(e)
    t = e.topic("t", Mode.SNAPSHOT)
    e.publish(t, 1)
    e.subscribe(s, t, 7, 0, 0)
    drain(e, 1)
    [frame] = sink.take()
    assert isinstance(frame[0], Subscribed) and frame[0].req == 7 and frame[0].head == 1
    assert isinstance(frame[1], Push) and frame[1].seq == 1  # the snapshot, at once


def test_busy_topic_never_starves_others_when_the_buffer_is_full() -> None:
    # a block fits exactly two of these messages: every cycle ends with a full buffer
    e = make_engine(block_size=40)  # messages here are 16 bytes
    s, sink = connect(e)
    topics = [e.topic(f"t{i}", Mode.RING, ring=1000) for i in range(3)]
    for i, t in enumerate(topics):
        e.subscribe(s, t, i, 0, 0)
    drain(e, 1)
    sink.take()
    seen: dict[int, list[int]] = {t.number: [] for t in topics}
    for cycle in range(30):
        for _ in range(3):  # each topic publishes faster than it can be delivered
            for t in topics:
                e.publish(t, "x" * 10)
        e.scheduler.run_cycle()
        for frame in sink.take():
            assert len(frame) <= 2
            for topic, _seq, _ in pushes(frame):
                seen[topic].append(cycle)
    # within any two consecutive cycles every topic got something: nobody starves
    for cycles in seen.values():
        gaps = [b - a for a, b in zip(cycles, cycles[1:], strict=False)]
        assert max(gaps) <= 2, cycles
        assert len(cycles) >= 19


def test_one_busy_topic_does_not_delay_a_quiet_one() -> None:
    e = make_engine()
    s, sink = connect(e)
    busy = e.topic("busy", Mode.RING, ring=4096)
    quiet = e.topic("quiet", Mode.SNAPSHOT)
    e.subscribe(s, busy, 1, 0, 0)
    e.subscribe(s, quiet, 2, 0, 0)
    drain(e, 1)
    sink.take()
    for i in range(1000):
        e.publish(busy, i)
    e.scheduler.run_cycle()
    e.publish(quiet, "hello")
    e.scheduler.run_cycle()
    frames = sink.take()
    assert len(frames) == 2
    # the quiet topic's message goes out in the very next cycle, next to one busy message
    assert sorted(t for t, _, _ in pushes(frames[1])) == sorted([busy.number, quiet.number])


def test_thousand_sessions_receive_seq_n_in_the_same_cycle() -> None:
    e = make_engine()
    t = e.topic("prices", Mode.RING)
    sinks = []
    for i in range(1000):
        s, sink = connect(e)
        e.subscribe(s, t, i, 0, 0)
        sinks.append(sink)
    drain(e, 1)
    for sink in sinks:
        sink.take()
    for n in range(1, 4):
        e.publish(t, n)
        e.scheduler.run_cycle()
        for sink in sinks:
            [frame] = sink.take()
            assert pushes(frame) == [(t.number, n, str(n).encode())]


def test_a_shared_message_is_encoded_once() -> None:
    e = make_engine()
    t = e.topic("t", Mode.SNAPSHOT)
    sinks = []
    for i in range(50):
        s, sink = connect(e)
        e.subscribe(s, t, i, 0, 0)
        sinks.append(sink)
    drain(e, 1)
    for sink in sinks:
        sink.take()
    e.publish(t, {"bid": 1.0})
    e.scheduler.run_cycle()
    frames = [sink.frames[0] for sink in sinks]
    assert all(f is frames[0] for f in frames)  # the very same bytes object, not copies


def test_client_with_many_busy_topics_takes_only_its_share() -> None:
    e = make_engine()
    big, big_sink = connect(e)
    small, small_sink = connect(e)
    topics = [e.topic(f"b{i}", Mode.RING, ring=1000) for i in range(50)]
    for i, t in enumerate(topics):
        e.subscribe(big, t, i, 0, 0)
    lone = e.topic("lone", Mode.RING)
    e.subscribe(small, lone, 0, 0, 0)
    drain(e, 1)
    big_sink.take()
    small_sink.take()
    for _ in range(20):
        for t in topics:
            e.publish(t, "x")
    e.publish(lone, "y")
    e.scheduler.run_cycle()
    [big_frame] = big_sink.take()
    [small_frame] = small_sink.take()
    # one message per topic per cycle: 50, not 1000, and the small client is served alongside
    assert len(big_frame) == 50
    assert len({m.topic for m in big_frame if isinstance(m, Push)}) == 50
    assert len(small_frame) == 1


def test_publishes_between_cycles_coalesce() -> None:
    e = make_engine()
    s, sink = connect(e)
    t = e.topic("snap", Mode.SNAPSHOT)
    e.subscribe(s, t, 1, 0, 0)
    drain(e, 1)
    sink.take()
    for i in range(100):
        e.publish(t, i)
    assert len(e.scheduler.dirty) == 1  # marked once
    assert s.pending == {}  # publish did no fan-out: that happens in the cycle
    e.scheduler.run_cycle()
    [frame] = sink.take()
    assert pushes(frame) == [(t.number, 100, b"99")]
    e.scheduler.run_cycle()
    assert sink.take() == []


def test_cycle_visits_only_active_sessions() -> None:
    e = make_engine()
    quiet = e.topic("quiet", Mode.SNAPSHOT)
    for i in range(2000):
        s, _ = connect(e)
        e.subscribe(s, quiet, i, 0, 0)
    drain(e, 1)
    hot = e.topic("hot", Mode.SNAPSHOT)
    s, sink = connect(e)
    e.subscribe(s, hot, 0, 0, 0)
    drain(e, 1)
    sink.take()
    e.publish(hot, 1)
    sched = e.scheduler
    # after the fan-out only the one subscriber of the changed topic is pending
    visited: list[object] = []
    real_serve = sched.frames.serve

    def counting_serve(session: object, now: float) -> bool:
        visited.append(session)
        return real_serve(session, now)  # type: ignore[arg-type]

    sched.frames.serve = counting_serve  # type: ignore[method-assign]
    sched.run_cycle()
    assert visited == [s]


def test_gap_names_exactly_what_was_lost() -> None:
    e = make_engine()
    s, sink = connect(e, auto=False)
    t = e.topic("r", Mode.RING, ring=8)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()  # SUBSCRIBED goes out; the write is still in progress
    for i in range(1, 21):
        e.publish(t, i)
        e.scheduler.run_cycle()  # not ready: nothing is taken
    assert len(sink.frames) == 1
    sink.complete()
    sink.take()
    got: list[object] = []
    for _ in range(20):
        e.scheduler.run_cycle()
        sink.complete()
    for frame in sink.take():
        got.extend(frame)
    assert got[0] == Gap(t.number, 1, 12)
    assert [m.seq for m in got[1:] if isinstance(m, Push)] == list(range(13, 21))


def test_ring_replay_after_since_in_the_same_epoch() -> None:
    e = make_engine()
    t = e.topic("r", Mode.RING, ring=8)
    for i in range(1, 11):
        e.publish(t, i)
    s, sink = connect(e)
    e.subscribe(s, t, 1, t.epoch, 5)
    drain(e)
    msgs = [m for f in sink.take() for m in f]
    assert isinstance(msgs[0], Subscribed) and msgs[0].recovered and msgs[0].head == 10
    assert [m.seq for m in msgs if isinstance(m, Push)] == [6, 7, 8, 9, 10]

    # too far back: a GAP first for what the ring no longer holds, recovered = 0
    s2, sink2 = connect(e)
    e.subscribe(s2, t, 1, t.epoch, 1)
    drain(e)
    msgs = [m for f in sink2.take() for m in f]
    assert isinstance(msgs[0], Subscribed) and not msgs[0].recovered
    assert msgs[1] == Gap(t.number, 2, 1)
    assert [m.seq for m in msgs if isinstance(m, Push)] == list(range(3, 11))

    # another epoch: start afresh, nothing replayed
    s3, sink3 = connect(e)
    e.subscribe(s3, t, 1, t.epoch + 1, 5)
    drain(e)
    msgs = [m for f in sink3.take() for m in f]
    assert isinstance(msgs[0], Subscribed) and not msgs[0].recovered
    assert [m for m in msgs if isinstance(m, Push)] == []


def test_private_messages_replayed_after_resume() -> None:
    e = make_engine()
    s, sink = connect(e)
    q = e.subscribe_private(s, "fills", 1, capacity=10, batch=10)
    drain(e, 1)
    sink.take()
    for i in range(1, 6):
        e.send_nowait(s, q, i)
    drain(e, 1)
    assert [m.seq for f in sink.take() for m in f if isinstance(m, Push)] == [1, 2, 3, 4, 5]
    e.ack(s, Ack.private(q.number, 2))
    e.detach(s)  # the connection drops with 3, 4, 5 unacknowledged
    e.send_nowait(s, q, 6)
    drain(e, 1)
    sink2 = RecordingSink(e, s)
    assert e.find_resumable(s.resume_token) is s
    e.attach(s, sink2)
    drain(e, 2)
    assert [m.seq for f in sink2.take() for m in f if isinstance(m, Push)] == [3, 4, 5, 6]


def test_private_queue_pushes_back_when_full() -> None:
    e = make_engine()
    s, sink = connect(e)
    q = e.subscribe_private(s, "fills", 1, capacity=3)
    for i in range(3):
        e.send_nowait(s, q, i)
    with pytest.raises(QueueFull, match="full"):
        e.send_nowait(s, q, 99)
    drain(e, 5)
    # delivered but unacknowledged still counts: the client must ACK to make room
    with pytest.raises(QueueFull):
        e.send_nowait(s, q, 99)
    woke: list[int] = []
    q.waiters.append(lambda: woke.append(1))
    e.ack(s, Ack.private(q.number, 1))
    assert woke == [1]
    assert e.send_nowait(s, q, 99) == 4


def test_not_ready_sessions_are_not_served_until_ready() -> None:
    e = make_engine()
    s, sink = connect(e, auto=False)
    t = e.topic("t", Mode.SNAPSHOT)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()
    e.publish(t, "a")
    e.scheduler.run_cycle()
    assert len(sink.frames) == 1  # only SUBSCRIBED: the write is still going on
    assert not e.scheduler.clients  # parked, not polled every cycle
    sink.complete()
    e.scheduler.run_cycle()
    assert len(sink.frames) == 2


def test_large_message_goes_alone_in_a_large_buffer() -> None:
    e = make_engine(block_size=1024)
    s, sink = connect(e)
    small = e.topic("small", Mode.SNAPSHOT)
    big = e.topic("big", Mode.SNAPSHOT, compress_at=None)
    e.subscribe(s, small, 1, 0, 0)
    e.subscribe(s, big, 2, 0, 0)
    drain(e, 1)
    sink.take()
    e.publish(big, "x" * 3000)  # > block, < large (4 KiB)
    e.publish(small, "y")
    e.scheduler.run_cycle()
    e.scheduler.run_cycle()
    frames = sink.take()
    assert [len(f) for f in frames] == [1, 1]
    assert e.pool.stats.large == 1


def test_message_that_does_not_fit_after_others_waits_for_next_frame() -> None:
    e = make_engine(block_size=1024)
    s, sink = connect(e)
    a = e.topic("a", Mode.SNAPSHOT)
    b = e.topic("b", Mode.SNAPSHOT)
    e.subscribe(s, a, 1, 0, 0)
    e.subscribe(s, b, 2, 0, 0)
    drain(e, 1)
    sink.take()
    e.publish(a, "x" * 600)
    e.publish(b, "y" * 600)
    e.scheduler.run_cycle()
    assert [len(f) for f in sink.take()] == [1]
    assert e.scheduler.stats.deferred == 1
    e.scheduler.run_cycle()
    [frame] = sink.take()
    assert pushes(frame)[0][0] == b.number
    assert e.pool.stats.large == 0


def test_unpooled_growth_up_to_the_maximum_then_refused() -> None:
    e = make_engine(block_size=1024, large_scale=2, max_scale=8)
    s, sink = connect(e)
    t = e.topic("t", Mode.SNAPSHOT, compress_at=None)
    e.subscribe(s, t, 1, 0, 0)
    drain(e, 1)
    sink.take()
    e.publish(t, "z" * 5000)  # > large (2 KiB): unpooled, 4 KiB then 8 KiB
    e.scheduler.run_cycle()
    [frame] = sink.take()
    assert len(frame[0].payload) == 5002  # type: ignore[union-attr]
    assert e.pool.stats.unpooled == 1
    with pytest.raises(MessageTooLarge):
        e.publish(t, "z" * 9000)
    assert t.seq == 1  # nothing stored, nothing half-sent
    e.scheduler.run_cycle()
    assert sink.take() == []


def test_snapshot_new_subscriber_gets_the_latest_value_at_once() -> None:
    e = make_engine()
    t = e.topic("t", Mode.SNAPSHOT)
    e.publish(t, "old")
    e.publish(t, "new")
    s, sink = connect(e)
    e.subscribe(s, t, 1, 0, 0)
    e.scheduler.run_cycle()
    [frame] = sink.take()
    assert letters(frame) == ["new"]


def test_compressed_once_when_it_halves_the_payload() -> None:
    e = make_engine()
    t = e.topic("t", Mode.SNAPSHOT, compress_at=100)
    s, sink = connect(e)
    e.subscribe(s, t, 1, 0, 0)
    e.publish(t, {"rows": ["same text"] * 100})
    e.scheduler.run_cycle()
    push = [m for m in sink.take()[0] if isinstance(m, Push)][0]
    assert push.compressed
    assert e.compression.stats.kept == 1


@dataclass
class ThreadedSink(RecordingSink):
    """A server that completes writes on its own threads (granian): each write is out until
    ``complete`` (not written at once, not blocked either)."""

    slices: list[int] = field(default_factory=list)

    def send_frame(self, frame: bytes, lease: Any) -> None:
        self.frames.append(frame)
        self.held.append(lease)
        self.slices.append(self.engine.scheduler.write_started())

    def complete(self) -> None:
        for lease, slice_ in zip(self.held, self.slices, strict=True):
            self.engine.frame_done(self.session, lease)
            self.engine.scheduler.write_settled(slice_)
        self.held.clear()
        self.slices.clear()


def threaded(engine: Engine) -> tuple[Any, ThreadedSink]:
    s = engine.open_session()
    sink = ThreadedSink(engine, s, auto=False)
    engine.attach(s, sink)
    return s, sink


def test_a_cycle_pauses_after_the_async_window_and_goes_on_in_order() -> None:
    """With writes completed on the server's threads, a cycle hands out ``async_window`` of
    them, then pauses; the sessions not reached go first once half the window is done, and
    every session still gets the message exactly once (the same cycle's message)."""
    engine = Engine(Config(writer=WriterConfig(async_window=4)), clock=FakeClock())
    sched = engine.scheduler
    woken: list[int] = []
    sched.settled = lambda: woken.append(sched.writes_out)
    t = engine.topic("t", Mode.RING)
    sinks = []
    for _ in range(10):
        s, sink = threaded(engine)
        engine.subscribe(s, t, 1, 0, 0)
        sinks.append(sink)
    sched.run_cycle()  # SUBSCRIBED replies: 4 sessions, then the pause
    assert sched.paused and sched.writes_out == 4
    assert [len(k.frames) for k in sinks] == [1] * 4 + [0] * 6
    sinks[0].complete()
    sinks[1].complete()
    assert woken == [2]  # half the window done: the runner is woken
    sched.next_slice()
    sched.run_cycle()
    assert [len(k.frames) for k in sinks] == [1] * 8 + [0] * 2  # the next ones, in order
    for k in sinks[2:8]:
        k.complete()
    sched.next_slice()
    sched.run_cycle()
    assert [len(k.frames) for k in sinks] == [1] * 10 and not sched.paused
    for k in sinks:
        k.complete()
        k.frames.clear()
    engine.publish(t, "x")
    while True:
        sched.run_cycle()
        for k in sinks:
            k.complete()
        if not sched.paused:
            break
        sched.next_slice()
    assert [letters(f) for k in sinks for f in k.messages()] == [["x"]] * 10


def test_a_stuck_write_holds_up_only_its_own_slice() -> None:
    """A slow client's write never settles: the next slice counts from zero without it, so
    stuck writes never pause every cycle."""
    engine = Engine(Config(writer=WriterConfig(async_window=2)), clock=FakeClock())
    sched = engine.scheduler
    t = engine.topic("t", Mode.RING)
    sinks = []
    for _ in range(4):
        s, sink = threaded(engine)
        engine.subscribe(s, t, 1, 0, 0)
        sinks.append(sink)
    sched.run_cycle()
    assert sched.paused and sched.writes_out == 2
    sched.next_slice()  # the runner gave up waiting (SETTLE): sinks[0], [1] still stuck
    sched.run_cycle()
    assert sched.writes_out == 2 and not sched.paused  # the last two: nothing left to pause
    sinks[0].complete()  # an old slice's write settles late: not counted against this one
    assert sched.writes_out == 2


def test_written_at_once_never_pauses() -> None:
    engine = Engine(Config(writer=WriterConfig(async_window=2)), clock=FakeClock())
    t = engine.topic("t", Mode.RING)
    sinks = []
    for _ in range(10):
        s, sink = connect(engine)
        engine.subscribe(s, t, 1, 0, 0)
        sinks.append(sink)
    assert engine.scheduler.run_cycle() == 10 and not engine.scheduler.paused


async def test_a_penalty_set_while_the_loop_sleeps_ends_on_time() -> None:
    """A blocked write that ends between cycles puts a penalty hold on its session (the
    WebSocket transport does) while the scheduler's loop sleeps with no timer: the loop must
    wake for that hold, or the session's waiting messages stay undelivered until some other
    work happens to come (in tests/test_large.py: until the client timed out)."""
    wake = asyncio.Event()
    engine = Engine(wake=wake.set)  # the real clock: the loop sleeps in real time
    s, sink = connect(engine, auto=False)  # frames stay "on the wire" until complete()
    t = engine.topic("t", Mode.RING)
    engine.subscribe(s, t, 1, 0, 0)
    loop = asyncio.create_task(run_scheduler(engine, wake, Outbox()))
    try:
        engine.publish(t, "a")
        for _ in range(100):
            if sink.held:
                break
            await asyncio.sleep(0.01)
        engine.publish(t, "b")  # waits: the session is writing its frame
        await asyncio.sleep(0.05)  # the loop goes to sleep: nothing it could do
        engine.scheduler.hold(s, engine.clock() + 0.05)  # the write was slow: a penalty
        sink.complete()  # then it ends; "b" is due once the penalty is over
        for _ in range(100):
            if any("b" in letters(f) for f in sink.messages()):
                break
            await asyncio.sleep(0.01)
        assert [x for f in sink.messages() for x in letters(f)] == ["a", "b"]
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop


# --- frames shared across sessions (issue 29): the same bytes, one lease, every rule kept ------


def subscribed(e: Engine, topics: list[Any], n: int, *, auto: bool) -> list[RecordingSink]:
    sinks = []
    for _ in range(n):
        s, sink = connect(e, auto=auto)
        for i, t in enumerate(topics):
            e.subscribe(s, t, i, 0, 0)
        sinks.append(sink)
    drain(e, 1)
    for sink in sinks:
        sink.complete()
        sink.take()
    return sinks


def test_sessions_with_the_same_messages_share_one_frame_and_one_lease() -> None:
    e = make_engine(blocks=4)  # far fewer blocks than sessions: shared, they all go out
    topics = [e.topic(f"t{i}", Mode.RING) for i in range(10)]
    sinks = subscribed(e, topics, 50, auto=False)
    shared = e.pool.stats.shared  # the SUBSCRIBED frames were alike too
    for t in topics:
        e.publish(t, t.name)
    e.scheduler.run_cycle()
    frames = [sink.frames[0] for sink in sinks]
    assert all(f is frames[0] for f in frames)  # joined once, not 50 times
    assert [m[2] for m in pushes(sinks[7].messages()[0])] == [f'"t{i}"'.encode() for i in range(10)]
    [lease] = {id(sink.held[0]): sink.held[0] for sink in sinks}.values()
    assert (lease.holders, e.pool.stats.in_use_block, e.pool.stats.shared - shared) == (50, 1, 49)
    for sink in sinks[:-1]:
        sink.complete()
    assert e.pool.stats.in_use_block == 1 and not lease.released  # one write still under way
    sinks[-1].complete()
    assert lease.released and e.pool.stats.in_use_block == 0


def test_a_write_already_done_is_not_shared_but_its_bytes_are() -> None:
    e = make_engine()
    t = e.topic("t", Mode.RING)
    sinks = subscribed(e, [t], 3, auto=True)  # written at once: each lease back before the next
    e.publish(t, 1)
    e.scheduler.run_cycle()
    assert sinks[0].frames[0] is sinks[2].frames[0]
    assert e.pool.stats.shared == 0 and e.pool.stats.in_use_block == 0


def test_a_different_frame_in_the_middle_gets_its_own_bytes_and_lease() -> None:
    e = make_engine()
    t, u, v = (e.topic(name, Mode.RING) for name in "tuv")
    a, b, c = subscribed(e, [t, u], 3, auto=False)
    e.subscribe(b.session, v, 2, 0, 0)  # the middle session also has v
    drain(e, 1)
    b.complete()
    b.take()
    shared = e.pool.stats.shared
    for topic in (t, u, v):
        e.publish(topic, topic.name)
    e.scheduler.run_cycle()
    assert len(pushes(b.messages()[0])) == 3 and len(pushes(a.messages()[0])) == 2
    assert a.frames[0] == c.frames[0] != b.frames[0]
    # only the last frame built is shared: c's bytes are joined again, under a lease of their own
    assert len({id(a.held[0]), id(b.held[0]), id(c.held[0])}) == 3
    assert e.pool.stats.shared == shared and e.pool.stats.in_use_block == 3
    for sink in (a, b, c):
        sink.complete()
    assert e.pool.stats.in_use_block == 0


def test_frames_written_at_once_take_no_lease_and_keep_every_rule() -> None:
    e = make_engine(blocks=2)  # two leases for a thousand sessions: none is needed
    t = e.topic("t", Mode.RING)
    sinks = []
    for i in range(1000):
        s, sink = connect(e, at_once=True)
        e.subscribe(s, t, i, 0, 0)
        sinks.append(sink)
    drain(e, 1)
    for sink in sinks:
        sink.take()
    started = e.pool.stats.block
    e.publish(t, 1)
    e.publish(t, 2)  # two waiting: one a cycle, each session in the same cycle
    e.scheduler.run_cycle()
    assert all(pushes(sink.take()[0]) == [(t.number, 1, b"1")] for sink in sinks)
    e.scheduler.run_cycle()
    assert all(pushes(sink.take()[0]) == [(t.number, 2, b"2")] for sink in sinks)
    stats = e.pool.stats
    assert (stats.block - started, stats.in_use_block, stats.peak_block) == (2000, 0, 0)
    assert all(sink.session.ready for sink in sinks)

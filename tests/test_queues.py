"""The rules of work-queue topics (protocol.md section 5), sans-IO on a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from rubris_asgi.engine.queues import CoDel, PrefetchEstimator
from rubris_asgi.errors import ErrorCode, ProtocolError, QueueFull
from rubris_asgi.protocol import Ack, Item, Mode, Subscribed, Unsubscribed, decode_frame

from .queuekit import Simulation, ack, consumer, items, make_engine, revokes, run


def test_subscribed_announces_a_queue_topic() -> None:
    engine, _, q = make_engine()
    s, sink, _ = consumer(engine, q)
    run(engine)
    (sub,) = [m for f in sink.take() for m in f if isinstance(m, Subscribed)]
    assert (sub.topic, sub.mode, sub.name) == (q.number, Mode.QUEUE, "jobs.x")


def test_items_are_dealt_in_rotation_and_never_to_two_consumers() -> None:
    engine, _, q = make_engine()
    consumers = [consumer(engine, q, prefetch=10) for _ in range(3)]
    for i in range(9):
        engine.enqueue(q, {"n": i})
    run(engine)
    got = [[m.payload for m in items(sink)] for _, sink, _ in consumers]
    assert [len(g) for g in got] == [3, 3, 3]
    everything = [p for g in got for p in g]
    assert sorted(everything) == sorted({p for p in everything})  # no item twice
    # rotation: consumer k gets items k, k+3, k+6
    assert got[0] == [b'{"n":0}', b'{"n":3}', b'{"n":6}']


def test_prefetch_is_honoured_and_an_ack_frees_room() -> None:
    engine, _, q = make_engine()
    s, sink, sub = consumer(engine, q, prefetch=3)
    for i in range(10):
        engine.enqueue(q, i)
    run(engine)
    first = items(sink)
    assert [m.tag for m in first] == [1, 2, 3]
    assert all(m.attempt == 1 for m in first)
    run(engine)
    assert items(sink) == []  # nothing more while three are unacknowledged
    ack(engine, s, q, 1, 2)
    run(engine)
    assert [m.tag for m in items(sink)] == [4, 5]  # tags keep increasing
    assert q.snapshot().outstanding == 3 and q.snapshot().acked == 2


def test_channel_prefetch_applies_when_the_consumer_fixes_none() -> None:
    engine, _, q = make_engine(prefetch=2)
    _, sink, sub = consumer(engine, q)
    for i in range(5):
        engine.enqueue(q, i)
    run(engine)
    assert len(items(sink)) == 2 and sub.prefetch == 2


def test_nack_with_requeue_goes_to_the_other_consumer_next() -> None:
    engine, _, q = make_engine()
    a, sink_a, _ = consumer(engine, q, prefetch=1)
    b, sink_b, _ = consumer(engine, q, prefetch=1)
    for i in range(3):
        engine.enqueue(q, i)
    run(engine)
    (ia,) = items(sink_a)
    (ib,) = items(sink_b)
    engine.ack(b, Ack.items(q.number, (ib.tag,)))
    engine.nack(a, q.number, ia.tag, True)
    run(engine)
    # b had room first and the given-back item is at the head: b gets it, second attempt
    (again,) = items(sink_b)
    assert again.payload == ia.payload and again.attempt == 2
    # a, with room again, gets the next new item
    (nxt,) = items(sink_a)
    assert nxt.payload == b"2" and nxt.attempt == 1


def test_a_lost_consumer_gives_its_items_to_the_others_with_attempt_2() -> None:
    engine, _, q = make_engine()
    a, sink_a, _ = consumer(engine, q, prefetch=5)
    b, sink_b, _ = consumer(engine, q, prefetch=5)
    for i in range(4):
        engine.enqueue(q, i)
    run(engine)
    held_by_a = items(sink_a)
    items(sink_b)
    assert len(held_by_a) == 2
    engine.detach(a)  # the connection is gone: no waiting for a resume
    run(engine)
    again = items(sink_b)
    assert [m.payload for m in again] == [m.payload for m in held_by_a]
    assert [m.attempt for m in again] == [2, 2]
    assert q.snapshot().outstanding == 4 and q.snapshot().requeued == 2


def test_a_resumed_consumer_starts_with_nothing_outstanding_and_old_acks_are_ignored() -> None:
    engine, _, q = make_engine()
    a, sink_a, sub = consumer(engine, q, prefetch=2)
    engine.enqueue(q, "x")
    run(engine)
    (first,) = items(sink_a)
    engine.detach(a)
    assert sub.outstanding == {} and len(q.ready) == 1
    engine.attach(a, sink_a)
    run(engine)
    (second,) = items(sink_a)
    assert second.tag == first.tag + 1 and second.attempt == 2
    ack(engine, a, q, first.tag)  # issued earlier, no longer outstanding: ignored
    assert sub.outstanding.keys() == {second.tag} and q.stats.acked == 0


def test_unsubscribe_gives_back_without_counting_a_failure() -> None:
    engine, _, q = make_engine(delivery_limit=1)
    a, sink_a, sub = consumer(engine, q, prefetch=2)
    engine.enqueue(q, "x")
    run(engine)
    items(sink_a)
    engine.unsubscribe(a, q.number)
    run(engine)
    assert any(isinstance(m, Unsubscribed) for f in sink_a.take() for m in f)
    assert len(q.ready) == 1 and q.stats.dead_lettered == 0 and not q.consumers


def test_closed_for_slowness_gives_back_at_once() -> None:
    engine, _, q = make_engine()
    a, sink_a, _ = consumer(engine, q, prefetch=2)
    b, sink_b, _ = consumer(engine, q, prefetch=2)
    engine.enqueue(q, "x")
    run(engine)
    holder, other = (a, sink_b) if items(sink_a) else (b, sink_a)
    engine.close_session(holder, ErrorCode.SLOW_CONSUMER, "slow")
    run(engine)
    (again,) = items(other)
    assert again.payload == b'"x"' and again.attempt == 2


def test_delivery_limit_dead_letters_with_the_attempt_count() -> None:
    engine, _, q = make_engine(delivery_limit=2, dead_letter="jobs.dead")
    dead = engine.queues["jobs.dead"]
    a, sink_a, _ = consumer(engine, q, prefetch=1)
    d, sink_d, _ = consumer(engine, dead, prefetch=1)
    engine.enqueue(q, "poison")
    for _ in range(2):
        run(engine)
        (it,) = items(sink_a)
        engine.nack(a, q.number, it.tag, True)
    run(engine)
    assert items(sink_a) == []
    (dl,) = items(sink_d)
    assert dl.payload == b'"poison"' and dl.attempt == 3  # two deliveries before, this is the 3rd
    assert q.stats.dead_lettered == 1 and q.stats.dropped == 0


def test_nack_without_requeue_dead_letters_or_drops() -> None:
    engine, _, q = make_engine()  # no dead-letter queue: dropped and counted
    a, sink_a, _ = consumer(engine, q, prefetch=1)
    engine.enqueue(q, "x")
    run(engine)
    (it,) = items(sink_a)
    engine.nack(a, q.number, it.tag, False)
    run(engine)
    assert items(sink_a) == [] and not q.ready
    assert (q.stats.nacked, q.stats.dead_lettered, q.stats.dropped) == (1, 1, 1)


def test_max_length_raises_queue_full_and_changes_nothing() -> None:
    engine, _, q = make_engine(max_length=2)
    engine.enqueue(q, 1)
    engine.enqueue(q, 2)
    with pytest.raises(QueueFull) as info:
        engine.enqueue(q, 3)
    assert info.value.code == ErrorCode.TOO_MANY and "jobs.x" in str(info.value)
    assert len(q.ready) == 2 and q.stats.enqueued == 2


def test_given_back_items_are_never_refused_at_max_length() -> None:
    engine, _, q = make_engine(max_length=2)
    a, sink_a, _ = consumer(engine, q, prefetch=2)
    engine.enqueue(q, 1)
    engine.enqueue(q, 2)
    run(engine)
    engine.enqueue(q, 3)
    engine.enqueue(q, 4)
    engine.detach(a)
    assert len(q.ready) == 4  # nothing lost: max_length plus what the consumer held


def test_ids_deduplicate_within_the_window() -> None:
    engine, clock, q = make_engine()
    assert engine.enqueue(q, "a", "job-1") is True
    assert engine.enqueue(q, "again", "job-1") is False
    assert len(q.ready) == 1 and q.stats.duplicates == 1
    clock.advance(601)
    assert engine.enqueue(q, "later", "job-1") is True


def test_bad_tags() -> None:
    engine, _, q = make_engine()
    a, sink_a, sub = consumer(engine, q, prefetch=5)
    b, sink_b, _ = consumer(engine, q, prefetch=5)
    for i in range(4):
        engine.enqueue(q, i)
    run(engine)
    mine = [m.tag for m in items(sink_a)]
    assert mine == [1, 2]
    # a tag never issued to this session: protocol error, and nothing acked before it
    with pytest.raises(ProtocolError) as info:
        ack(engine, a, q, 1, 3)
    assert info.value.code == ErrorCode.PROTOCOL
    with pytest.raises(ProtocolError):
        engine.nack(a, q.number, 99, True)
    assert sub.outstanding.keys() == {1, 2}
    # a topic number the session does not hold: ignored
    engine.ack(a, Ack.items(q.number + 1000, (1,)))
    engine.nack(a, q.number + 1000, 1, True)
    # malformed: the count does not match the tags
    with pytest.raises(ProtocolError):
        engine.ack(a, Ack(q.number, (3, 1)))
    assert sub.outstanding.keys() == {1, 2}
    # an acknowledgement of tag 1 by b acks b's own tag 1, never a's
    ack(engine, b, q, 1)
    assert sub.outstanding.keys() == {1, 2}


def test_server_codel_revokes_what_a_stalled_consumer_holds() -> None:
    engine, clock, q = make_engine()
    a, sink_a, sub = consumer(engine, q, prefetch=10)
    for i in range(6):
        engine.enqueue(q, i)
    run(engine)
    held = items(sink_a)
    assert len(held) == 6
    b, sink_b, _ = consumer(engine, q, prefetch=10)
    # never measured: an item may be out for the unmeasured allowance (1 s) before it is late
    for _ in range(200):
        clock.advance(0.005)
        engine.queue_tick()
    run(engine)
    assert revokes(sink_a) == []
    for _ in range(60):  # 1.3 s: late by 0.3 s, above target for more than an interval
        clock.advance(0.005)
        engine.queue_tick()
    run(engine)
    gone = revokes(sink_a)
    assert gone and gone[0] == held[-1].tag  # the most recently delivered first
    assert gone == sorted(gone, reverse=True)
    moved = items(sink_b)  # b has room: everything revoked went to it
    assert sorted(m.payload for m in moved) == sorted(m.payload for m in held if m.tag in gone)
    assert all(m.attempt == 2 for m in moved)
    # revoked items are not given back to the revoking consumer while it is in CoDel's drop state
    assert items(sink_a) == []
    # an ACK after REVOKE is ignored: the item is not acked twice
    before = q.stats.acked
    ack(engine, a, q, gone[0])
    assert q.stats.acked == before and gone[0] not in sub.outstanding
    assert q.stats.revoked == len(gone)


def test_a_healthy_consumer_is_never_revoked_and_prefetch_converges() -> None:
    # the source document's numbers: 50 ms each way, 4 ms an item -> 100 / 4 + 1 = 26
    engine, clock, q = make_engine()
    sim = Simulation(engine, clock)
    c = sim.add(q, delay=0.050, work=0.004)
    for i in range(2000):
        engine.enqueue(q, i)
    start = clock.now
    sim.run_until(start + 3.0)
    assert 25 <= c.sub.estimator.value <= 27, c.sub.estimator.value
    assert q.stats.revoked == 0
    # saturated once measured: in the last second the consumer worked more than 95 % of it
    last = [t for _, t in c.done if t > start + 2.0]
    assert len(last) * 0.004 > 0.95


def test_prefetch_follows_a_slowdown_and_a_faster_network() -> None:
    engine, clock, q = make_engine()
    sim = Simulation(engine, clock)
    c = sim.add(q, delay=0.050, work=0.004)
    for i in range(5000):
        engine.enqueue(q, i)
    sim.run_until(clock.now + 2.0)
    c.work = 0.040  # ten times slower: 100 / 40 + 1 -> 4
    sim.run_until(clock.now + 3.0)
    assert 3 <= c.sub.estimator.value <= 5, c.sub.estimator.value
    c.work, c.delay = 0.004, 0.010  # faster again, on a faster network: 20 / 4 + 1 = 6
    sim.run_until(clock.now + 25.0)  # the old round trip ages out of the window; a probe
    assert 5 <= c.sub.estimator.value <= 8, c.sub.estimator.value


def _slowdown(codel_target: float | None) -> tuple[float, int]:
    """The source document's worst case: prefetch fixed at 51, then one consumer of two slows
    from 4 to 40 ms an item. Returns the longest wait of an item in the slow consumer's buffer
    after the slowdown and the items revoked; checks that no item was lost."""
    engine, clock, q = make_engine(prefetch=51, codel_target=codel_target)
    sim = Simulation(engine, clock)
    slow = sim.add(q, delay=0.050, work=0.004)
    sim.add(q, delay=0.050, work=0.004)
    for i in range(3000):
        engine.enqueue(q, i)
    sim.run_until(clock.now + 1.0)
    slow.work = 0.040
    t = clock.now
    sim.run_until(clock.now + 3.0)
    worst = max(w for started, w in slow.waits if started > t + 0.5)
    st = q.snapshot()
    assert st.waiting + st.outstanding + st.acked == 3000 and st.dead_lettered == 0
    # what CoDel took back had not been started: nothing was done twice
    for c in sim.consumers:
        assert not {item.tag for item, _ in c.done} & c.revoked
    return worst, q.stats.revoked


def test_server_codel_moves_a_slowed_consumers_backlog_to_the_others() -> None:
    worst_plain, revoked_plain = _slowdown(None)
    worst_codel, revoked_codel = _slowdown(0.020)
    # 17 taken back: only items beyond those in the consumer's hands (the rule that ended
    # revoking items it had started, which took 31 here, some of them done twice)
    assert revoked_plain == 0 and revoked_codel > 10
    assert worst_plain > 1.5  # ~50 items x 40 ms ahead of each new one
    assert worst_codel < worst_plain / 2


def test_estimator_waits_for_measurements() -> None:
    est = PrefetchEstimator(initial=4, maximum=1000, window=10.0)
    assert est.limit == 4 and est.round_trip is None
    est.on_ack(1.104, [1.0])  # first ACK: a sojourn, no processing time yet
    assert est.value == 4 and est.round_trip == pytest.approx(0.104)  # no processing time yet
    # items sent long before the previous ACK: the consumer worked through them back to back,
    # 4 ms each; the first measurement takes three such intervals (the first frame's items),
    # the next ones a round trip of them, and each may at most double the prefetch
    values = []
    for k in range(1, 80):
        est.on_ack(1.104 + 0.004 * k, [1.0])
        values.append(est.value)
    assert est.processing == pytest.approx(0.004)
    assert values[1] == 4 and values[2] == 8  # the first sample, capped at twice the prefetch
    assert values[27] == 8 and values[28] == 16  # a round trip (104 ms) of busy intervals later
    assert sorted(set(values)) == [4, 8, 16, 26] and values[-1] == 26


def test_bunched_acks_do_not_fool_the_estimator() -> None:
    # the consumer works 4 ms an item, but its ACKs reach the server in bursts every 40 ms
    est = PrefetchEstimator(initial=26, maximum=1000, window=10.0)
    est.on_ack(1.104, [1.0])
    t = 1.104
    for _ in range(30):
        t += 0.040
        for i in range(10):  # ten items' ACKs within 0.1 ms
            est.on_ack(t + i * 0.00001, [1.0])
    assert est.processing == pytest.approx(0.004, rel=0.05)
    assert 24 <= est.value <= 28


def test_codel_stops_dropping_when_the_sojourn_falls() -> None:
    c = CoDel(0.020, 0.100)
    assert not c.should_drop(0.030, 0.0)
    assert c.should_drop(0.030, 0.100)
    assert c.dropping
    assert not c.should_drop(0.010, 0.150)
    assert not c.dropping


def test_frames_carry_at_most_batch_items() -> None:
    engine, _, q = make_engine(batch=4)
    _, sink, _ = consumer(engine, q, prefetch=10)
    for i in range(10):
        engine.enqueue(q, i)
    run(engine)
    per_frame = [sum(isinstance(m, Item) for m in decode_frame(f)) for f in sink.frames]
    assert max(per_frame) == 4 and sum(per_frame) == 10


@pytest.mark.parametrize("delay", [0.0005, 0.005, 0.030])
def test_server_codel_never_revokes_what_the_consumer_may_be_working_on(delay: float) -> None:
    """A consumer that works one item at a time is busy with its oldest outstanding item, and
    the ACKs of those it just finished are on their way: a round trip's worth of items plus the
    one in hand. CoDel takes back only items beyond those (as CoDel never drops the last packet
    of a queue), so a revoked item has never been started and nothing is done twice."""
    engine, clock, q = make_engine(prefetch=40, codel_target=0.020, codel_interval=0.100)
    sim = Simulation(engine, clock)
    c = sim.add(q, delay=delay, work=0.020)
    n = 60
    for i in range(n):
        engine.enqueue(q, i)
    sim.run_until(clock.now + 10.0)
    assert q.stats.acked == n and q.stats.revoked > 0
    started = [item.tag for item, _ in c.done]
    assert not set(started) & c.revoked
    assert sorted(int(item.payload) for item, _ in c.done) == list(range(n))


# --------------------------------------------------------------------------- issue 26: exact


def _stalled_consumer(prefetch: int = 10, n: int = 6) -> tuple[Any, ...]:
    """One consumer holding ``n`` items that never ACKs: CoDel (unmeasured: after the 1 s
    allowance) takes back what it holds beyond the two it may have started."""
    engine, clock, q = make_engine()
    a, sink_a, sub = consumer(engine, q, prefetch=prefetch)
    for i in range(n):
        engine.enqueue(q, i)
    run(engine)
    held = items(sink_a)
    assert len(held) == n
    for _ in range(300):  # 1.5 s
        clock.advance(0.005)
        engine.queue_tick()
        run(engine)
    return engine, clock, q, a, sink_a, sub, held


def test_an_ack_that_races_its_revoke_settles_the_item() -> None:
    """protocol.md section 5: a consumer that started an item as its REVOKE was on the way
    finishes it and ACKs; the ACK settles the item if it was not delivered again (here: the
    only consumer, which gets nothing back while CoDel takes items from it), so it is not run
    a second time."""
    engine, clock, q, a, sink_a, sub, held = _stalled_consumer()
    gone = revokes(sink_a)
    assert len(gone) >= 2 and held[0].tag not in gone  # never the oldest, the one in hand
    assert len(q.ready) == len(gone)  # back at the head, not dealt back to the same consumer
    before = q.stats.acked
    ack(engine, a, q, gone[0])  # it had started the newest one, and finished it
    assert q.stats.acked == before + 1 and q.stats.late_acked == 1
    assert len(q.ready) == len(gone) - 1
    ack(engine, a, q, gone[0])  # twice: nothing more
    assert q.stats.acked == before + 1
    # the consumer recovers: it ACKs what it holds and gets the rest, each item once
    ack(engine, a, q, *sub.outstanding)
    for _ in range(200):
        clock.advance(0.005)
        engine.queue_tick()
        run(engine)
        got = items(sink_a)
        ack(engine, a, q, *(m.tag for m in got))
        held += got
    payloads = [m.payload for m in held]
    # six items, six ACKs that counted: the late-acked item never came again, each other one
    # taken back came once more
    assert q.stats.acked == 6 and q.snapshot().waiting == 0 and not sub.outstanding
    late = next(m.payload for m in held if m.tag == gone[0])
    assert payloads.count(late) == 1
    assert sorted(set(payloads)) == sorted(str(i).encode() for i in range(6))
    assert all(payloads.count(p) == 2 for m in held if m.tag in gone[1:] for p in [m.payload])


def test_an_ack_after_the_item_went_to_another_consumer_is_ignored() -> None:
    engine, clock, q, a, sink_a, sub, held = _stalled_consumer()
    gone = revokes(sink_a)
    b, sink_b, _ = consumer(engine, q, prefetch=10)
    run(engine)
    moved = items(sink_b)
    assert {m.payload for m in moved} == {m.payload for m in held if m.tag in gone}
    before = q.stats.acked
    ack(engine, a, q, gone[0])  # delivered again already: that delivery's ACK counts
    assert q.stats.acked == before and q.stats.late_acked == 0
    ack(engine, b, q, *(m.tag for m in moved))
    assert q.stats.acked == before + len(moved)


def test_a_revoked_item_never_goes_straight_back_to_its_consumer() -> None:
    """Measured before: during Redis stalls items were delivered and revoked within 0.2 ms, up
    to 5 times, as each REVOKE freed the prefetch that took the item back. A REVOKE now holds
    the consumer to what it kept until CoDel stops taking items back."""
    engine, clock, q, a, sink_a, sub, held = _stalled_consumer(prefetch=10, n=10)
    frames = [frame for frame in sink_a.take()]
    again = [m for f in frames for m in f if isinstance(m, Item)]
    assert again == []  # nothing re-sent to it while CoDel took items back
    assert q.stats.revoked >= 3 and len(q.ready) == q.stats.revoked
    assert all(it.attempt == 1 for it in q.ready)


@pytest.mark.parametrize("delay", [0.0005, 0.050])
def test_server_codel_follows_the_floors_of_protocol_section_5(delay: float) -> None:
    """A consumer holding 12 items of 100 ms each: target and interval become one and two
    processing times (100 and 200 ms), the queueing delay is ACK time - delivery - round trip -
    processing, and REVOKEs follow interval / sqrt(count) down to what it may have started."""
    engine, clock, q = make_engine(prefetch=12)
    sim = Simulation(engine, clock)
    c = sim.add(q, delay=delay, work=0.100)
    for i in range(12):
        engine.enqueue(q, i)
    run(engine)  # all twelve to the first
    # a second consumer, idle, to take what is revoked
    other = sim.add(q, delay=delay, work=0.001)
    sim.run_until(clock.now + 3.0)
    assert q.stats.acked == 12
    codel = c.sub.codel
    assert codel is not None
    assert codel.target == pytest.approx(0.100, rel=0.05)
    assert codel.interval == pytest.approx(0.200, rel=0.05)
    started = {item.tag for item, _ in c.done}
    assert not started & c.revoked
    # the control law, worked by hand: the delay of item k is 100 ms x (k - 1), above target
    # from the third ACK, so the first REVOKE comes an interval later (the fifth ACK), the next
    # 200 ms after it and the next 141 ms after that. Next door, each one finds 7, 4 and 2
    # items out, and takes back the newest of all three (never the oldest: the one in hand).
    # 50 ms away, the third would reach the consumer as it starts the newer of its two items,
    # so only two are taken back: a revoked item was never started
    assert len(c.revoked) == (3 if delay < 0.01 else 2), c.revoked
    assert len(other.done) == len(c.revoked)


@pytest.mark.parametrize(
    ("delay", "work", "formula"), [(0.050, 0.100, 2), (0.050, 0.004, 26), (0.050, 0.040, 4)]
)
def test_auto_prefetch_is_the_formula_with_at_most_2_while_starving(
    delay: float, work: float, formula: int
) -> None:
    """round trip / processing + 1, plus at most 2 while the consumer starves; a consumer at
    the formula gets each item as it finishes the one before: it is not starving, and the 2
    more would only make its items wait (measured: the seed scenario's slowed consumer went
    from 4 to 6 and back, its items waiting 80 ms more, the p99 after the slowdown 138-176 ms
    from run to run; 137-138 without)."""
    engine, clock, q = make_engine()
    sim = Simulation(engine, clock)
    c = sim.add(q, delay=delay, work=work)
    for i in range(3000):
        engine.enqueue(q, i)
    seen: list[int] = []
    for _ in range(40):
        sim.run_until(clock.now + 0.25)
        seen.append(c.sub.estimator.value)
    assert formula <= seen[-1] <= formula + 2, seen
    assert max(seen[len(seen) // 2 :]) <= formula + 2, seen
    assert c.sub.estimator.extra <= 2
    assert set(seen[len(seen) // 2 :]) == {formula}, seen  # fed just in time: not starving


def _stalls(c: Any, sim: Simulation, every: float, length: float, until: float) -> None:
    """The consumer's event loop blocks ``length`` every ``every`` seconds: nothing is
    started, and nothing it finished is ACKed, until it ends."""
    t = sim.clock.now + every
    while t < until:
        sim.at(t, _block, c, sim, length)
        t += every


def _block(c: Any, sim: Simulation, length: float) -> None:
    c.busy_until = max(c.busy_until, sim.clock.now + length)
    sim.at(sim.clock.now + length, sim._start, c)


def test_stalls_do_not_cut_the_prefetch_of_a_fast_consumer() -> None:
    """Measured before: a consumer's loop blocked 300 ms every 3 s pushed the estimate of a
    4 ms job to 49 ms and the prefetch to 1. One sample spoiled by a stall is outvoted."""
    engine, clock, q = make_engine()
    sim = Simulation(engine, clock)
    c = sim.add(q, delay=0.050, work=0.004)
    for i in range(9000):
        engine.enqueue(q, i)
    sim.run_until(clock.now + 3.0)
    start = clock.now
    _stalls(c, sim, 3.0, 0.300, start + 20.0)
    values, processing = [], []
    while clock.now < start + 20.0:
        sim.run_until(clock.now + 0.1)
        values.append(c.sub.estimator.value)
        processing.append(c.sub.estimator.processing)
    assert max(processing) < 0.006, max(processing)
    assert min(values[10:]) >= 20, values
    # and the consumer stayed busy between the stalls: 17 s of work at 4 ms in 20 s
    assert sum(1 for _, t in c.done if t > start) * 0.004 > 0.80 * 17.0


def test_a_starving_consumer_whose_estimate_was_too_high_recovers() -> None:
    """A consumer slowed to 40 ms for a while, then back to 4 ms: its items never wait at the
    prefetch the slow spell left, so it shows no busy interval; its pace (items finished per
    round trip) bounds its processing time, and the prefetch climbs back to the formula."""
    engine, clock, q = make_engine()
    sim = Simulation(engine, clock)
    c = sim.add(q, delay=0.050, work=0.040)
    for i in range(9000):
        engine.enqueue(q, i)
    sim.run_until(clock.now + 4.0)
    assert c.sub.estimator.value <= 6
    c.work = 0.004
    sim.run_until(clock.now + 6.0)
    assert 24 <= c.sub.estimator.value <= 28, c.sub.estimator.value

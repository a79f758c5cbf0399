"""The prefetch allowance (protocol.md section 5, revised 2026-11-27), sans-IO on a fake clock.

Without a fixed prefetch the server may also let a consumer hold what waits no longer than
CoDel's target, target / processing time items: here the estimated prefetch is at least that
many, the time per item being the median of the recent samples (engine/queues/prefetch.py says
why a floor and not an addition to the formula, and why the median).
"""

from __future__ import annotations

import math

import pytest

from rubris_asgi.engine.engine import Engine
from rubris_asgi.engine.queues import PrefetchEstimator, QueueSettings, QueueTopic
from rubris_asgi.protocol import Item, decode_frame

from .queuekit import Simulation, consumer, make_engine

_DEFAULT = QueueSettings().codel_target
assert _DEFAULT is not None
TARGET: float = _DEFAULT
TARGET_ITEMS = math.floor(TARGET / 0.0001 + 1e-6)  # 100 µs items: 200 with the default 20 ms


def _busy(est: PrefetchEstimator, first_ack: float, rtt: float, work: float, n: int) -> list[int]:
    """One item sent at 1.0 comes back ``rtt`` + ``work`` later (a clean round trip), then
    ``n`` ACKs of items that were waiting at the consumer, ``work`` apart. Returns the limit
    after each ACK."""
    est.on_ack(first_ack, [1.0])
    limits = []
    for k in range(1, n + 1):
        est.on_ack(first_ack + work * k, [1.0])
        limits.append(est.limit)
    assert est.round_trip == pytest.approx(rtt)
    return limits


def test_no_measurements_keep_the_initial_prefetch() -> None:
    est = PrefetchEstimator(initial=4, maximum=1000, window=10.0, target=TARGET)
    assert est.limit == 4 and est.allowance == 0
    est.on_ack(1.0011, [1.0])  # a round trip, no processing time yet: nothing to size it by
    assert est.limit == 4 and est.allowance == 0 and est.target_items == 0
    engine, _, q = make_engine()
    _, _, sub = consumer(engine, q)
    assert sub.prefetch == QueueSettings().initial_prefetch


@pytest.mark.parametrize("target", [0.005, TARGET])
def test_4ms_jobs_a_round_trip_away_do_not_see_it(target: float) -> None:
    """The source document's consumer: 26 items cover the round trip; 5 ms or 20 ms of its
    4 ms jobs (1 or 5 items) are fewer, so the prefetch is the formula's, as without it."""
    est = PrefetchEstimator(initial=4, maximum=1000, window=10.0, target=target)
    limits = _busy(est, 1.104, 0.100, 0.004, 80)
    assert est.processing == pytest.approx(0.004)
    assert est.target_items == math.floor(target / 0.004)
    assert est.value == 26 and limits[-1] == 26 and est.allowance == 0


def test_cheap_items_get_what_they_work_through_within_the_target() -> None:
    """100 µs items 1 ms away: the formula says 11 (their frames would carry a few items
    each); the allowance makes it target / 100 µs, 200 with the default target, reached by
    slow start (the whole prefetch at most doubled by one measurement)."""
    est = PrefetchEstimator(initial=4, maximum=1000, window=10.0, target=TARGET)
    limits = _busy(est, 1.0011, 0.001, 0.0001, 2000)
    assert est.processing == pytest.approx(0.0001)
    assert est.value == 11
    assert est.target_items == TARGET_ITEMS == 200
    assert est.limit == est.full == 200 and est.allowance == 189
    before = 4
    for limit in limits:
        assert limit <= 2 * before, limits
        before = limit
    # the channel's maximum still caps it
    capped = PrefetchEstimator(initial=4, maximum=64, window=10.0, target=TARGET)
    _busy(capped, 1.0011, 0.001, 0.0001, 2000)
    assert capped.limit == 64 and capped.value == 11


def test_the_allowance_goes_by_the_median_pace_the_formula_by_the_smallest() -> None:
    """Consumers sharing a process take turns: its busy spans come out at 100 or 200 µs an
    item. The formula takes the smallest (the others' turns are not its work); the allowance
    the median, since its items wait through the others' turns just the same: 20 ms of the
    pace it keeps, not of its best span."""
    est = PrefetchEstimator(initial=4, maximum=1000, window=10.0, target=TARGET)
    t = 1.0011
    est.on_ack(t, [1.0])
    for _ in range(3):  # the first, short sample
        t += 0.0001
        est.on_ack(t, [1.0])
    for block in range(11):  # spans of 1.2 ms (a sample each): 200, 100, 200, ... µs an item
        work, n = (0.0002, 6) if block % 2 == 0 else (0.0001, 12)
        for _ in range(n):
            t += work
            est.on_ack(t, [1.0])
    assert sorted(round(x * 1e6) for x in est.samples) == [100, 100, 200, 200, 200]
    assert est.processing == pytest.approx(0.0001) and est.value == 11
    assert est.target_items == 100 and est.limit == 100


def test_no_allowance_with_codel_off() -> None:
    """Nothing would take back what waits too long, so nothing is made to wait by design."""
    est = PrefetchEstimator(initial=4, maximum=1000, window=10.0, target=None)
    _busy(est, 1.0011, 0.001, 0.0001, 2000)
    assert est.limit == est.value == 11 and est.allowance == 0
    engine, clock, q = make_engine(codel_target=None)
    sim = Simulation(engine, clock)
    c = sim.add(q, delay=0.0005, work=0.0001)
    _fill(engine, q, 5000)
    sim.run_until(clock.now + 0.3)
    assert c.sub.prefetch == 11


def _fill(engine: Engine, q: QueueTopic, n: int) -> None:
    for i in range(n):
        engine.enqueue(q, i)


def test_a_healthy_cheap_consumer_holds_it_and_codel_leaves_it_alone() -> None:
    """By construction the allowance's items wait no longer than the target: the consumer
    holds 200, nothing is revoked, through round-trip probes (every ``rtt_window``)."""
    engine, clock, q = make_engine(max_length=200_000, rtt_window=1.0)
    sim = Simulation(engine, clock)
    c = sim.add(q, delay=0.0005, work=0.0001)
    _fill(engine, q, 40_000)
    start = clock.now
    held = []
    probes = 0
    while clock.now < start + 3.5:
        sim.run_until(clock.now + 0.05)
        held.append(len(c.sub.outstanding) + len(c.sub.lane))
        probes += bool(c.sub.estimator.probe_from)
    assert probes > 0
    assert c.sub.prefetch == TARGET_ITEMS and c.sub.estimator.value == 11
    assert max(held) == TARGET_ITEMS
    assert q.stats.revoked == 0
    late = [w for started, w in c.waits if started > start + 1.0]
    assert max(late) <= TARGET
    # the consumer is saturated: 2.5 s of 100 µs items in the last 2.5 s, the probes aside
    assert sum(1 for _, t in c.done if t > start + 1.0) * 0.0001 > 0.98 * 2.5


def test_a_fixed_prefetch_stays_as_fixed() -> None:
    for settings, asked, fixed in [({}, 10, 10), ({"prefetch": 7}, None, 7)]:
        engine, clock, q = make_engine(**settings)
        sim = Simulation(engine, clock)
        c = sim.add(q, delay=0.0005, work=0.0001, prefetch=asked)
        _fill(engine, q, 9000)
        most = 0
        for _ in range(40):
            sim.run_until(clock.now + 0.01)
            assert c.sub.prefetch == fixed
            most = max(most, len(c.sub.outstanding) + len(c.sub.lane))
        assert most == fixed
        per_frame = [sum(isinstance(m, Item) for m in decode_frame(f)) for f in c.sink.frames]
        assert max(per_frame, default=0) <= fixed


@pytest.mark.slow  # simulated seconds of a consumer slowing down: about 3 s of CPU
def test_the_allowance_is_withheld_while_codel_holds_the_consumer() -> None:
    """A cheap consumer holding 200 slows down twentyfold: its items wait far beyond target,
    CoDel takes them back, and from then on (its cap, its ceiling) it gets no more than the
    formula's value, whatever the allowance (still sized by the old processing time) says."""
    engine, clock, q = make_engine(max_length=200_000)
    sim = Simulation(engine, clock)
    slow = sim.add(q, delay=0.0005, work=0.0001)
    sim.add(q, delay=0.0005, work=0.0001)
    _fill(engine, q, 60_000)
    sim.run_until(clock.now + 1.0)
    assert slow.sub.prefetch == TARGET_ITEMS
    slow.work = 0.002
    held_to_value = withheld = 0
    end = clock.now + 3.0
    while clock.now < end:
        sim.run_until(clock.now + 0.001)
        sub, est = slow.sub, slow.sub.estimator
        if sub.capped_until or sub.ceiling:
            held = len(sub.outstanding) + len(sub.lane)
            assert sub.credit() <= est.value - held, (sub.credit(), est.value, held)
            held_to_value += 1
            if est.full > est.value:
                withheld += 1
    assert q.stats.revoked > 0
    assert held_to_value > 0 and withheld > 0  # the hold was seen while the allowance stood
    # nothing lost on the way: every item is waiting, out or acknowledged
    st = q.snapshot()
    assert st.waiting + st.outstanding + st.acked == 60_000 and st.dead_lettered == 0
    # the slowed consumer ends with what its new pace calls for: 20 ms of 2 ms items
    assert slow.sub.estimator.processing == pytest.approx(0.002, rel=0.1)
    assert slow.sub.estimator.target_items <= 10

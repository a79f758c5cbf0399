"""RateLimiter (the NAK rate controller of the flow-control source document) on a fake clock.

The clock only moves when a test moves it and the sleeps are recorded instead of slept, so every
assertion is arithmetic from the module's description, not a timing.
"""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubris_asgi.control import ratelimit
from rubris_asgi.control.ratelimit import RateLimiter, RateStats


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def limiter(clock: Clock, **kwargs: float) -> RateLimiter:
    """initial 1000/s, floor 1/s, window 50 ms, step 100 ms, growth 10 %, unless told."""
    args = {"initial": 1000.0, "floor": 1.0, **kwargs}
    return RateLimiter(clock=clock, **args)  # type: ignore[arg-type]


def test_the_module_example_runs() -> None:
    assert doctest.testmod(ratelimit).failed == 0


def test_starts_at_initial_with_nothing_counted() -> None:
    assert RateLimiter().rate == 1_000_000.0
    lim = limiter(Clock())
    assert lim.stats == RateStats(rate=1000.0, naks=0, naks_ignored=0, cuts=0, last_fill=None)


@pytest.mark.parametrize(
    ("fill", "rate"),
    [(50, 500.0), (74, 500.0), (75, 250.0), (86, 250.0), (87, 125.0), (99, 125.0), (100, 10.0)],
)
def test_each_strength_cuts_by_its_share(fill: int, rate: float) -> None:
    lim = limiter(Clock(), floor=10.0)
    lim.on_nak(fill)
    assert lim.rate == rate
    assert lim.stats == RateStats(rate=rate, naks=1, naks_ignored=0, cuts=1, last_fill=fill)


def test_a_fill_above_100_counts_as_100() -> None:
    lim = limiter(Clock(), floor=10.0)
    lim.on_nak(130)
    assert lim.rate == 10.0


def test_below_50_is_ignored() -> None:
    lim = limiter(Clock())
    lim.on_nak(49)
    lim.on_nak(0)
    assert lim.stats == RateStats(rate=1000.0, naks=2, naks_ignored=2, cuts=0, last_fill=0)
    lim.on_fill(49)  # not a NAK at all: nothing counted
    assert lim.stats.naks == 2 and lim.stats.last_fill == 0
    lim.on_fill(75)
    assert lim.stats == RateStats(rate=250.0, naks=3, naks_ignored=2, cuts=1, last_fill=75)


def test_the_strongest_nak_in_the_window_wins_without_compounding() -> None:
    clock = Clock()
    lim = limiter(clock)
    lim.on_nak(50)
    assert lim.rate == 500.0
    clock.advance(0.010)
    lim.on_nak(87)  # stronger: 1/8 of the base 1000, not 1/8 of 500
    assert lim.rate == 125.0
    clock.advance(0.010)
    lim.on_nak(87)  # equal
    lim.on_nak(50)  # weaker
    assert lim.rate == 125.0
    clock.advance(0.020)  # 40 ms into the window
    lim.on_nak(100)  # strongest: to the floor
    assert lim.rate == 1.0
    assert lim.stats == RateStats(rate=1.0, naks=5, naks_ignored=2, cuts=3, last_fill=100)


def test_a_weaker_nak_after_a_stronger_one_changes_nothing() -> None:
    clock = Clock()
    lim = limiter(clock)
    lim.on_nak(87)
    clock.advance(0.030)
    lim.on_nak(50)
    assert lim.rate == 125.0
    assert lim.stats.naks_ignored == 1 and lim.stats.cuts == 1


def test_a_nak_after_the_window_cuts_again_from_the_current_limit() -> None:
    clock = Clock()
    lim = limiter(clock)
    lim.on_nak(50)
    clock.advance(0.060)  # window over, no recovery step yet
    lim.on_nak(50)
    assert lim.rate == 250.0
    clock.advance(0.060)
    lim.on_nak(75)  # a new window: its base is 250
    assert lim.rate == 62.5
    clock.advance(0.010)
    lim.on_nak(87)  # stronger within it: 1/8 of 250
    assert lim.rate == 31.25


def test_with_a_zero_window_every_nak_cuts() -> None:
    lim = limiter(Clock(), window=0.0)
    lim.on_nak(50)
    lim.on_nak(50)
    assert lim.rate == 250.0


def test_naks_at_the_floor_are_ignored_and_counted() -> None:
    clock = Clock()
    lim = limiter(clock, floor=100.0)
    lim.on_nak(87)
    assert lim.rate == 125.0
    clock.advance(0.060)
    lim.on_nak(87)  # 125 / 8 is below the floor
    assert lim.rate == 100.0
    clock.advance(0.060)
    lim.on_nak(50)
    lim.on_nak(100)
    assert lim.stats == RateStats(rate=100.0, naks=4, naks_ignored=2, cuts=2, last_fill=100)
    clock.advance(0.050)  # 110 ms since the last cut: one step up, off the floor
    assert lim.rate == pytest.approx(110.0)
    lim.on_nak(100)
    assert lim.rate == 100.0 and lim.stats.cuts == 3


@pytest.mark.parametrize(
    ("elapsed", "rate"),
    [
        (0.0, 500.0),
        (0.099, 500.0),  # k = 0
        (0.1, 550.0),  # k = 1: + 500 * 10 %
        (0.2, 650.0),  # k = 2: + 500 * 20 %
        (0.3, 800.0),  # k = 3: + 500 * 30 %
        (0.399, 800.0),
        (0.4, 1000.0),  # k = 4 reaches initial exactly
        (0.5, 1000.0),  # k = 5 would be 1250: capped
        (3600.0, 1000.0),
    ],
)
def test_recovery_steps(elapsed: float, rate: float) -> None:
    clock = Clock()
    lim = limiter(clock)
    lim.on_nak(50)
    clock.now = elapsed
    assert lim.rate == pytest.approx(rate)


def test_recovery_counts_from_a_stronger_cut_in_the_window() -> None:
    clock = Clock()
    lim = limiter(clock)
    lim.on_nak(50)
    clock.now = 0.040
    lim.on_nak(87)  # 125, and k counts from here
    clock.now = 0.120
    assert lim.rate == 125.0
    clock.now = 0.140
    assert lim.rate == pytest.approx(137.5)


def test_a_nak_during_recovery_cuts_from_the_recovered_limit() -> None:
    clock = Clock()
    lim = limiter(clock)
    lim.on_nak(50)
    clock.now = 0.2
    assert lim.rate == pytest.approx(650.0)
    lim.on_nak(75)
    assert lim.rate == pytest.approx(162.5)
    clock.now = 0.21
    lim.on_nak(87)  # stronger in the window: 1/8 of the recovered 650
    assert lim.rate == pytest.approx(81.25)
    clock.now = 0.31  # recovery starts over from the new cut
    assert lim.rate == pytest.approx(81.25 * 1.1)


def test_recovery_never_passes_initial_and_stays_there() -> None:
    clock = Clock()
    lim = limiter(clock, growth=5.0)
    lim.on_nak(100)
    clock.now = 0.1  # 1 * (1 + 5) = 6
    assert lim.rate == pytest.approx(6.0)
    clock.now = 10.0
    assert lim.rate == 1000.0
    lim.on_nak(50)  # from initial again
    assert lim.rate == 500.0


def test_reserve_is_free_within_the_burst_then_waits_out_the_debt() -> None:
    clock = Clock()
    lim = limiter(clock, initial=100.0)  # a bucket of 100/s x 50 ms = 5 messages
    assert [lim.reserve() for _ in range(5)] == [0.0] * 5
    assert lim.reserve() == 0.0  # the bucket is empty, not in debt: this one borrows
    assert lim.reserve() == pytest.approx(0.01)  # one message of debt at 100/s
    assert lim.reserve(3) == pytest.approx(0.02)
    assert lim.reserve() == pytest.approx(0.05)  # 2 + 3 messages owed
    clock.advance(0.06)
    assert lim.reserve() == 0.0  # everything repaid
    clock.advance(10.0)
    assert [lim.reserve() for _ in range(6)] == [0.0] * 6  # the bucket holds 5, not more
    assert lim.reserve() == pytest.approx(0.01)


def test_a_batch_larger_than_the_bucket_goes_now_and_the_next_caller_waits() -> None:
    clock = Clock()
    lim = RateLimiter(clock=clock)  # 1,000,000/s: a bucket of 50,000
    lim.on_nak(100)  # to the floor, 100/s: the bucket shrinks to 5
    assert lim.rate == 100.0
    assert lim.reserve(1000) == 0.0
    assert lim.reserve() == pytest.approx(9.95)  # (1000 - 5) / 100


def test_try_acquire_refuses_in_debt_and_takes_nothing() -> None:
    clock = Clock()
    lim = limiter(clock, initial=100.0)
    assert all(lim.try_acquire() for _ in range(5))
    assert lim.try_acquire(10)  # not in debt yet: it may borrow
    assert not lim.try_acquire()
    assert not lim.try_acquire()
    assert lim.reserve(0) == pytest.approx(0.10)  # the refusals took nothing
    clock.advance(0.099)
    assert not lim.try_acquire()
    clock.advance(0.001)
    assert lim.try_acquire()


async def test_acquire_awaits_the_wait() -> None:
    clock = Clock()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)

    lim = RateLimiter(initial=100.0, floor=1.0, clock=clock, sleep=sleep)
    for _ in range(6):
        await lim.acquire()
    assert slept == []
    await lim.acquire(4)
    await lim.acquire()
    assert slept == [pytest.approx(0.01), pytest.approx(0.04)]
    assert clock.now == pytest.approx(0.05)


def test_acquire_blocking_sleeps_the_wait() -> None:
    clock = Clock()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)

    lim = RateLimiter(clock=clock, blocking_sleep=sleep)
    lim.on_nak(100)
    lim.acquire_blocking(1000)
    lim.acquire_blocking()
    assert slept == [pytest.approx(9.95)]


@pytest.mark.parametrize("rate", [100.0, 1000.0, 5000.0])
@pytest.mark.parametrize("n", [1, 10])
def test_throughput_over_a_minute_is_the_rate(rate: float, n: int) -> None:
    clock = Clock()
    lim = RateLimiter(initial=rate, floor=rate, clock=clock, blocking_sleep=clock.advance)
    sent = 0
    while True:
        lim.acquire_blocking(n)
        if clock.now >= 60.0:
            break
        sent += n
    assert sent / 60.0 == pytest.approx(rate, rel=0.01)


async def test_async_throughput_after_a_cut_is_the_cut_rate() -> None:
    clock = Clock()

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    lim = RateLimiter(clock=clock, sleep=sleep, step=1e9)  # no recovery within the minute
    lim.on_nak(75)
    sent = 0
    while True:
        await lim.acquire(100)
        if clock.now >= 60.0:
            break
        sent += 100
    assert sent / 60.0 == pytest.approx(250_000.0, rel=0.01)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"floor": 0.0}, "floor"),
        ({"floor": -1.0}, "floor"),
        ({"floor": float("nan")}, "floor"),
        ({"initial": 50.0}, "initial"),
        ({"initial": float("inf")}, "initial"),
        ({"window": -0.1}, "window"),
        ({"step": 0.0}, "step"),
        ({"growth": 0.0}, "growth"),
        ({"growth": -0.1}, "growth"),
        ({"burst": -1.0}, "burst"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name} must be"):
        RateLimiter(**kwargs)  # type: ignore[arg-type]


def test_a_negative_count_is_refused() -> None:
    lim = RateLimiter()
    with pytest.raises(ValueError, match="^n must be"):
        lim.reserve(-1)
    with pytest.raises(ValueError, match="^n must be"):
        lim.try_acquire(-1)


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("nak"), st.integers(-10, 150)),
        st.tuples(st.just("fill"), st.integers(0, 100)),
        st.tuples(st.just("advance"), st.floats(0.0, 5.0)),
        st.tuples(st.just("reserve"), st.integers(0, 5000)),
    ),
    max_size=60,
)


@given(
    floor=st.floats(0.5, 1000.0),
    headroom=st.floats(1.0, 1e4),
    window=st.floats(0.0, 0.5),
    step=st.floats(0.001, 1.0),
    growth=st.floats(0.001, 10.0),
    ops=_OPS,
)
def test_the_limit_stays_between_floor_and_initial(
    floor: float,
    headroom: float,
    window: float,
    step: float,
    growth: float,
    ops: list[tuple[str, float]],
) -> None:
    clock = Clock()
    initial = floor * headroom
    lim = RateLimiter(
        initial=initial, floor=floor, window=window, step=step, growth=growth, clock=clock
    )
    for op, value in ops:
        before = lim.rate
        if op == "nak":
            lim.on_nak(int(value))
        elif op == "fill":
            lim.on_fill(int(value))
        elif op == "advance":
            clock.advance(value)
            assert lim.rate >= before  # without a NAK the limit only rises
        else:
            assert lim.reserve(int(value)) >= 0.0
        assert floor <= lim.rate <= initial
    stats = lim.stats
    assert stats.naks_ignored + stats.cuts == stats.naks


def test_a_publisher_sending_below_its_limit_is_cut_from_what_it_sends() -> None:
    clock = Clock()
    lim = limiter(clock, initial=100_000.0)
    for _ in range(60):  # 200 messages/s for 0.6 s, far below the 100,000/s limit
        lim.reserve(2)
        clock.advance(0.01)
    lim.on_nak(50)
    assert lim.rate == pytest.approx(100.0, rel=0.05)  # half of 200/s, not half of 100,000/s
    assert lim.stats.cuts == 1


def test_an_idle_publisher_keeps_its_limit_on_a_nak() -> None:
    clock = Clock()
    lim = limiter(clock, initial=100_000.0)
    lim.reserve(10)
    clock.advance(5.0)  # then nothing for 5 s
    lim.on_nak(50)
    assert lim.rate == 50_000.0

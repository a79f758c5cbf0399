"""How many unacknowledged items a consumer should hold: the source document on prefetch.

A consumer is kept busy, with nothing waiting in its buffer, when it holds enough items to cover
one round trip: ``round trip / processing time + 1`` (50 ms each way and 4 ms an item: 100 / 4 +
1 = 26). That is ``(round trip + processing) / processing``: the time an item takes from the
server back to the server when it does not wait, divided by the time the consumer spends on it.
The server measures both from the consumer's ACKs alone, so any client benefits:

- ``sojourn``: the smallest delivery-to-ACK time seen over ``window`` seconds. The smallest,
  because an item that did not wait in the consumer's buffer took exactly round trip +
  processing; an item that waited took longer.
- ``processing``: the interval between two ACKs when every item of the second had reached the
  consumer before it finished the first (they were sent in the same frame as, or before, the
  first's newest item, or at least a sojourn before the first ACK), so it worked through
  them back to back. Such intervals are summed until they span a round trip, and the sum
  divided by the items they ended is one sample: ACKs that arrive bunched (a pause on either
  side) give one long interval and many near-zero ones, and only their sum says how fast the
  consumer worked.

Three corrections keep it honest.

- *Stalls.* A consumer whose event loop stalls (a garbage collection, a blocking call, a busy
  machine) sends no ACK for a while, and the sample that spans the stall makes items look
  slow. One such sample must not cut the prefetch of a consumer that is fast again the moment
  the stall ends (measured: a 300 ms stall every 3 s pushed a moving mean from 4 ms to 49 ms
  and the prefetch to 1). So the processing time is the *smallest* of the last
  ``SAMPLES`` samples, as BBR keeps the largest delivery rate of a window: a stall spoils one
  sample and is ignored; a consumer that really slows down spoils them all, and the estimate
  follows after ``SAMPLES`` samples (a few round trips; meanwhile CoDel takes back what waits).
- *Starving.* An estimate that is too small starves the consumer, and a starving consumer never
  shows its processing time (nothing waits): so when an ACK arrives from a consumer that held
  all it was allowed while items were waiting in the queue, and its items did not wait (it was
  idle between its previous ACK and this item's arrival), the prefetch grows by one, at most
  once a round trip and at most ``STARVING_MAX`` above what the measurements call for
  (protocol.md section 5), until items wait and a measurement takes over. A measurement may at
  most double the prefetch (TCP's slow start), so one measurement gone wrong cannot hand a
  consumer hundreds of items at once.
- *A hidden round trip.* An estimate that is too large hides the round trip (every item waits,
  and the smallest delivery-to-ACK time then only says how long the buffer is): so when the
  smallest sample is ``window`` old the estimator *probes*, as BBR's ProbeRTT does: the
  consumer is held to one item in flight until one item sent with nothing else outstanding is
  acknowledged, which measures round trip + processing cleanly. The consumer drains its buffer
  meanwhile; the probe costs about one round trip of idleness per ``window``.

The *allowance* (protocol.md section 5, revised 2026-11-27: the server may also add what waits
no longer than CoDel's target, target / processing time items): the prefetch is at least
``floor(target / pace)``, what the consumer works through within the channel's
``codel_target`` (nothing with CoDel off: nothing would take back what waits too long). The
formula sizes the buffer to be empty when an item arrives, right when the round trip is long
against a job, but cheap items then come a few to a frame and each frame's fixed cost
dominates (100 µs items 1 ms away: 11 items; benchmarks.md: 4 consumers ACKing at once on a
saturated core got 3-9, 22,046 items/s producer to ACK, 29,969 with a frame's worth fixed).

- *At least, not added to the formula.* The formula already covers the round trip, so what is
  added on top waits in the consumer, a whole target's worth for every item: the source
  document's doubled prefetch again, for the 4 ms jobs it is about. Measured (bench/queues.py's
  scenario, auto+CoDel, 3 runs each, alternated): added, p50 87 -> 104 ms, p99 after the
  slowdown 139-141 -> 173-207 ms (target 150) and client CoDel give-backs 17-19 -> 70-100
  (items waiting exactly target, pushed over it by any jitter); as a floor, as before. It is
  invisible where the formula holds more than the target's worth (those 4 ms jobs: 26 > 20 /
  4), as protocol.md says, and cheap items get it (100 µs: 200, frames full); what it adds
  waits at most target - round trip - processing.
- *The pace* is the median of the recent samples, not ``processing`` (their smallest, which
  the formula wants: ``_allow`` says why).
- *It cannot defeat CoDel*, by construction: CoDel takes back what waits longer than target,
  and none of it does while the consumer keeps its pace. When it slows down its items do wait
  longer, CoDel takes them back, and from then on the consumer is held to ``value``, the
  formula without the floor (consumer.py).
- *Slow start.* The floor grows as the formula does (a measurement at most doubles the whole
  prefetch: a first sample from a few bunched ACKs, a time per item far too small, cannot hand
  out hundreds of items at once) and shrinks at once when the pace slows.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

SAMPLES = 5
"""Processing-time samples kept: the estimate is the smallest (robust to stalls)."""
RECENT_INTERVALS = 4
"""ACK intervals that say how fast the consumer goes right now (``fastest``)."""
IDLE_FRACTION = 0.25
"""A consumer starves when it waited more than this share of a processing time for an item."""
FIRST_ITEMS = 3
"""Back-to-back items that make the first sample (later ones span a round trip)."""
STARVING_MAX = 2
"""How far above the measured prefetch a starving consumer may grow (protocol.md section 5)."""
SLACK = 1e-4
"""Clock slack (seconds) when deciding whether an item was already waiting at the consumer."""


class PrefetchEstimator:
    """Round trip, processing time and the prefetch they call for, for one consumer.

    ``target``: the channel's CoDel target (None or 0: CoDel off), what the allowance's items
    may wait.
    """

    __slots__ = (
        "initial",
        "maximum",
        "window",
        "target",
        "target_items",
        "sojourn",
        "sojourn_at",
        "sojourn_p",
        "processing",
        "samples",
        "first",
        "last_ack",
        "last_sent",
        "busy_time",
        "busy_items",
        "probe_from",
        "grown_at",
        "measured",
        "extra",
        "span_from",
        "span_items",
        "span_sojourn",
        "starved",
        "pace",
        "pace_wants",
        "intervals",
    )

    def __init__(
        self, initial: int, maximum: int, window: float, target: float | None = None
    ) -> None:
        if not 1 <= initial <= maximum:
            raise ValueError(f"initial prefetch must be in [1, {maximum}], got {initial}")
        self.initial = initial
        self.maximum = maximum
        self.window = window
        self.target = target or 0.0
        """CoDel's target (0: CoDel off, no allowance): nothing takes back what waits too long
        then, so nothing is made to wait by design either."""
        self.target_items = 0
        """The allowance's floor: ``target / pace`` rounded down (what the consumer works through
        within ``target``), grown at most as fast as slow start lets the prefetch grow."""
        self.sojourn = math.inf
        """The smallest delivery-to-ACK time seen lately: round trip + processing."""
        self.sojourn_at = 0.0
        self.sojourn_p = 0.0
        """The processing time when ``sojourn`` was seen (0: not measured then)."""
        self.processing = 0.0
        """Seconds per item: the smallest recent sample (0: not measured yet)."""
        self.samples: deque[float] = deque(maxlen=SAMPLES)
        self.first = 0.0
        """The first sample, from a few items worked back to back (until ``samples`` has one)."""
        self.last_ack = 0.0
        self.last_sent = 0.0
        """When the newest item of the previous ACK was sent."""
        self.busy_time = 0.0
        self.busy_items = 0
        """Busy intervals and the items they ended, summed until they span a round trip."""
        self.probe_from = 0.0
        """While probing: when the probe began (deliveries sent since then are clean)."""
        self.grown_at = 0.0
        self.measured = initial
        """The prefetch the measurements call for (``initial`` until they exist)."""
        self.extra = 0
        """Added while the consumer starves, at most ``STARVING_MAX``; a measurement resets it."""
        self.span_from = 0.0
        self.span_items = 0
        self.span_sojourn = 0.0
        self.starved = False
        """ACKs since ``span_from`` (a round trip's worth make a pace), and whether the
        consumer starved meanwhile."""
        self.pace = 0.0
        """Seconds per item the consumer finished over the last span, when it starved."""
        self.pace_wants = 0
        """The items in flight that pace, at the span's mean delivery-to-ACK time, calls for."""
        self.intervals: deque[float] = deque(maxlen=RECENT_INTERVALS)
        """The latest intervals between ACKs, per item: how fast the consumer goes right now."""

    @property
    def value(self) -> int:
        """The measured prefetch: the formula, plus what starving added. What a consumer is held
        to while CoDel takes items back from it (``QueueSub.credit``)."""
        return min(self.maximum, self.measured + self.extra)

    @property
    def full(self) -> int:
        """The prefetch this consumer gets when CoDel does not hold it: ``value``, or the
        allowance's ``target_items`` when that is more, at most ``maximum``."""
        return min(self.maximum, max(self.measured + self.extra, self.target_items))

    @property
    def allowance(self) -> int:
        """What the allowance adds to ``value`` (0 where the formula holds more)."""
        return self.full - self.value

    @property
    def round_trip(self) -> float | None:
        """The round trip without processing, once measured: the smallest delivery-to-ACK time
        less the processing time of that moment (so a consumer that slows down later does not
        shrink it); the whole of it when processing was not measured yet (erring large)."""
        if self.sojourn == math.inf:
            return None
        return max(0.0, self.sojourn - self._processing_then())

    def _processing_then(self) -> float:
        """What to take off the smallest sojourn for the round trip: the processing time when
        it was seen, or now if that is less (an early estimate too large must not leave the
        round trip at nothing for good: measured, consumers that ACK at once held 1-2 items)."""
        then, now = self.sojourn_p, self.processing
        return min(then, now) if then and now else then

    @property
    def fastest(self) -> float:
        """Seconds per item at the fastest the consumer may be going now: the processing time,
        or less when its latest ACKs came faster (0: unknown). What CoDel must assume of
        how many items it may have started (``QueueSub.in_hand``): erring small is safe."""
        p = self.processing
        if p and self.intervals:
            p = min(p, min(self.intervals))
        return p

    @property
    def limit(self) -> int:
        """Unacknowledged items the consumer may hold now: 1 while probing."""
        return 1 if self.probe_from else self.full

    def on_ack(self, now: float, sent: Sequence[float], starving: bool = False) -> None:
        """An ACK ended the deliveries sent at the times ``sent`` (at least one).

        ``starving``: before this ACK the consumer held all it was allowed while items were
        waiting for a consumer.
        """
        newest = max(sent)
        n = len(sent)
        busy = False
        changed = sampled = False
        last = self.last_ack
        if last and now >= last:
            self.intervals.append((now - last) / n)
        if last and now > last:
            # "a round trip before": the smallest sojourn is round trip + processing, never
            # less than the round trip, so this test never takes an idle interval for work
            busy = newest <= self.last_sent + SLACK or newest <= last - self.sojourn + SLACK
            if busy:
                # summed over a round trip before it counts: ACKs that arrive bunched (a pause
                # on either side, the network) give one long gap and many near-zero ones, and
                # only their sum over a span says how fast the consumer worked; the very first
                # sample may be shorter (the first frame's items, worked back to back)
                self.busy_time += now - last
                self.busy_items += n
                items = self.busy_items
                if self.busy_time >= self.sojourn and items >= 2:
                    self.samples.append(self.busy_time / items)
                    self.busy_time, self.busy_items = 0.0, 0
                    changed = sampled = True
                elif not self.samples and not self.first and items >= FIRST_ITEMS:
                    # a first, short sample, until a full one replaces it (short spans are
                    # what bunched ACKs fool)
                    self.first = self.busy_time / items
                    self.busy_time, self.busy_items = 0.0, 0
                    changed = sampled = True
        # the consumer's pace over a round trip: items it finished in that time bound its
        # processing time from above, which is what lifts a starving consumer whose processing
        # time was over-estimated (its items never wait, so it shows no busy interval)
        if starving:
            self.starved = True
        if not self.span_from:
            self.span_from, self.span_items, self.span_sojourn = now, 0, 0.0
        else:
            self.span_items += n
            self.span_sojourn += n * now - sum(sent)
            if now - self.span_from >= self.sojourn and self.span_items >= 2:
                if self.starved:
                    self.pace = (now - self.span_from) / self.span_items
                    # what it takes to keep it busy at the round trip it sees now
                    self.pace_wants = math.ceil(
                        self.span_sojourn / self.span_items / self.pace - SLACK
                    )
                    changed = True
                self.span_from, self.span_items, self.span_sojourn = now, 0, 0.0
                self.starved = False
        self.last_ack, self.last_sent = now, newest
        sojourn = now - newest
        if self.probe_from:
            if newest >= self.probe_from:  # sent with nothing else in flight: a clean sample
                self.sojourn, self.sojourn_at, self.probe_from = sojourn, now, 0.0
                self.sojourn_p = min(self.processing, sojourn)
        elif sojourn <= self.sojourn:
            self.sojourn, self.sojourn_at = sojourn, now
            self.sojourn_p = min(self.processing, sojourn)
        if (
            starving
            and not busy
            and self.extra < STARVING_MAX
            and now - self.grown_at >= self.sojourn
            and self._idle_before(newest, last) > IDLE_FRACTION * self.processing
        ):
            # idle between its previous ACK and this item: once a round trip, a little more
            self.extra += 1
            self.grown_at = now
        if changed:
            self._measure(sampled)

    def _idle_before(self, sent: float, last: float) -> float:
        """How long the consumer waited for the item sent at ``sent`` after finishing the one
        whose ACK arrived at ``last``: it arrived half a round trip after it was sent, and the
        consumer had finished half a round trip before that ACK arrived. A consumer at exactly
        round trip / processing + 1 gets each item as it finishes the one before (idle 0): it
        is not starving, and growing it would only make its items wait."""
        rtt = self.round_trip
        if rtt is None or not last:
            return math.inf
        return sent - last + rtt

    def _measure(self, sampled: bool) -> None:
        """A new sample (``sampled``) or pace: the processing time and the prefetch they call
        for."""
        # the smallest: a sample spoiled by a stall (high) is ignored, and so is the share of
        # the CPU that consumers of one process take from each other (a median of samples
        # inflated by the others' turns held consumers that ACK at once at prefetch 2-7,
        # 12,570 items/s in bench/queues.py's client producer run; the smallest, 20,270);
        # low samples from bunched ACKs are what the round-trip span of a sample prevents
        samples = self.samples
        p = min(samples) if samples else self.first or math.inf
        paced = self.pace
        self.pace = 0.0
        before = self.full
        if paced:
            # a starving consumer: its pace bounds its processing time from above
            p = min(p, paced)
            if not samples and self.pace_wants >= self.measured:
                # never busy (items take it no measurable time: it ACKs a frame at once), and
                # it used all it was given: what starving added is its value now, and it may
                # starve again (the formula's value is unbounded for it)
                self.measured = min(self.maximum, self.value)
                self.extra = 0
                self.processing = p
                self._allow(before)
                return
        if p == math.inf or p <= 0:
            return
        if not self.sojourn_p:  # the smallest sojourn so far was seen before any measurement
            self.sojourn_p = min(p, self.sojourn)
        self.processing = p
        # round trip / processing + 1 (the source document); growth at most doubles a
        # measurement (about a round trip), as TCP's slow start: one measurement gone wrong
        # cannot hand a consumer hundreds of items at once
        rtt = max(0.0, self.sojourn - self._processing_then())
        wanted = min(self.maximum, 2 * self.value, max(1, math.ceil(rtt / p + 1 - SLACK)))
        if sampled:
            self.measured, self.extra = wanted, 0
        elif wanted > self.measured:  # from a pace alone it only grows (a too-high estimate)
            self.extra = max(0, self.extra - (wanted - self.measured))
            self.measured = wanted
        self._allow(before)

    def _allow(self, before: int) -> None:
        """The allowance after a measurement: ``target / pace`` items rounded down, what the
        consumer works through within CoDel's target (so none of it waits longer: CoDel, which
        takes back what does, leaves it alone), but at most twice ``before``, the whole
        prefetch before this measurement (slow start: a time per item measured far too small
        must not hand a consumer hundreds of items at once). Shrinking is immediate: a
        consumer that slowed down would make those items wait too long.

        The pace is the *median* of the recent samples (the upper one of an even count), not
        ``processing``, their smallest. The smallest is right for the formula, which must not
        count the turns of the consumers sharing a process as work (prefetch.py's
        ``_measure``): erring small there only makes the prefetch smaller. Here erring small
        makes items wait longer than target, and the others' turns are waiting all the same:
        measured (bench/queues.py's end-to-end run, 4 consumers ACKing at once on one core, a
        CPU hog on that core), samples 16-46 µs; the smallest gave 1,000 items, 24-44 ms of
        waiting, 8-15 REVOKEs a run and some items run twice (a consumer that works through its
        buffer without yielding reads a REVOKE too late); the median, none in 3 runs. A
        sample or two that a stall spoiled (high) hardly move the median."""
        samples = self.samples
        p = sorted(samples)[len(samples) // 2] if samples else self.processing
        if not self.target or p <= 0:
            self.target_items = 0
            return
        # SLACK: 0.020 / 0.0001 is 199.99999999999997 in binary floating point
        self.target_items = min(math.floor(self.target / p + SLACK), 2 * before)

    def due_probe(self, now: float) -> bool:
        """Whether the round-trip sample is older than the window and a probe should start."""
        return (
            not self.probe_from and self.sojourn != math.inf and now - self.sojourn_at > self.window
        )

    def start_probe(self, now: float) -> None:
        self.probe_from = now

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
  consumer worked. A moving mean (gain 1/4) of the samples follows a change within a few round
  trips.

Two corrections keep it honest. An estimate that is too small starves the consumer, and a
starving consumer never shows its processing time (nothing waits): so when an ACK arrives from
a consumer that held all it was allowed while items were waiting in the queue, and its items
did not wait, the prefetch grows by one (at most once a round trip, as TCP's congestion
avoidance does), until items do wait and a measurement takes over; and a measurement may at
most double the prefetch (TCP's slow start), so one measurement gone wrong cannot hand a
consumer hundreds of items at once. An
estimate that is too large hides the round trip (every item waits, and the smallest
delivery-to-ACK time then only says how long the buffer is): so when the smallest sample is
``window`` old the estimator *probes*, as BBR's ProbeRTT does: the consumer is held to one
item in flight until one item sent with nothing else outstanding is acknowledged, which
measures round trip + processing cleanly. The consumer drains its buffer meanwhile; the probe
costs about one round trip of idleness per ``window``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

GAIN = 0.25
"""Weight of a new processing-time sample in the moving mean."""
SLACK = 1e-4
"""Clock slack (seconds) when deciding whether an item was already waiting at the consumer."""


class PrefetchEstimator:
    """Round trip, processing time and the prefetch they call for, for one consumer."""

    __slots__ = (
        "initial",
        "maximum",
        "window",
        "sojourn",
        "sojourn_at",
        "processing",
        "last_ack",
        "last_sent",
        "busy_time",
        "busy_items",
        "probe_from",
        "grown_at",
        "value",
    )

    def __init__(self, initial: int, maximum: int, window: float) -> None:
        if not 1 <= initial <= maximum:
            raise ValueError(f"initial prefetch must be in [1, {maximum}], got {initial}")
        self.initial = initial
        self.maximum = maximum
        self.window = window
        self.sojourn = math.inf
        """The smallest delivery-to-ACK time seen lately: round trip + processing."""
        self.sojourn_at = 0.0
        self.processing = 0.0
        """Seconds per item (0: not measured yet)."""
        self.last_ack = 0.0
        self.last_sent = 0.0
        """When the newest item of the previous ACK was sent."""
        self.busy_time = 0.0
        self.busy_items = 0
        """Busy intervals and the items they ended, summed until they span a round trip."""
        self.probe_from = 0.0
        """While probing: when the probe began (deliveries sent since then are clean)."""
        self.grown_at = 0.0
        self.value = initial
        """The prefetch the measurements call for (``initial`` until they exist)."""

    @property
    def round_trip(self) -> float | None:
        """The round trip without processing, once measured."""
        if self.sojourn == math.inf:
            return None
        return max(0.0, self.sojourn - self.processing)

    @property
    def limit(self) -> int:
        """Unacknowledged items the consumer may hold now: 1 while probing."""
        return 1 if self.probe_from else self.value

    def on_ack(self, now: float, sent: Sequence[float], starving: bool = False) -> None:
        """An ACK ended the deliveries sent at the times ``sent`` (at least one).

        ``starving``: before this ACK the consumer held all it was allowed while items were
        waiting for a consumer.
        """
        newest = max(sent)
        busy = False
        last = self.last_ack
        if last and now > last:
            # "a round trip before": the smallest sojourn is round trip + processing, never
            # less than the round trip, so this test never takes an idle interval for work
            busy = newest <= self.last_sent + SLACK or newest <= last - self.sojourn + SLACK
            if busy:
                # summed over a round trip before it counts: ACKs that arrive bunched (a pause
                # on either side, the network) give one long gap and many near-zero ones, and
                # only their sum over a span says how fast the consumer worked
                self.busy_time += now - last
                self.busy_items += len(sent)
                if self.busy_time >= self.sojourn and self.busy_items >= 2:
                    sample = self.busy_time / self.busy_items
                    self.busy_time, self.busy_items = 0.0, 0
                    p = self.processing
                    self.processing = sample if not p else p + GAIN * (sample - p)
                else:
                    busy = False  # no new measurement yet
        self.last_ack, self.last_sent = now, newest
        sojourn = now - newest
        if self.probe_from:
            if newest >= self.probe_from:  # sent with nothing else in flight: a clean sample
                self.sojourn, self.sojourn_at, self.probe_from = sojourn, now, 0.0
        elif sojourn <= self.sojourn:
            self.sojourn, self.sojourn_at = sojourn, now
        if busy:
            wanted = math.ceil(self.sojourn / self.processing - SLACK)
            # growth at most doubles a measurement (a round trip), as TCP's slow start: one
            # measurement gone wrong cannot hand a consumer hundreds of items at once
            self.value = min(self.maximum, 2 * self.value, max(1, wanted))
        elif starving and self.value < self.maximum and now - self.grown_at >= self.sojourn:
            self.value += 1  # once a round trip: additive, so it cannot overshoot far
            self.grown_at = now

    def due_probe(self, now: float) -> bool:
        """Whether the round-trip sample is older than the window and a probe should start."""
        return (
            not self.probe_from and self.sojourn != math.inf and now - self.sojourn_at > self.window
        )

    def start_probe(self, now: float) -> None:
        self.probe_from = now

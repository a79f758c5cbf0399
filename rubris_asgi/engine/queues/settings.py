"""A queue channel's settings: what ``@rubris.queue(...)`` sets, with the protocol's defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueueSettings:
    """Per channel; docs/operations.md ("Work queues") says what a user sees at each limit.

    >>> QueueSettings(prefetch=10).prefetch
    10
    """

    max_length: int = 10_000
    """Items waiting (not delivered) at most: ``enqueue`` raises ``QueueFull``, PUBLISH gets
    REJECTED 6, the HTTP API 429. Items given back by consumers are never refused."""
    prefetch: int | None = None
    """Unacknowledged deliveries per consumer when fixed here; None: sized per consumer from its
    round trip and processing time (a consumer may still fix its own in SUBSCRIBE)."""
    max_prefetch: int = 1000
    """The largest prefetch, measured or asked for (SUBSCRIBE asking more is REJECTED 10)."""
    initial_prefetch: int = 4
    """A consumer's prefetch until its round trip and processing time are measured."""
    batch: int = 64
    """Items of this queue in one frame to one consumer at most (within its free prefetch)."""
    delivery_limit: int = 20
    """Deliveries of an item that may end in NACK or a lost consumer before it is dead-lettered."""
    dead_letter: str | None = None
    """A queue topic that receives items past the delivery limit or NACKed without requeue;
    None: they are dropped (and counted)."""
    codel_target: float | None = 0.020
    """Server-side CoDel: the queueing delay inside a consumer it tolerates (seconds); None
    turns server-side CoDel off for this channel."""
    codel_interval: float = 0.100
    """Server-side CoDel: how long the delay must stay above target before items are revoked."""
    rtt_window: float = 10.0
    """How long a round-trip measurement holds before the consumer is probed again."""
    unmeasured_allowance: float = 1.0
    """Before a consumer's first ACK, how long an item may be out before CoDel counts it late."""
    dedup_window: float = 600.0
    """How long an item ``id`` is remembered to refuse a duplicate (seconds)."""
    dedup_max: int = 1_000_000
    """Ids remembered at most per queue topic; the oldest is forgotten first."""

    def __post_init__(self) -> None:
        for name in ("max_length", "max_prefetch", "initial_prefetch", "batch", "delivery_limit"):
            if getattr(self, name) < 1:
                raise ValueError(f"queue {name} must be >= 1, got {getattr(self, name)}")
        for name in ("codel_interval", "rtt_window", "unmeasured_allowance", "dedup_window"):
            if getattr(self, name) <= 0:
                raise ValueError(f"queue {name} must be > 0, got {getattr(self, name)}")
        if self.codel_target is not None and self.codel_target <= 0:
            raise ValueError(f"queue codel_target must be > 0 or None, got {self.codel_target}")
        if self.dedup_max < 0:
            raise ValueError(f"queue dedup_max must be >= 0, got {self.dedup_max}")
        if self.prefetch is not None and not 1 <= self.prefetch <= self.max_prefetch:
            raise ValueError(
                f"queue prefetch must be in [1, {self.max_prefetch}], got {self.prefetch}"
            )
        if self.initial_prefetch > self.max_prefetch:
            raise ValueError("queue initial_prefetch must be <= max_prefetch")

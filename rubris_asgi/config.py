"""Settings objects: every limit and timing in one place, each with a sane default.

Value objects in the style of httpx's ``Limits``/``Timeout``: frozen, validated, with a readable
repr, so a deployment can log exactly what it runs with. docs/operations.md explains each one and
what a user sees when it is reached.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


def _check_positive(obj: object) -> None:
    for f in fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            raise ValueError(f"{type(obj).__name__}.{f.name} must be > 0, got {value!r}")


@dataclass(frozen=True)
class PoolConfig:
    """Sizes and counts of the writer pool (source document 001, "Memory considerations")."""

    block_size: int = 256 * 1024
    large_scale: int = 4
    max_scale: int = 16
    blocks: int = 4096
    large_blocks: int = 64
    unpooled: int = 16

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            # bool is an int subclass; PoolConfig(blocks=True) is a mistake, not "1 block".
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PoolConfig.{f.name} must be a positive int, got {value!r}")
        if self.max_scale < self.large_scale:
            raise ValueError(
                f"PoolConfig.max_scale ({self.max_scale}) must be >= large_scale "
                f"({self.large_scale}): the maximum frame cannot be smaller than a large buffer"
            )

    @property
    def large_size(self) -> int:
        """Capacity of a large lease."""
        return self.block_size * self.large_scale

    @property
    def max_size(self) -> int:
        """The largest message (and frame) that can be sent."""
        return self.block_size * self.max_scale


@dataclass(frozen=True)
class Limits:
    """Per-session and per-server limits; each refusal carries a protocol code.

    >>> Limits(max_subscriptions=50).max_subscriptions
    50
    """

    max_inbound_frame: int = 256 * 1024
    """Largest client frame accepted (WebSocket message or long-poll POST body): GOODBYE 5 / 413."""
    max_inflated: int = 1024 * 1024
    """Largest payload a COMPRESSED client message may inflate to: refused with code 5."""
    max_subscriptions: int = 1000
    """Subscriptions one session may hold: REJECTED code 6."""
    max_keys: int = 100_000
    """Live keys of a keyed topic (a channel may set its own ``max_keys``): a set of a new key
    past it raises ``TableFull`` (REJECTED 6, HTTP 409); as many tombstones again are kept."""
    max_sessions: int = 100_000
    """Sessions alive at once (connected or awaiting resume): GOODBYE 6 + close 1013 / HTTP 503."""
    max_topic_name: int = 256
    """Bytes in a topic or method name: REJECTED / RESULT error code 5."""
    max_calls_in_flight: int = 64
    """Unanswered CALLs per session: RESULT error code 6."""
    max_topics: int = 1_000_000
    """Topics (shared and queue) alive at once; publishing a new topic past it raises
    ``ProtocolError`` 6."""
    max_direct_queue: int = 10_000
    """Direct messages (RESULT, SUBSCRIBED, GAP, ...) waiting for one session: GOODBYE 7."""
    intake_messages: int = 100_000
    """Messages from outside (HTTP API, PUBLISH) waiting for the cycle: 429 / REJECTED 6."""
    intake_bytes: int = 64 * 1024 * 1024
    """Payload bytes of those messages: 429 / REJECTED 6, as for the count."""
    api_body: int = 16 * 1024 * 1024
    """Largest HTTP API request body: 413."""
    max_sessions_per_user: int = 100
    """Sessions one authenticated user may hold at once: GOODBYE 6 + close 1013 / HTTP 503."""
    max_sessions_per_address: int = 1000
    """Anonymous sessions from one client address at once (authenticated users count under
    ``max_sessions_per_user`` instead): GOODBYE 6 + close 1013 / HTTP 503."""
    max_topics_per_channel: int = 100_000
    """Shared or queue topics one channel may have alive at once, unless the channel sets its
    own ``max_topics``: REJECTED 6 / ``ProtocolError`` 6, other channels unaffected."""
    inbound_rate: int = 8 * 1024 * 1024
    """Bytes of client input one connection may have parsed per second (frames, plus what
    COMPRESSED payloads inflate to); past it the connection is read no further until the
    budget refills, so one client cannot take the event loop from the others."""

    def __post_init__(self) -> None:
        _check_positive(self)


@dataclass(frozen=True)
class Timing:
    """Timeouts and cadences, in seconds."""

    session_timeout: float = 30.0
    """How long a session outlives its connection, waiting to be resumed."""
    heartbeat: float = 15.0
    """Announced in WELCOME; a connection silent for twice this is closed."""
    poll_timeout: float = 25.0
    """How long a long-poll GET waits for data before answering 204."""
    shutdown_drain: float = 5.0
    """How long graceful shutdown waits for in-flight frames after GOODBYE 9."""
    body_timeout: float = 10.0
    """How long a request body rubris reads (long-poll POST, HTTP API) may take to arrive
    whole: HTTP 408 past it."""
    header_timeout: float = 10.0
    """How long a new HTTP connection may take to send its request line and headers before it
    is closed (``serve()`` sets this on uvicorn)."""
    idle_timeout: float = 5.0
    """How long a kept-alive HTTP connection may wait for its next request before it is closed
    (uvicorn's ``timeout_keep_alive``, set by ``serve()``)."""
    topic_keep: float | None = 3600.0
    """How long a shared topic the application publishes to is kept without subscribers after
    its last publish (its value and ring for late joiners); None: for ever. Topics only clients
    made or fed are kept ``session_timeout`` after they were last used."""
    tombstones: float = 120.0
    """How long a keyed topic remembers a deleted key (its tombstone), so that a subscriber
    resuming from before the delete is told of it; at least ``session_timeout`` (a resume
    from further back than the oldest tombstone gets RESET and the whole table)."""
    reauthenticate: float | None = None
    """When set, every connected session's user is checked again this often by calling
    ``authenticate`` with the connection's request; a ``Reject`` ends the session (GOODBYE 4)."""

    def __post_init__(self) -> None:
        _check_positive(self)


@dataclass(frozen=True)
class WriterConfig:
    """The slow-client rules of the large-messages source document.

    A write that cannot complete at once is a *blocked write*. Each one counts as a failed send;
    the session is then held back for ``failed_sends // blocked_writer_scaler * slot`` seconds
    before it is scheduled again (integer division: one more slot every ``blocked_writer_scaler``
    blocked writes), and the count resets after ``failed_send_reset`` seconds
    without a blocked write. A session that stays blocked for ``max_blocked`` is ended with
    GOODBYE 7 (slow consumer).
    """

    slot: float = 0.010
    blocked_writer_scaler: int = 1
    failed_send_reset: float = 1.0
    max_blocked: float = 10.0
    blocked_after: float = 0.050
    """A frame still being written after this long counts as a blocked write."""
    async_window: int = 128
    """Writes a cycle hands to a server that completes them on its own threads (granian)
    before it pauses for them: the cycle goes on once half are done (or after 2 ms). Without
    the pause a cycle of a thousand frames holds the event loop while the server's threads
    wait for it, and a thousand writes in flight at once outlive young garbage collections."""
    direct_writes: bool = True
    """Under uvicorn's WebSocket implementation (``websockets-sansio``, its default), write each
    frame's prepared WebSocket bytes to the socket when its ``send`` would write at once, built
    once for every client whose frame is the same (server/direct.py); False: every frame goes
    through the ASGI ``send``. Other servers always use ``send``."""

    def __post_init__(self) -> None:
        _check_positive(self)


@dataclass(frozen=True)
class FlowConfig:
    """NAK-based adaptive rate control (flow control source document, protocol.md section 8).

    A NAK(fill) lowers the session's frame rate: its minimum interval between frames becomes
    ``base_interval * 2 ** (strength - 1)`` where strength is 1, 2, 3, 4 for 50, 75, 87 and 100 %
    (the strongest NAK within ``window`` wins). Each ``recover_step`` seconds without a NAK halves
    the interval until it is back to zero (unlimited).
    """

    base_interval: float = 0.010
    window: float = 0.050
    recover_step: float = 0.100

    def __post_init__(self) -> None:
        _check_positive(self)


@dataclass(frozen=True)
class BatchConfig:
    """Batch tracking (protocol.md 8c): how long batches live, how big they may grow. Seconds.

    >>> BatchConfig(expiry=3600).keep
    86400.0
    """

    expiry: float = 7 * 86400.0
    """An open batch with no activity (add, ack, seal) this long ends as ``expired``."""
    sealed_expiry: float = 7 * 86400.0
    """The same for a sealed batch still waiting for acks."""
    keep: float = 86400.0
    """A complete or expired batch is kept this long after it ended, then forgotten (404)."""
    sweep_every: float = 60.0
    """Seconds between two runs of the sweeper that expires and forgets batches."""
    max_items: int = 100_000_000
    """Items in one batch at most (12.5 MB of bits): an add past it is refused (400)."""
    max_groups: int = 1_000_000
    """Adds to one batch at most (each is a group): refused past it (400)."""
    max_pending: int = 1_000_000
    """Queue-item ends (ACKs, dead letters) waiting to reach the store; past it they are
    dropped, logged and counted (their batch then expires instead of completing)."""

    def __post_init__(self) -> None:
        _check_positive(self)


@dataclass(frozen=True)
class Config:
    """Everything a ``Rubris`` instance runs with."""

    limits: Limits = field(default_factory=Limits)
    timing: Timing = field(default_factory=Timing)
    pool: PoolConfig = field(default_factory=PoolConfig)
    writer: WriterConfig = field(default_factory=WriterConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    batches: BatchConfig = field(default_factory=BatchConfig)
    compress_at: int | None = 512
    """Default for channels that do not set their own; None turns compression off."""
    ring_size: int = 64
    """Default ring length for ring channels."""
    private_queue: int = 1024
    """Default capacity of a private queue (unsent plus sent-but-unacknowledged)."""

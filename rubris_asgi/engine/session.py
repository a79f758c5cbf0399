"""A client session: what it holds, what is waiting for it, and whether it can take a frame.

Sessions outlive connections: a WebSocket that drops leaves its session *detached* for the
session timeout, so a reconnect with the resume token finds its subscriptions, ring cursors and
private queues as they were.

Readiness is the transport's word: a WebSocket session is ready when no frame of its is still
being written; a long-poll session is ready while a poll is waiting. The scheduler only serves
ready sessions, so a slow socket never holds a cycle.
"""

from __future__ import annotations

from collections import deque
from enum import Enum
from typing import Any, Protocol

from ..control.budget import Budget
from .buffers import FrameBuffer
from .topics import PrivateSub, Sub


class SessionState(Enum):
    CONNECTED = "connected"
    DETACHED = "detached"
    """No connection; waiting for a resume until the session timeout."""
    CLOSING = "closing"
    """GOODBYE queued; the transport closes after sending it."""
    CLOSED = "closed"


class FrameSink(Protocol):
    """What a transport offers the scheduler: take one frame, never block.

    The builder first offers the frame to :meth:`write_now`; a transport that can write it at
    once, without waiting, does and says True: the frame is done with, no lease was taken, and
    the session is ready again. Otherwise the builder takes the frame's lease and hands both to
    :meth:`send_frame`: the transport owns them until the frame is written, then calls
    ``Engine.frame_done`` with the lease, which releases it and makes the session ready again.
    """

    @property
    def writing_since(self) -> float:
        """When the frame being written was handed over (the engine's clock); 0.0 when none
        is (read by the operations page: how long a write has been blocked)."""

    def write_now(self, frame: bytes) -> bool:
        """Write ``frame`` now if that needs no waiting (the socket takes it whole); False:
        nothing was written, :meth:`send_frame` follows."""

    def send_frame(self, frame: bytes, lease: FrameBuffer) -> None: ...

    def superseded(self) -> None:
        """A newer connection resumed the session: stop carrying it and let go of what is
        held for it (the engine detaches the session right after)."""


class Session:
    """One client's state in the engine (sans-IO: no sockets, no tasks)."""

    __slots__ = (
        "id",
        "resume_token",
        "user",
        "owner",
        "state",
        "subs",
        "names",
        "direct",
        "pending",
        "queued",
        "ready",
        "sink",
        "hold_until",
        "held",
        "failed_sends",
        "last_failed",
        "nak_interval",
        "nak_fill",
        "nak_at",
        "calls",
        "detached_at",
        "attached_at",
        "close_code",
        "transport",
        "data",
        "parked",
        "resuming",
        "may_publish",
        "address",
        "inbound",
        "__weakref__",
    )

    def __init__(
        self, session_id: str, resume_token: str, user: Any = None, owner: Any = None
    ) -> None:
        self.id = session_id
        self.resume_token = resume_token
        self.user = user
        """The authenticated user, as the application's authentication gave it."""
        self.owner = owner
        """A stable identity of ``user``: only the same owner may resume or poll this session."""
        self.state = SessionState.DETACHED
        self.subs: dict[int, Sub] = {}
        """Subscriptions by topic number."""
        self.names: dict[str, Sub] = {}
        """Subscriptions by topic name."""
        self.direct: deque[bytes] | None = None
        """Encoded RESULT/STREAM/SUBSCRIBED/... messages, sent first, in order; None when there
        are none (a deque is 760 bytes: made when a message comes, dropped once all are sent)."""
        self.pending: dict[Sub, None] = {}
        """Subscriptions with something to send: an ordered set, so repeats coalesce."""
        self.queued = False
        """In the scheduler's pending-client list (coalesces repeated notifications)."""
        self.ready = False
        self.sink: FrameSink | None = None
        self.hold_until = 0.0
        """Not served before this time: the slow-client penalty or NAK pacing."""
        self.held = False
        """A timer to re-queue this session is set."""
        self.failed_sends = 0
        self.last_failed = 0.0
        self.nak_interval = 0.0
        self.nak_fill = 0
        self.nak_at = 0.0
        self.calls: set[int] | None = None
        """Call ids in flight (None until the first call: an empty set is 216 bytes)."""
        self.detached_at = 0.0
        self.attached_at = 0.0
        """When its latest connection began (publish-to-frame leaves out older messages)."""
        self.close_code = 0
        """The GOODBYE code once the session is CLOSING."""
        self.transport = ""
        """The transport of its latest connection: ``websocket`` or ``longpoll``."""
        self.data: dict[str, Any] = {}
        """Free for the application (e.g. per-session state of handlers)."""
        self.parked: list[tuple[Sub, int]] = []
        """Ring subscriptions held, with their cursors, while a resuming frame is handled."""
        self.resuming = 0
        """Resuming frames being handled (a client may give up on one and resume again)."""
        self.may_publish: dict[str, tuple[int, str] | None] | None = None
        """The subscribe handler's verdict on PUBLISH per topic (server/dispatch.py), once
        asked: None allowed, else the refusal's code and reason."""
        self.inbound: Budget | None = None
        """Its input work budget (control/budget.py), made with its first frame."""
        self.address = ""
        """The client address it was opened from (what ``max_sessions_per_address`` counts
        for anonymous sessions)."""

    def has_work(self) -> bool:
        return bool(self.direct) or bool(self.pending)

    def private(self, name: str) -> PrivateSub | None:
        sub = self.names.get(name)
        return sub if isinstance(sub, PrivateSub) else None

    def __repr__(self) -> str:
        return f"<Session {self.id[:8]}… {self.state.value} subs={len(self.subs)}>"

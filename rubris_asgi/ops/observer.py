"""One worker's figures as a JSON-able snapshot: what the ops page and ``/metrics`` show.

Everything is read when a snapshot is asked for, never pushed from the hot path: the engine's
own counters (``CycleStats``, ``PoolStats``, ``IntakeStats``, ``QueueStats``), the telemetry
(telemetry.py) and a walk over the sessions and topics. That walk is O(sessions + topics), so
snapshots are cached for ``MIN_AGE``: however many scrapes, pages and the worker board ask, a
worker walks at most twice a second. docs/operations.md ("Metrics") describes every field.
"""

from __future__ import annotations

import hashlib
import heapq
import os
import socket
import time
from collections import Counter
from importlib import metadata
from typing import Any

from ..config import Config
from ..engine.engine import Engine
from ..engine.flow import current_interval
from ..engine.session import Session
from ..engine.telemetry import HISTOGRAMS
from ..errors import ErrorCode
from ..protocol import Mode

MIN_AGE = 0.5
"""Seconds a snapshot is reused before the engine is walked again."""
TOP = 10
"""Busiest topics and slowest sessions listed."""

_STATES = ("connected", "detached", "closing")
_CODES = {int(c): c.name for c in ErrorCode}


def worker_id() -> str:
    """``host:pid``: unique among the workers of one host, and readable on a dashboard."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _version() -> str:
    try:
        return metadata.version("rubris-asgi")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


class Observer:
    """Builds (and caches) the snapshot of one worker's engine."""

    def __init__(self, engine: Engine, *, wall: Any = time.time) -> None:
        self.engine = engine
        self.config: Config = engine.config
        self.worker = worker_id()
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.version = _version()
        self._wall = wall
        self.started = wall()
        self._last: dict[str, Any] | None = None
        self._last_at = 0.0
        self._seqs: dict[str, int] = {}
        """Each shared topic's seq at the previous walk: publish rates are the differences."""

    def snapshot(self, *, fresh: bool = False) -> dict[str, Any]:
        """The worker's figures now (or at most ``MIN_AGE`` ago unless ``fresh``)."""
        now = self._wall()
        if not fresh and self._last is not None and now - self._last_at < MIN_AGE:
            return self._last
        snap = self._build(now)
        self._last, self._last_at = snap, now
        return snap

    def _build(self, wall: float) -> dict[str, Any]:
        e = self.engine
        tel = e.telemetry
        cycle = e.scheduler.stats
        pool = e.pool.stats
        comp = e.compression.stats
        intake = e.intake.snapshot()
        sessions, gauges, slowest, subscriptions = self._sessions()
        shared_subs = sum(len(t.subs) for t in e.topics.values())
        queue_subs = sum(len(q.consumers) for q in e.queues.values())
        cfg = self.config.pool
        return {
            "worker": self.worker,
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
            "started": self.started,
            "time": wall,
            "sessions": sessions,
            "subscriptions": {
                "shared": shared_subs,
                "private": max(0, subscriptions - shared_subs - queue_subs),
                "queue": queue_subs,
            },
            "topics": {"shared": len(e.topics), "queue": len(e.queues)},
            "counters": {
                "sessions_opened": tel.sessions_opened,
                "sessions_resumed": tel.sessions_resumed,
                "topics_retired": tel.topics_retired,
                "published_messages": tel.published(e.topics.values()),
                "messages_delivered": cycle.messages,
                "frames": cycle.frames,
                "cycles": cycle.cycles,
                "sent_bytes": cycle.bytes,
                "compression_saved_bytes": comp.saved,
                "compressions_kept": comp.kept,
                "compressions_discarded": comp.discarded,
                "gaps": cycle.gaps,
                "deferred_messages": cycle.deferred,
                "pool_exhausted": pool.exhausted,
                "pool_shared": pool.shared,
                "pool_refused": pool.refused,
                "blocked_writes": tel.blocked_writes,
                "failed_sends": tel.failed_sends,
                "penalty_seconds": tel.penalty_seconds,
                "slow_consumer_closes_blocked": tel.closed_blocked,
                "slow_consumer_closes_backlog": tel.closed_backlog,
                "naks_received": tel.naks,
                "flow_sent": intake.flows,
                "intake_accepted": intake.accepted,
                "intake_refused": intake.refused,
                "intake_conflated": intake.conflated,
            },
            "gauges": {
                "intake_fill_ratio": intake.fill / 100,
                "intake_messages": intake.pending,
                "intake_bytes": e.intake.bytes,
                **gauges,
            },
            "pool": {
                "block": {
                    "in_use": pool.in_use_block,
                    "limit": cfg.blocks,
                    "leases": pool.block,
                    "peak": pool.peak_block,
                },
                "large": {
                    "in_use": pool.in_use_large,
                    "limit": cfg.large_blocks,
                    "leases": pool.large,
                    "peak": pool.peak_large,
                },
                "unpooled": {
                    "in_use": pool.in_use_unpooled,
                    "limit": cfg.unpooled,
                    "leases": pool.unpooled,
                    "peak": pool.in_use_unpooled,
                },
            },
            "histograms": {name: getattr(tel, attr).as_dict() for name, attr in HISTOGRAMS.items()},
            "errors": [
                {"kind": kind, "code": code, "name": _CODES.get(code, str(code)), "count": n}
                for (kind, code), n in sorted(tel.errors.items())
            ],
            "api_refusals": [
                {"status": status, "count": n} for status, n in sorted(tel.api_refusals.items())
            ],
            "topics_busiest": self._busiest(wall),
            "queues": [_queue(name, q.snapshot()) for name, q in sorted(e.queues.items())],
            "slowest": slowest,
        }

    def _sessions(
        self,
    ) -> tuple[dict[str, dict[str, int]], dict[str, int], list[dict[str, Any]], int]:
        e = self.engine
        now = e.clock()
        writer = self.config.writer
        flow = self.config.flow
        counts: Counter[tuple[str, str]] = Counter()
        paced = penalised = blocked = subscriptions = 0
        slow: list[tuple[tuple[float, ...], Session, float]] = []
        for s in e.sessions.values():
            counts[(s.transport or "websocket", s.state.value)] += 1
            subscriptions += len(s.subs)
            sink = s.sink
            since = sink.writing_since if sink is not None else 0.0
            blocked_for = now - since if since else 0.0
            interval = current_interval(s, now, flow) if s.nak_interval else 0.0
            held_for = max(0.0, s.hold_until - now) if s.held else 0.0
            failed = s.failed_sends if now - s.last_failed <= writer.failed_send_reset else 0
            blocked += blocked_for > 0
            paced += interval > 0
            penalised += held_for > 0 and not interval
            backlog = len(s.direct or ()) + len(s.pending)
            if blocked_for or failed or held_for or interval:
                slow.append(((blocked_for, failed, held_for, interval, backlog), s, interval))
        sessions = {
            transport: {state: counts[(transport, state)] for state in _STATES}
            for transport in ("websocket", "longpoll")
        }
        gauges = {
            "sessions_paced": paced,
            "sessions_penalised": penalised,
            "writes_blocked": blocked,
        }
        slowest = [
            {
                "session": _label(s.id),
                "transport": s.transport or "websocket",
                "state": s.state.value,
                "user": _user(s.user),
                "blocked_for": round(key[0], 3),
                "failed_sends": key[1],
                "held_for": round(key[2], 3),
                "nak_fill": s.nak_fill if interval else 0,
                "nak_interval": round(interval, 4),
                "backlog": key[4],
            }
            for key, s, interval in heapq.nlargest(TOP, slow, key=lambda x: x[0])
        ]
        return sessions, gauges, slowest, subscriptions

    def _busiest(self, wall: float) -> list[dict[str, Any]]:
        """The ``TOP`` shared topics by publishes a second since the previous walk."""
        topics = self.engine.topics
        old = self._seqs
        span = wall - self._last_at if self._last is not None else 0.0
        seqs = {name: t.seq for name, t in topics.items()}
        self._seqs = seqs
        if span <= 0:
            return []
        moved = ((seq - old.get(name, seq), name) for name, seq in seqs.items())
        top = heapq.nlargest(TOP, (m for m in moved if m[0] > 0))
        return [
            {
                "name": name,
                "mode": Mode(topics[name].mode).name.lower(),  # snapshot, ring or keyed
                "subscribers": len(topics[name].subs),
                "seq": topics[name].seq,
                "rate": round(n / span, 2),
            }
            for n, name in top
        ]


def _queue(name: str, st: Any) -> dict[str, Any]:
    return {
        "name": name,
        "waiting": st.waiting,
        "outstanding": st.outstanding,
        "consumers": st.consumers,
        "enqueued": st.enqueued,
        "delivered": st.delivered,
        "acked": st.acked,
        "nacked": st.nacked,
        "redelivered": st.requeued,
        "revoked": st.revoked,
        "late_acked": st.late_acked,
        "flows": st.flows,
        "dead_lettered": st.dead_lettered,
        "dropped": st.dropped,
        "duplicates": st.duplicates,
    }


def _label(session_id: str) -> str:
    """A session's name on the page: a hash, since the id is a credential (a long-poll URL)."""
    return hashlib.blake2b(session_id.encode(), digest_size=6).hexdigest()


def _user(user: Any) -> str | None:
    if user is None:
        return None
    for attr in ("display_name", "username", "identity", "id"):
        value = getattr(user, attr, None)
        if isinstance(value, (str, int)):
            return str(value)[:64]
    return str(user)[:64] if isinstance(user, (str, int)) else type(user).__name__


__all__ = ["MIN_AGE", "Observer", "worker_id"]

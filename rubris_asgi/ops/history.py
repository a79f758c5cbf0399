"""The operations page's last five minutes, kept by the server so that the page opens with them.

Every ``interval`` (a second) a worker with the ops page on takes a *sample*: the figures the
page's charts are drawn from, and nothing else. A sample has the shape of a snapshot
(observer.py) cut down to those figures: the counters the charts turn into rates, the
histograms' bucket counts, sessions by transport and state, the intake fill, the pool's blocks,
the busiest topics' publish rates and the deepest queues. The page feeds the samples through
the very code that turns live snapshots into rates, quantiles and totals across workers, so
the history and the live figures cannot disagree.

Sampling is the board's loop (workers.py), not the page: the history is there whether or not
a page was open. It costs nothing on the hot path (publish, the cycle, frame assembly): the
counters and histograms are there anyway, and the sample reads them once a second. Its cost is
one pass over the topics (their seqs: the publish rates) and the queues, and a count of the
sessions by transport and state (no per-session figures: the slowest-sessions walk of the
snapshot is not done), 3 ms for 10,000 sessions on the 2-core test machine: about what one of
the four passes ``Engine.expire`` makes every second costs.

Memory: ``SPAN / interval`` = 300 samples, each kept as its JSON bytes (``History.nbytes``):
about 0.7 kB with nothing in the engine, 1.3 kB for the demo (ten busy topics, two queues), so
0.2 to 0.4 MB a worker, and at most about 6.5 kB (``TOP`` topic and ``TOP`` queue names of
``max_topic_name`` bytes each) or 2 MB. With a shared directory, each worker's history file
holds at most twice that many lines.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter, deque
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import orjson

from ..engine.engine import Engine
from ..engine.telemetry import HISTOGRAMS

SPAN = 300.0
"""Seconds of samples kept: the page's "last 5 minutes"."""
TOP = 10
"""Busiest topics and deepest queues kept per sample (the page charts five and four)."""
_STATES = ("connected", "detached", "closing")
_TRANSPORT_STATE = attrgetter("transport", "state._value_")
"""A session's (transport, state): ``transport`` is "" before a connection said which."""


class History:
    """The samples of one worker's last ``span`` seconds, oldest first (module docstring)."""

    def __init__(
        self,
        engine: Engine,
        worker: str,
        *,
        interval: float = 1.0,
        span: float = SPAN,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.worker = worker
        self.interval = interval
        self.span = span
        self._wall = wall
        self.samples: deque[tuple[float, bytes]] = deque(maxlen=max(1, round(span / interval)))
        """(wall time, the sample as JSON): a ring, the oldest dropped as a new one comes."""
        self._seqs: dict[str, int] = {}
        """Each shared topic's seq at the previous sample: publish rates are the differences."""
        self._seqs_at: float | None = None

    def sample(self) -> bytes:
        """Take a sample now, keep it, and return it as JSON (the board's file takes it too)."""
        now = self._wall()
        data = orjson.dumps(self.read(now))
        self.samples.append((now, data))
        return data

    def recent(self, now: float | None = None) -> list[tuple[float, bytes]]:
        """The samples of the last ``span`` seconds, with their times: a worker whose loop was
        held up (a suspended process) may hold older ones, which are not the last minutes."""
        since = (self._wall() if now is None else now) - self.span
        return [(at, data) for at, data in self.samples if at > since]

    @property
    def nbytes(self) -> int:
        """The JSON bytes held: the ring's memory but for its fixed per-sample overhead."""
        return sum(len(data) for _, data in self.samples)

    def read(self, now: float) -> dict[str, Any]:
        """The figures the page's charts need, as a snapshot has them (module docstring)."""
        e = self.engine
        tel = e.telemetry
        cycle = e.scheduler.stats
        pool = e.pool.stats
        # C-level attribute reads and string keys (an Enum hashes in Python): 0.3 us a session
        counts: Counter[tuple[str, str]] = Counter(map(_TRANSPORT_STATE, e.sessions.values()))
        queues = []
        for name, q in e.queues.items():
            st = q.snapshot()
            queues.append((st.waiting + st.outstanding, name, st.waiting, st.outstanding))
        counters = {
            "messages_delivered": cycle.messages,
            "published_messages": tel.published(e.topics.values()),
            "frames": cycle.frames,
            "cycles": cycle.cycles,
            "blocked_writes": tel.blocked_writes,
            "failed_sends": tel.failed_sends,
            "naks_received": tel.naks,
        }
        return {
            "worker": self.worker,
            "time": now,
            "counters": counters,
            "histograms": {
                name: list(getattr(tel, attr).counts) for name, attr in HISTOGRAMS.items()
            },
            "sessions": {  # as the snapshot counts them: no transport yet is a WebSocket
                "websocket": {st: counts[("websocket", st)] + counts[("", st)] for st in _STATES},
                "longpoll": {st: counts[("longpoll", st)] for st in _STATES},
            },
            "gauges": {"intake_fill_ratio": e.intake.fill / 100},
            "pool": {"block": {"in_use": pool.in_use_block, "limit": e.config.pool.blocks}},
            "topics_busiest": self._busiest(now),
            "queues": [
                {"name": name, "waiting": waiting, "outstanding": outstanding}
                for _, name, waiting, outstanding in heapq.nlargest(TOP, queues)
            ],
        }

    def _busiest(self, now: float) -> list[dict[str, Any]]:
        """The ``TOP`` shared topics by publishes a second since the previous sample."""
        old = self._seqs
        span = 0.0 if self._seqs_at is None else now - self._seqs_at
        seqs = {name: t.seq for name, t in self.engine.topics.items()}
        self._seqs, self._seqs_at = seqs, now
        if span <= 0:
            return []
        moved = ((seq - old.get(name, seq), name) for name, seq in seqs.items())
        top = heapq.nlargest(TOP, (m for m in moved if m[0] > 0))
        return [{"name": name, "rate": round(n / span, 2)} for n, name in top]

    def bounds(self) -> dict[str, list[float]]:
        """The histograms' bucket bounds, sent once with the samples (which carry counts)."""
        tel = self.engine.telemetry
        return {name: list(getattr(tel, attr).bounds) for name, attr in HISTOGRAMS.items()}


__all__ = ["SPAN", "TOP", "History"]

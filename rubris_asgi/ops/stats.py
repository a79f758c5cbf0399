"""``Stats``: what ``Rubris.stats()`` answers, one snapshot of every counter."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..cluster import Broker, BrokerStats
from ..engine.buffers import PoolStats
from ..engine.engine import Engine
from ..engine.intake import IntakeStats
from ..engine.queues import QueueStats
from ..engine.scheduler import CycleStats
from ..engine.session import SessionState
from ..protocol.deflate import CompressionStats


@dataclass(frozen=True)
class Stats:
    """A snapshot of the engine's counters (``Rubris.stats()``)."""

    sessions: int
    connected: int
    topics: int
    cycle: CycleStats
    pool: PoolStats
    compression: CompressionStats
    intake: IntakeStats
    queues: QueueStats
    """Every queue topic's counters and gauges, added up."""
    broker: BrokerStats
    """The broker's counters (all zero but ``up`` for a process alone)."""


def collect_stats(engine: Engine, broker: Broker) -> Stats:
    """The counters now, copied: later changes do not show in the snapshot."""
    queues = QueueStats()
    for q in engine.queues.values():
        queues.add(q.snapshot())
    return Stats(
        sessions=len(engine.sessions),
        connected=sum(1 for s in engine.sessions.values() if s.state is SessionState.CONNECTED),
        topics=len(engine.topics),
        cycle=replace(engine.scheduler.stats),
        pool=replace(engine.pool.stats),
        compression=replace(engine.compression.stats),
        intake=engine.intake.snapshot(),
        queues=queues,
        broker=replace(broker.stats()),
    )

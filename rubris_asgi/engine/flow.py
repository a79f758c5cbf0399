"""Adaptive pacing of sessions: NAK rate control and the blocked-writer penalty.

Both act the same way, by keeping a session out of the cycles for a while (``Scheduler.hold``),
so neither costs anything for sessions that keep up, and neither ever makes another session wait.

NAK (the flow-control source document, protocol.md section 8): a receiver that falls behind says
how full its inbound buffer is. The strongest NAK within a short window sets the session's
minimum interval between frames; while no NAK arrives the interval halves every recovery step,
back to unlimited. No acknowledgement traffic at all while the client keeps up, and it works
for one receiver as for ten thousand, since each session is paced on its own signal.

Blocked writes (the large-messages source document): a frame that takes longer than
``blocked_after`` to write counts as a failed send; the session is paused for
``failed_sends // blocked_writer_scaler * slot`` seconds (integer division, as in the original:
the pause grows by one slot every ``blocked_writer_scaler``-th blocked write), and the count
resets when blocked writes stop for ``failed_send_reset``.
"""

from __future__ import annotations

from ..config import FlowConfig, WriterConfig
from .session import Session

_MAX_HALVINGS = 10


def nak_strength(fill: int) -> int:
    """1, 2, 3, 4 for a fill of 50, 75, 87, 100 % (and anything between); 0 below 50 %."""
    if fill >= 100:
        return 4
    if fill >= 87:
        return 3
    if fill >= 75:
        return 2
    if fill >= 50:
        return 1
    return 0


def current_interval(s: Session, now: float, cfg: FlowConfig) -> float:
    """The session's minimum interval between frames now, after stepwise recovery."""
    interval = s.nak_interval
    if not interval:
        return 0.0
    steps = int((now - s.nak_at) / cfg.recover_step)
    interval *= 0.5**steps
    if steps >= _MAX_HALVINGS or interval < cfg.base_interval / 2:
        s.nak_interval = 0.0
        s.nak_fill = 0
        return 0.0
    return interval


def on_nak(s: Session, fill: int, now: float, cfg: FlowConfig) -> float:
    """Apply one NAK; returns the session's new interval between frames."""
    strength = nak_strength(fill)
    current = current_interval(s, now, cfg)
    if strength == 0:
        return current
    wanted = cfg.base_interval * float(1 << (strength - 1))
    if now - s.nak_at < cfg.window and wanted <= current:
        return current  # a weaker (or equal) NAK in the same window changes nothing
    s.nak_interval = max(wanted, current)
    s.nak_at = now
    s.nak_fill = fill
    return s.nak_interval


def on_write_done(s: Session, started: float, now: float, cfg: WriterConfig) -> float:
    """Account one completed frame write; returns how long to hold the session (0 if none)."""
    if now - started < cfg.blocked_after:
        return 0.0
    if now - s.last_failed > cfg.failed_send_reset:
        s.failed_sends = 0
    s.failed_sends += 1
    s.last_failed = now
    return s.failed_sends // cfg.blocked_writer_scaler * cfg.slot

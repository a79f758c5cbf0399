"""``Follow``: one topic a node follows in Redis, its state of hearing (broker.py's *hearing*).

A followed topic is *joining* while the node reads what it missed from Redis (a follow, a
reconnection, a hole), holding what its channel brings meanwhile, and *live* once that is
stored: then each message heard is stored as it comes. Ring and snapshot topics are heard by
broker.py, keyed topics by tables.py; both keep this state.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from ...engine.keyed.topic import KEYED
from ...engine.topics import SharedTopic

JOINING, LIVE = 0, 1

HELD_KEYED = 4096
"""Changes of a keyed topic held while it catches up, at most: beyond, the oldest go, and the
hole they leave is read again (per-key conflation makes a read bounded by the table)."""


class Follow:
    """A followed topic: its state of hearing, and what arrived while it caught up."""

    __slots__ = ("topic", "state", "held", "ready", "idle_since")

    def __init__(self, topic: SharedTopic) -> None:
        self.topic = topic
        self.state = JOINING
        # a ring's or a snapshot's: (epoch, seq, payload, compressed); a keyed topic's: the
        # channel's message as it came (tables.py reads it)
        self.held: deque[Any] = deque(maxlen=HELD_KEYED if topic.mode == KEYED else topic.cap + 1)
        """Messages heard while catching up."""
        self.ready: asyncio.Future[None] | None = None
        self.idle_since = 0.0

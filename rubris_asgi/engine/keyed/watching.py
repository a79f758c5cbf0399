"""The engine's presence operations, as a part of ``Engine``: a session subscribing to a topic
whose channel has ``presence`` joins its members, one unsubscribing (or ending) leaves them
(keyed/presence.py counts them), and this node's book writes the topic's companions,
``{topic}@presence`` and ``{topic}@count``, made on first use from the channel's companions.
Like the queue and table operations, ``Engine`` takes them as a base class; the attributes of
the engine they use are declared below.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...protocol import Codec
from ..topics import SharedTopic, encode_payload
from .presence import COUNT, PRESENCE, Members, member_of
from .topic import KeyedTopic

if TYPE_CHECKING:
    from ..channels import Channel
    from ..session import Session

log = logging.getLogger("rubris_asgi")


class PresenceOperations:
    """Joins, leaves and the companions' writes: ``Engine``'s methods for presence."""

    # the engine's, used here (engine.py sets them in its constructor)
    clock: Callable[[], float]
    topics: dict[str, SharedTopic]
    watched: dict[str, Channel]
    members: Members

    def topic_of(self, name: str, ch: Channel) -> SharedTopic:
        raise NotImplementedError  # Engine's

    def set_entry(self, t: KeyedTopic, key: str, value: Any) -> int:
        raise NotImplementedError  # TableOperations'

    def delete_entry(self, t: KeyedTopic, key: str) -> int | None:
        raise NotImplementedError  # TableOperations'

    def _companion(self, name: str, suffix: str) -> SharedTopic | None:
        t = self.topics.get(name + suffix)
        if t is None:
            ch = self.watched.get(name)
            if ch is None:
                return None
            t = self.topic_of(name + suffix, ch.companions[suffix])
        return t

    def _set_member(self, name: str, member: str, value: Any) -> None:
        t = self._companion(name, PRESENCE)
        if isinstance(t, KeyedTopic):
            self.set_entry(t, member, value)

    def _drop_member(self, name: str, member: str) -> None:
        t = self.topics.get(name + PRESENCE)
        if isinstance(t, KeyedTopic):
            self.delete_entry(t, member)

    def _set_count(self, name: str, count: dict[str, int]) -> None:
        t = self._companion(name, COUNT)
        if t is not None:
            t.publish(encode_payload(count, Codec.JSON), False, self.clock())

    def _joined(self, s: Session, t: SharedTopic) -> None:
        ch = self.watched.get(t.name)
        if ch is None or ch.presence is None:
            return
        info = ch.presence.info

        def ask() -> Any:
            if info is None:
                return None
            try:
                return info(s)
            except Exception:  # the application's hook: its failure is logged, not the join's
                log.exception("presence_info of %r failed", t.name)
                return None

        self.members.joined(t.name, member_of(s.owner, s.id), s, ask)

    def _left(self, s: Session, t: SharedTopic) -> None:
        if t.name in self.watched:
            self.members.left(t.name, member_of(s.owner, s.id), s)

"""Presence: who subscribes to a topic, as the keyed topic ``{topic}@presence`` and the
snapshot ``{topic}@count`` (protocol.md section 5b).

A member is a user (its stable identity as a string; an anonymous session is its own member,
named by a hash of its id, never the id itself), however many sessions it has subscribed: one
entry per member, ``{"sessions": n, "info": …}``, added when its first session subscribes and
deleted when its last unsubscribes or ends. A connection lost is not a leave: the session's
subscriptions stay until it ends (the session timeout), so a resume changes nothing.

This module counts one node's sessions. Several nodes add theirs up through the broker
(``PresenceBook``): alone, the book is this module's own, writing the two topics directly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

PRESENCE = "@presence"
COUNT = "@count"


@dataclass(frozen=True)
class PresenceSpec:
    """A channel's ``presence=`` setting."""

    members: bool = True
    """Whether subscribers may see the members (``{topic}@presence``), not only the count."""
    info: Callable[[Any], Any] | None = None
    """``info(session)``: what a member's entry shows of it (JSON), asked at its first join."""


def member_of(owner: Any, session_id: str) -> str:
    """The member a session counts as: its user's stable identity (``Session.owner``) as a
    string, or, anonymous, a hash of its id (the id resumes a session: never shown)."""
    if owner is None:
        return "anon:" + hashlib.sha256(session_id.encode()).hexdigest()[:16]
    if isinstance(owner, tuple) and len(owner) == 2:  # (type name, identity): the identity
        owner = owner[1]
    if isinstance(owner, bytes):
        return owner.decode("utf-8", "replace")
    return str(owner)


class PresenceBook(Protocol):
    """Where a topic's members are counted: this node alone (``LocalBook``) or every node's
    sessions added up (a distributed broker's)."""

    def changed(self, topic: str, member: str, delta: int, info: Any) -> None:
        """``member`` has ``delta`` (+1, -1) sessions more on ``topic`` on this node; ``info``
        is its entry's ``info`` (asked when it joins on this node)."""


class LocalBook:
    """The members of each topic on this node alone: written straight into its
    ``{topic}@presence`` entries and its ``{topic}@count`` value."""

    def __init__(
        self,
        set_member: Callable[[str, str, Any], None],
        drop_member: Callable[[str, str], None],
        set_count: Callable[[str, dict[str, int]], None],
    ) -> None:
        self.set_member = set_member
        self.drop_member = drop_member
        self.set_count = set_count
        self.counts: dict[str, dict[str, list[Any]]] = {}
        """topic → member → [sessions, info]."""
        self.sessions: dict[str, int] = {}

    def changed(self, topic: str, member: str, delta: int, info: Any) -> None:
        members = self.counts.setdefault(topic, {})
        held = members.get(member)
        if held is None:
            held = members[member] = [0, info]
        held[0] += delta
        total = self.sessions[topic] = self.sessions.get(topic, 0) + delta
        if held[0] > 0:
            self.set_member(topic, member, {"sessions": held[0], "info": held[1]})
        else:
            del members[member]
            self.drop_member(topic, member)
        self.set_count(topic, {"members": len(members), "sessions": total})
        if not members:
            del self.counts[topic]
            del self.sessions[topic]


class Members:
    """One node's sessions per member of each presence topic (what a node that dies takes
    with it, and what tells whether a leave is the member's last here)."""

    def __init__(self, book: PresenceBook) -> None:
        self.book = book
        self.topics: dict[str, dict[str, dict[object, None]]] = {}
        """topic name → member → its sessions here (an ordered set)."""

    def joined(self, topic: str, member: str, session: object, info: Callable[[], Any]) -> None:
        members = self.topics.setdefault(topic, {})
        sessions = members.get(member)
        if sessions is None:
            sessions = members[member] = {}
        if session in sessions:
            return  # a SUBSCRIBE restating a subscription: not another join
        sessions[session] = None
        self.book.changed(topic, member, +1, info() if len(sessions) == 1 else None)

    def left(self, topic: str, member: str, session: object) -> None:
        members = self.topics.get(topic)
        sessions = None if members is None else members.get(member)
        if sessions is None or session not in sessions:
            return
        del sessions[session]
        if not sessions:
            del members[member]  # type: ignore[union-attr]
            if not members:
                del self.topics[topic]
        self.book.changed(topic, member, -1, None)

    def holds(self, topic: str) -> bool:
        """Whether ``topic`` (the watched one, or its ``@presence``/``@count``) has members
        here: its presence topics must not be retired then."""
        for suffix in (PRESENCE, COUNT):
            if topic.endswith(suffix):
                topic = topic[: -len(suffix)]
                break
        return topic in self.topics


__all__ = ["COUNT", "PRESENCE", "LocalBook", "Members", "PresenceBook", "PresenceSpec", "member_of"]

"""``SlotMap``: which master serves each of the 16384 slots, read from ``CLUSTER SHARDS``
(Redis 7) or ``CLUSTER SLOTS`` (older), and corrected slot by slot by ``MOVED``; and
``Redirect``, what a ``MOVED`` or ``ASK`` error names. Sans-IO.

A map is a view that may be behind: the cluster moves slots (a resharding), promotes replicas
(a failover), and no node tells a client. A command sent by a stale map is answered ``MOVED``
(the slot is elsewhere for good: the map takes that slot at once, and a full read follows)
or ``ASK`` (this one command must go to the node importing the slot: the map stays).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .address import Address
from .partitions import SLOTS


@dataclass(frozen=True)
class Redirect:
    """A ``MOVED`` or ``ASK`` error: where ``slot`` is served now (``MOVED``) or where this one
    command must go (``ASK``)."""

    kind: str
    """``"MOVED"`` or ``"ASK"``."""
    slot: int
    address: Address


def redirect_of(kind: str, text: str) -> Redirect | None:
    """The redirect an error of ``kind`` (``MOVED``/``ASK``) says, from its text without or with
    the kind in front (``"3999 127.0.0.1:6381"``, ``"MOVED 3999 127.0.0.1:6381"``); None if
    the text is not one. An empty host (``":6381"``, a node that does not know its own
    address) stays empty: the caller puts in the host of the node that answered."""
    words = text.split()
    if words and words[0] == kind:
        words = words[1:]
    if len(words) != 2 or not words[0].isdigit():
        return None
    host, colon, port = words[1].rpartition(":")
    if not colon or not port.isdigit():
        return None
    slot = int(words[0])
    if not 0 <= slot < SLOTS:
        return None
    return Redirect(kind, slot, (host.strip("[]"), int(port)))


class SlotMap:
    """The master of each slot, as last read or corrected; None for a slot no master serves
    (the map read had a hole: the cluster is incomplete, or was read mid-change)."""

    def __init__(
        self, ranges: Iterable[tuple[int, int, Address]] = (), nodes: Iterable[Address] = ()
    ):
        """``ranges``: (first, last, master), inclusive; ``nodes``: every node the reply named
        (replicas too), whom a later read may ask."""
        self._owner: list[Address | None] = [None] * SLOTS
        for first, last, address in ranges:
            for slot in range(max(first, 0), min(last, SLOTS - 1) + 1):
                self._owner[slot] = address
        self.nodes: frozenset[Address] = frozenset(nodes) | {
            a for a in self._owner if a is not None
        }

    def owner(self, slot: int) -> Address | None:
        """The master serving ``slot``, by this map."""
        return self._owner[slot]

    @property
    def masters(self) -> frozenset[Address]:
        """The masters that serve at least one slot."""
        return frozenset(a for a in self._owner if a is not None)

    @property
    def covered(self) -> int:
        """How many slots have a master."""
        return sum(1 for a in self._owner if a is not None)

    def moved(self, slot: int, address: Address) -> bool:
        """``MOVED``: ``slot`` is served by ``address`` now. Whether that changed the map."""
        if self._owner[slot] == address:
            return False
        self._owner[slot] = address
        self.nodes = self.nodes | {address}
        return True

    def slots_of(self, address: Address) -> list[int]:
        """The slots ``address`` serves, by this map."""
        return [s for s, a in enumerate(self._owner) if a == address]


def _text(value: Any) -> str:
    """A reply's string as str; nil (None) as an empty one."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(value: Any) -> dict[str, Any]:
    """A RESP2 flat list of names and values, or a RESP3 map, as a dict with str names."""
    if isinstance(value, Mapping):
        return {_text(k): v for k, v in value.items()}
    items = list(value)
    return {_text(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)}


def from_shards(reply: Sequence[Any], asked: Address) -> SlotMap:
    """The map a ``CLUSTER SHARDS`` reply gives (``asked``: the node that answered, whose host
    stands in for a node that gives none). Of each shard's nodes the one with role ``master``
    serves its slots, an online one before one flagged failing (a failover leaves both
    listed for a moment); a node's address is its ``endpoint`` (what
    ``cluster-preferred-endpoint-type`` says clients should use), else its ``ip``."""
    ranges: list[tuple[int, int, Address]] = []
    nodes: list[Address] = []
    for shard in reply:
        fields = _fields(shard)
        bounds = [int(b) for b in fields.get("slots", [])]
        master: Address | None = None
        master_online = False
        for raw in fields.get("nodes", []):
            node = _fields(raw)
            address = _node_address(node, asked)
            if address is None:
                continue
            nodes.append(address)
            online = _text(node.get("health", "online")) == "online"
            if _text(node.get("role", "")) == "master" and (
                master is None or online > master_online
            ):
                master, master_online = address, online
        if master is not None:
            ranges += [(bounds[i], bounds[i + 1], master) for i in range(0, len(bounds) - 1, 2)]
    return SlotMap(ranges, nodes)


def _node_address(node: dict[str, Any], asked: Address) -> Address | None:
    port = node.get("port")
    if port is None:  # a TLS-only node: not reachable by this client
        return None
    host = _text(node.get("endpoint"))
    if host in ("", "?"):
        host = _text(node.get("ip"))
    if host in ("", "?"):
        host = asked[0]
    return host, int(port)


def from_slots(reply: Sequence[Any], asked: Address) -> SlotMap:
    """The map a ``CLUSTER SLOTS`` reply gives: per range ``[first, last, master, replica...]``,
    each node ``[host, port, id, ...]``; an empty host (or NULL) means the node asked."""
    ranges: list[tuple[int, int, Address]] = []
    nodes: list[Address] = []
    for entry in reply:
        first, last, *holders = entry
        addresses = []
        for holder in holders:
            host = _text(holder[0])
            if host in ("", "?"):
                host = asked[0]
            addresses.append((host, int(holder[1])))
        if addresses:
            ranges.append((int(first), int(last), addresses[0]))
            nodes += addresses
    return SlotMap(ranges, nodes)

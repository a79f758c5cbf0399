"""Batch and item ids (the source document on batch fan-out).

A batch's id is random (16 hex digits): it is a capability, since anyone holding it may watch
the batch on ``batch.{id}``. An item id is ``{batch}:{group}:{index}``, made by the producer
from the group number an add returned and the index 0 … n-1 within it, so nothing is stored
per item. Group and index are canonical decimals (no sign, no leading zero), which makes one
item exactly one string.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import MalformedItem

BATCH_ID = re.compile(r"[0-9A-Za-z_-]{1,64}\Z")
"""What a batch id may be: this server makes 16 hex digits; other stores may make others."""

_ITEM = re.compile(r"([0-9A-Za-z_-]{1,64}):(0|[1-9][0-9]{0,17}):(0|[1-9][0-9]{0,17})\Z")


@dataclass(frozen=True, slots=True)
class ItemRef:
    """One item of a batch: its batch, the group an add made, the index within that group."""

    batch: str
    group: int
    index: int

    def __str__(self) -> str:
        return f"{self.batch}:{self.group}:{self.index}"


def new_batch_id() -> str:
    """A fresh batch id: 64 random bits, so ids are not guessable or enumerable."""
    return secrets.token_hex(8)


def parse_item(text: object) -> ItemRef:
    """``"{batch}:{group}:{index}"`` parsed; ``MalformedItem`` naming it otherwise."""
    m = _ITEM.match(text) if isinstance(text, str) else None
    if m is None:
        shown = repr(text) if isinstance(text, str) else f"a {type(text).__name__}"
        raise MalformedItem(
            f"malformed item id {shown[:100]}: expected batch:group:index",
            text if isinstance(text, str) else None,
        )
    return ItemRef(m[1], int(m[2]), int(m[3]))


def item_ids(batch: str, group: int, count: int) -> Iterator[str]:
    """The ids of a group of ``count`` items, index 0 first (what a producer sends along)."""
    prefix = f"{batch}:{group}:"
    return (f"{prefix}{i}" for i in range(count))

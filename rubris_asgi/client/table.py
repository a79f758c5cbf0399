"""A keyed topic as a client holds it: the table the ENTRY messages build (protocol.md 5b).

Sans-IO: :meth:`Table.apply` takes one ENTRY (its payload already decoded by the topic's
codec) and answers the change it made, which the subscription hands to the application.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..protocol import EntryOp
from ..protocol import patch as merge

__all__ = ["Change", "Table"]

_OPS = {
    EntryOp.SET: "set",
    EntryOp.PATCH: "patch",
    EntryOp.DELETE: "delete",
    EntryOp.RESET: "reset",
    EntryOp.SYNCED: "synced",
}


@dataclass(frozen=True)
class Change:
    """One change of a table: ``op`` is ``"set"``, ``"patch"`` (``value`` is the entry's new
    whole value, the patch applied), ``"delete"`` (``value`` the value it had), ``"reset"``
    (the table was emptied: the whole of it follows; ``key`` is empty) or ``"synced"`` (the
    table is whole as of ``seq``; ``key`` empty)."""

    name: str
    key: str
    op: str
    value: Any
    seq: int


class Table(Mapping[str, Any]):
    """The entries of one keyed topic, by key: a read-only mapping the client keeps current.

    ``seq`` is the last change received (what a resume states), ``synced`` whether everything
    since the subscription (or the last RESET) is the whole table, as of ``seq``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._entries: dict[str, Any] = {}
        self.seq = 0
        self.synced = False

    def __getitem__(self, key: str) -> Any:
        return self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<Table {self.name!r} {len(self)} keys seq={self.seq} synced={self.synced}>"

    def snapshot(self) -> dict[str, Any]:
        """A copy of the entries, to keep or change."""
        return dict(self._entries)

    def apply(self, seq: int, op: int, key: str, value: Any) -> Change | None:
        """Apply one ENTRY; the change it made (None: a DELETE of a key not held, or an op
        this client does not know, skipped as section 2 skips unknown kinds)."""
        entries = self._entries
        if op == EntryOp.SET:
            entries[key] = value
        elif op == EntryOp.PATCH:
            value = entries[key] = merge.apply(entries.get(key), value)
        elif op == EntryOp.DELETE:
            if key not in entries:
                self.seq = seq
                return None
            value = entries.pop(key)
        elif op == EntryOp.RESET:
            entries.clear()
            self.synced = False
            self.seq = 0  # it holds nothing of this numbering: the full state follows
            return Change(self.name, "", "reset", None, seq)
        elif op == EntryOp.SYNCED:
            self.synced = True
            self.seq = seq
            return Change(self.name, "", "synced", None, seq)
        else:
            return None
        self.seq = seq
        return Change(self.name, key, _OPS[EntryOp(op)], value, seq)

    def restart(self) -> None:
        """A new subscription of another numbering: nothing held any more."""
        self._entries.clear()
        self.seq = 0
        self.synced = False

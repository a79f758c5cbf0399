"""Keyed topics (live tables, protocol.md section 5b) over the HTTP API: the entries of
``POST {mount}/api/publish`` that change them, and what ``GET {mount}/api/topics/{name}``
answers for one.

Publishing. An entry for a keyed topic names a key and an op::

    {"topic": "book.AAPL", "key": "189.25", "data": {"qty": 300}}            set (the default)
    {"topic": "book.AAPL", "key": "189.25", "op": "patch", "data": {"qty": 0}}  RFC 7386 merge
    {"topic": "book.AAPL", "key": "189.25", "op": "delete"}
    {"topic": "book.AAPL", "op": "replace", "data": {"189.25": {...}, ...}}   the whole table

(a bytes topic takes ``data_b64`` where the others take ``data``: a base64 string, for replace
an object of key to base64 string). A request stays all or nothing (8b): every change is first
checked alone (``stage_change``: shape, key, codec, size), then against the table as the
request's earlier changes leave it (``plan_changes``: the topic's ``max_keys``, and the value a
patch makes), and only then applied, each change an O(1) call of the engine. They do not go
through the intake: the intake exists to spread the cost of fanning messages out over the
cycles, and a keyed change is already stored in O(1) and fanned out by the cycle; the body
limit bounds how many one request holds.

Reading. A reader keeps the topic's ``epoch``, the ``next`` and ``base`` of its last answer,
and asks for what follows (``keyed_answer`` says why two numbers are needed)::

    GET {mount}/api/topics/book.AAPL?epoch=E&after=S&base=B&limit=1000
    200 {"topic": "book.AAPL", "mode": "keyed", "codec": "json", "epoch": E, "head": H,
         "reset": false, "base": B, "next": N,
         "entries": [{"seq": 12, "key": "189.25", "op": "set", "data": {...}},
                     {"seq": 14, "key": "189.50", "op": "delete"}, ...], "fill": 0}
"""

from __future__ import annotations

import base64
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import orjson

from ...engine.engine import Engine
from ...engine.keyed.operations import ENTRY_HEADER, MAX_KEY
from ...engine.keyed.topic import KeyedTopic, KeyEntry
from ...errors import MessageTooLarge
from ...protocol import Codec
from ...protocol import patch as merge
from ...protocol.naming import quoted
from .guard import Refusal

OPS = ("set", "patch", "delete", "replace")
KEYED_FIELDS = frozenset({"key", "op"})
"""The fields of a publish entry that only a keyed topic takes."""

Payload = Callable[[int, dict[str, Any], int], bytes]
"""publish.py's ``_payload(codec, entry, index)``: an entry's ``data`` (or ``data_b64``) as a
topic of ``codec`` stores it, or a 400 naming the entry."""


def takes(name: str) -> str:
    """What an entry for the keyed topic ``name`` looks like: the 400 of one without key and op."""
    return (
        f'{quoted(name)} is a keyed topic: an entry takes a "key" and an "op" ("set", the '
        'default, or "patch" with data; "delete" without), or "op": "replace" with data, an '
        "object of key to value (the whole table)"
    )


@dataclass(slots=True)
class Change:
    """One keyed entry of a request, checked: what ``HttpApi.apply_changes`` hands the engine."""

    index: int
    name: str
    op: str
    key: str
    """The entry's key ("" for replace)."""
    payload: bytes = b""
    """set: the value as the topic stores it."""
    data: Any = None
    """set on a JSON topic: the value; patch: the merge patch; replace: key to value."""
    table: dict[str, bytes] = field(default_factory=dict)
    """replace: key to the value as the topic stores it."""
    topic: KeyedTopic | None = None
    """Found (made on first use) once the request is authorised."""


def stage_change(
    index: int, entry: dict[str, Any], name: str, codec: int, engine: Engine, payload: Payload
) -> Change:
    """The entry ``index`` for the keyed topic ``name`` checked alone (400 naming it): its op,
    its key, its data by the topic's codec and the size of each value it sets."""
    if "op" not in entry and "key" not in entry:
        raise Refusal(400, takes(name), index)
    op = entry.get("op", "set")
    if not isinstance(op, str) or op not in OPS:
        shown = quoted(op) if isinstance(op, str) else orjson.dumps(op).decode()[:40]
        raise Refusal(400, f"unknown op {shown}: set, patch, delete or replace", index)
    if op == "replace":
        if "key" in entry:
            raise Refusal(400, "op replace takes no key: its data is the whole table", index)
        return _stage_replace(index, entry, name, codec, engine, payload)
    if "key" not in entry:
        raise Refusal(400, f'op {op} needs a "key"', index)
    key = _key(entry["key"], index, "key")
    change = Change(index, name, op, key)
    if op == "delete":
        if "data" in entry or "data_b64" in entry:
            raise Refusal(400, "op delete takes no data", index)
    elif op == "patch":
        if codec != Codec.JSON:
            raise Refusal(
                400, f"patch needs a JSON topic; {quoted(name)} is not one: use set", index
            )
        if "data_b64" in entry or "data" not in entry:
            raise Refusal(400, "op patch takes data: a JSON merge patch (RFC 7386)", index)
        change.data = entry["data"]  # its size is known once it is merged (plan_changes)
    else:
        change.payload = payload(codec, entry, index)
        change.data = entry.get("data") if codec == Codec.JSON else None
        _check_size(engine, key, change.payload, index)
    return change


def _stage_replace(
    index: int, entry: dict[str, Any], name: str, codec: int, engine: Engine, payload: Payload
) -> Change:
    b64 = codec == Codec.BYTES
    field_name = "data_b64" if b64 else "data"
    table = entry.get(field_name)
    if not isinstance(table, dict) or ("data" if b64 else "data_b64") in entry:
        what = "base64 string" if b64 else "value"
        raise Refusal(400, f"op replace takes {field_name}, an object of key to {what}", index)
    change = Change(index, name, "replace", "", data=table if codec == Codec.JSON else None)
    for key, value in table.items():
        _key(key, index, f"{field_name}'s key")
        try:
            change.table[key] = payload(codec, {field_name: value}, index)
        except Refusal as r:
            raise Refusal(r.status, f"key {quoted(key)}: {r.error}", index) from None
        _check_size(engine, key, change.table[key], index)
    return change


def _key(key: Any, index: int, what: str) -> str:
    """``key`` when it is one (engine/keyed/operations.py's ``check_key``), else 400."""
    if not isinstance(key, str) or not key:
        raise Refusal(400, f"{what} must be a non-empty string", index)
    size = len(key.encode())
    if size > MAX_KEY:
        raise Refusal(
            400, f"{what} {quoted(key)} too long ({size} bytes, at most {MAX_KEY})", index
        )
    return key


def _check_size(engine: Engine, key: str, payload: bytes, index: int) -> None:
    # the engine's own bound (operations.py ``_packed``) with the payload before deflate, which
    # is never smaller: what passes here cannot be refused when it is applied
    try:
        engine.check_payload(len(payload) + len(key) * 4 + ENTRY_HEADER)
    except MessageTooLarge as exc:
        raise Refusal(400, f"key {quoted(key)}: {exc}", index) from None


_GONE = object()
"""A key a change of this request deleted (or a replace left out)."""


class _Table:
    """One keyed topic as the request's changes so far leave it, without changing it: the
    live keys' count (what ``max_keys`` bounds) and the keys the request touched."""

    def __init__(self, t: KeyedTopic) -> None:
        self.t = t
        self.live = t.live
        self.touched: dict[str, Any] = {}
        """Key to the value the request gave it (decoded, JSON topics), None when only its
        presence is known, or ``_GONE``."""
        self.replaced = False
        """A replace came first: keys it did not name are gone, whatever the topic holds."""

    def holds(self, key: str) -> bool:
        if key in self.touched:
            return self.touched[key] is not _GONE
        if self.replaced:
            return False
        e = self.t.entries.get(key)
        return e is not None and e.value is not None

    def value(self, key: str) -> Any:
        """The key's value as a patch finds it (JSON topics): None when it holds none."""
        if key in self.touched:
            v = self.touched[key]
            return None if v is _GONE else v
        if self.replaced:
            return None
        e = self.t.entries.get(key)
        return None if e is None or e.value is None else orjson.loads(e.value)

    def add(self, c: Change, key: str, value: Any) -> None:
        if not self.holds(key):
            if self.live >= self.t.max_keys:
                raise Refusal(
                    409,
                    f"keyed topic {quoted(c.name)} holds its max_keys ({self.t.max_keys}): "
                    f"{quoted(key)} not added",
                    c.index,
                )
            self.live += 1
        self.touched[key] = value

    def take(self, c: Change, engine: Engine) -> None:
        if c.op == "set":
            self.add(c, c.key, c.data)
        elif c.op == "patch":
            value = merge.apply(self.value(c.key), c.data)
            # the value the patch makes is what the engine will encode and store: its size
            # is checked here, before anything of the request is applied
            _check_size(engine, c.key, orjson.dumps(value), c.index)
            self.add(c, c.key, value)
        elif c.op == "delete":
            if self.holds(c.key):
                self.live -= 1
                self.touched[c.key] = _GONE
        else:
            if len(c.table) > self.t.max_keys:
                raise Refusal(
                    409,
                    f"keyed topic {quoted(c.name)}: a table of {len(c.table)} keys is past its "
                    f"max_keys ({self.t.max_keys})",
                    c.index,
                )
            data = c.data if isinstance(c.data, dict) else {}
            self.touched = {k: data.get(k) for k in c.table}
            self.replaced = True
            self.live = len(c.table)


def plan_changes(changes: list[Change], engine: Engine) -> None:
    """Check ``changes`` in order against their tables as the earlier ones leave them: 409 for
    a new key past the topic's ``max_keys`` (or a replace past it), 400 for a patch whose value
    would be over the maximum size. Nothing changes here."""
    tables: dict[str, _Table] = {}
    for c in changes:
        assert c.topic is not None
        table = tables.get(c.name)
        if table is None:
            table = tables[c.name] = _Table(c.topic)
        table.take(c, engine)


# reading


def keyed_answer(
    t: KeyedTopic,
    after: int,
    epoch: int | None,
    base: int,
    limit: int,
    budget: int,
    fill: int,
) -> bytes:
    """The JSON body of ``GET {mount}/api/topics/{name}`` for a keyed topic.

    Either the changes after ``after``, each key whose latest change is later once, as it is
    now (a set or a delete), in seq order, as a subscriber's recovery sends them; or, with
    ``"reset": true``, the whole table (live keys only, as sets in seq order): when ``after`` is
    0, when ``epoch`` is not the topic's, or when a delete after what the reader holds is
    forgotten (its tombstone outlived ``Timing.tombstones``), so the reader cannot be told of
    it. A reader drops what it holds first. That is the keyed counterpart of a ring's
    ``oldest``: there the reader compares, here only the server can, see ``base``.

    At most ``limit`` entries, fewer when their payloads pass ``budget`` bytes (never none
    when one is due). ``next`` is the ``after`` of the next page: the last entry's seq when the
    answer was cut, else the head (the reader's table now equals the topic's at ``head``).

    Why ``base``. A reader at ``after`` may hold a key deleted later, so every forgotten
    tombstone after ``after`` resets it; but a reader paging through a whole table holds only
    keys whose latest change was at most ``after`` when it read them, after the ``head`` of
    that reset: those can only be deleted after that head. The reset answer's ``base`` is its
    head, and the reader hands it back: a tombstone forgotten at or before it is of a key the
    reader never held, and neither resets it (else a table larger than a page would reset at
    every page once any delete newer than its first page was forgotten) nor is sent to it.
    """
    head = t.seq
    same = epoch is None or epoch == t.epoch
    base = min(base, head) if same else 0
    whole = after == 0 or not same or t.forgotten > max(after, base)
    rows: Iterator[tuple[str, KeyEntry]]
    if whole:
        base = head
        # a key's latest change moves it to the end of ``entries``: they are in seq order
        rows = ((k, e) for k, e in t.entries.items() if e.value is not None)
    else:
        rows = _changes(t, after, base)
    codec = t.codec
    out: list[bytes] = []
    size = 0
    last = after
    complete = True
    for key, e in rows:
        value = e.value
        size += len(key) + (0 if value is None else len(value))
        if len(out) >= limit or (out and size > budget):
            complete = False  # the reader pages on from ``next``
            break
        last = e.seq
        k = orjson.dumps(key)
        if value is None:
            out.append(b'{"seq":%d,"key":%s,"op":"delete"}' % (e.seq, k))
            continue
        if codec == Codec.JSON:
            data = b'"data":' + (value or b"null")  # stored JSON, spliced as it is
        elif codec == Codec.TEXT:
            data = b'"data":' + orjson.dumps(value.decode(errors="replace"))
        else:
            data = b'"data_b64":"' + base64.b64encode(value) + b'"'
        out.append(b'{"seq":%d,"key":%s,"op":"set",%s}' % (e.seq, k, data))
    top = (
        b'{"topic":%s,"mode":"keyed","codec":"%s","epoch":%d,"head":%d,"reset":%s,'
        b'"base":%d,"next":%d,"entries":['
        % (
            orjson.dumps(t.name),
            _CODECS.get(codec, b"json"),
            t.epoch,
            head,
            b"true" if whole else b"false",
            base,
            head if complete else last,
        )
    )
    return b"".join(chain((top, b",".join(out)), (b'],"fill":%d}' % fill,)))


_CODECS = {int(Codec.JSON): b"json", int(Codec.BYTES): b"bytes", int(Codec.TEXT): b"text"}


def _changes(t: KeyedTopic, after: int, base: int) -> Iterator[tuple[str, KeyEntry]]:
    """Each key whose latest change is after ``after``, in seq order, read from the topic's
    log as far as the page needs (``KeyedTopic.after`` builds the whole list: a reader far
    behind a large table would pay for it at every page). Deletes at or before ``base`` are
    of keys the reader never held: left out, as the engine leaves them out of a new
    subscriber's table."""
    log_seq, log_key, entries = t.log_seq, t.log_key, t.entries
    for i in range(bisect_right(log_seq, after), len(log_seq)):
        key = log_key[i]
        e = entries.get(key)
        if e is None or e.seq != log_seq[i]:
            continue  # the key changed again later (or its tombstone was forgotten)
        if e.value is None and e.seq <= base:
            continue
        yield key, e


__all__ = ["OPS", "Change", "keyed_answer", "plan_changes", "stage_change", "takes"]

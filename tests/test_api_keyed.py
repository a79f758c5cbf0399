"""Keyed topics over the HTTP API (protocol.md 5b and 8b; server/http/keyed.py): entries with
``key`` and ``op`` on ``POST /api/publish``, all or nothing (400, 409), and the table read by
``GET /api/topics/{name}``: whole, as changes after a seq, paged, reset when a delete the reader
may hold is forgotten."""

from __future__ import annotations

import base64
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from rubris_asgi import Codec, Config, Limits, Rubris, Session, Timing

from .enginekit import FakeClock

TOKEN = "keyed-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NDJSON = {"Content-Type": "application/x-ndjson", **AUTH}
TOMBSTONES = 2.0
"""Seconds a delete is remembered in these tests' servers (Timing.tombstones)."""


def make(clock: FakeClock | None = None, **kwargs: Any) -> Rubris:
    kwargs.setdefault("api_token", TOKEN)
    timing = Timing(session_timeout=1.0, tombstones=TOMBSTONES, poll_timeout=1.0)
    rubris = Rubris(
        Config(limits=kwargs.pop("limits", Limits()), timing=timing),
        batches=False,
        clock=clock,
        **kwargs,
    )

    @rubris.shared("book.{symbol}", keyed=True, max_keys=4)
    async def book(session: Session, symbol: str) -> None:
        return None

    @rubris.shared("table", keyed=True)
    async def table(session: Session) -> None:
        return None

    @rubris.shared("notes", keyed=True, codec=Codec.TEXT)
    async def notes(session: Session) -> None:
        return None

    @rubris.shared("blobs", keyed=True, codec=Codec.BYTES)
    async def blobs(session: Session) -> None:
        return None

    @rubris.shared("prices.{symbol}", ring=64)
    async def prices(session: Session, symbol: str) -> None:
        return None

    @rubris.shared("room.{id}", ring=8, presence=True)
    async def room(session: Session, id: str) -> None:
        return None

    @rubris.shared("lobby", ring=8, presence="count")
    async def lobby(session: Session) -> None:
        return None

    return rubris


@pytest.fixture
async def api() -> AsyncIterator[tuple[Rubris, httpx.AsyncClient]]:
    async with make() as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            yield rubris, http


async def publish(http: httpx.AsyncClient, body: Any, status: int = 200) -> dict[str, Any]:
    r = await http.post("/api/publish", json=body, headers=AUTH)
    assert r.status_code == status, r.text
    answer: dict[str, Any] = r.json()
    assert r.headers["rubris-fill"] == str(answer["fill"])
    return answer


async def read(http: httpx.AsyncClient, name: str, **params: Any) -> dict[str, Any]:
    r = await http.get(f"/api/topics/{name}", params=params, headers=AUTH)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = orjson.loads(r.content)
    assert r.headers["rubris-fill"] == str(body["fill"])
    return body


def seq_of(rubris: Rubris, name: str) -> int:
    t = rubris.engine.topics.get(name)
    return 0 if t is None else t.seq


# publishing


async def test_set_patch_delete_replace(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    answer = await publish(
        http,
        [
            {"topic": "table", "key": "a", "data": {"px": 1, "qty": 10}},  # op set by default
            {"topic": "table", "key": "b", "op": "set", "data": [1, 2]},
            {"topic": "table", "key": "a", "op": "patch", "data": {"qty": None, "side": "bid"}},
            {"topic": "table", "key": "c", "op": "patch", "data": {"new": True}},  # from nothing
            {"topic": "table", "key": "b", "op": "delete"},
            {"topic": "table", "key": "zz", "op": "delete"},  # not held: nothing to do
        ],
    )
    assert answer == {"accepted": 6, "duplicates": 0, "fill": 0}
    assert rubris.entries("table") == {"a": {"px": 1, "side": "bid"}, "c": {"new": True}}
    assert seq_of(rubris, "table") == 5  # four sets and patches, one delete
    # a single entry, and NDJSON
    await publish(http, {"topic": "table", "key": "d", "data": None})
    lines = [{"topic": "table", "key": "e", "data": i} for i in range(3)]
    body = b"\n".join(orjson.dumps(e) for e in lines)
    r = await http.post("/api/publish", content=body, headers=NDJSON)
    assert r.status_code == 200 and r.json()["accepted"] == 3
    assert rubris.entries("table")["e"] == 2 and rubris.entries("table")["d"] is None
    # the same value again changes nothing: no seq taken
    before = seq_of(rubris, "table")
    await publish(http, {"topic": "table", "key": "e", "data": 2})
    assert seq_of(rubris, "table") == before
    # replace: the whole table, keys it lacks deleted
    await publish(http, {"topic": "table", "op": "replace", "data": {"a": 1, "x": {"y": 2}}})
    assert rubris.entries("table") == {"a": 1, "x": {"y": 2}}
    await publish(http, {"topic": "table", "op": "replace", "data": {}})
    assert rubris.entries("table") == {}


async def test_text_and_bytes_tables(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    blob = bytes(range(256))
    await publish(
        http,
        [
            {"topic": "notes", "key": "n1", "data": "héllo"},
            {"topic": "blobs", "key": "b1", "data_b64": base64.b64encode(blob).decode()},
            {"topic": "blobs", "op": "replace", "data_b64": {"b2": "AAE=", "b3": ""}},
        ],
    )
    assert rubris.entries("notes") == {"n1": "héllo"}
    assert rubris.entries("blobs") == {"b2": b"\x00\x01", "b3": b""}
    notes = await read(http, "notes")
    assert notes["codec"] == "text"
    assert notes["entries"] == [{"seq": 1, "key": "n1", "op": "set", "data": "héllo"}]
    blobs = await read(http, "blobs")
    assert blobs["codec"] == "bytes"
    assert [(e["key"], base64.b64decode(e["data_b64"])) for e in blobs["entries"]] == [
        ("b2", b"\x00\x01"),
        ("b3", b""),
    ]


async def test_a_request_mixes_messages_and_changes(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    answer = await publish(
        http,
        [
            {"topic": "prices.A", "data": 1},
            {"topic": "book.A", "key": "189.25", "data": {"qty": 100}},
            {"topic": "prices.A", "data": 2},
        ],
    )
    assert answer["accepted"] == 3
    assert rubris.entries("book.A") == {"189.25": {"qty": 100}}
    assert rubris.engine.intake.count + seq_of(rubris, "prices.A") == 2


BAD: list[tuple[dict[str, Any], str]] = [
    ({"topic": "table", "data": 1}, "'table' is a keyed topic: an entry takes a \"key\""),
    ({"topic": "table", "op": "set", "data": 1}, 'op set needs a "key"'),
    ({"topic": "table", "op": "delete"}, 'op delete needs a "key"'),
    ({"topic": "table", "key": "a", "op": "upsert", "data": 1}, "unknown op 'upsert'"),
    ({"topic": "table", "key": "a", "op": 3, "data": 1}, "unknown op 3"),
    ({"topic": "table", "key": "a", "op": "delete", "data": 1}, "op delete takes no data"),
    ({"topic": "table", "key": "a", "op": "patch"}, "op patch takes data"),
    ({"topic": "table", "key": "a"}, "the entry has no data"),
    ({"topic": "table", "key": "", "data": 1}, "key must be a non-empty string"),
    ({"topic": "table", "key": 5, "data": 1}, "key must be a non-empty string"),
    ({"topic": "table", "key": None, "data": 1}, "key must be a non-empty string"),
    ({"topic": "table", "key": "k" * 1025, "data": 1}, "too long (1025 bytes, at most 1024)"),
    ({"topic": "table", "key": "é" * 513, "data": 1}, "too long (1026 bytes"),
    ({"topic": "table", "op": "replace", "key": "a", "data": {}}, "op replace takes no key"),
    ({"topic": "table", "op": "replace", "data": [1]}, "op replace takes data, an object"),
    ({"topic": "table", "op": "replace", "data": {"": 1}}, "data's key must be a non-empty"),
    ({"topic": "table", "key": "a", "data_b64": "AA=="}, "data_b64 is only for bytes topics"),
    ({"topic": "notes", "key": "a", "data": 5}, "a text topic takes a string"),
    ({"topic": "notes", "key": "a", "op": "patch", "data": {}}, "patch needs a JSON topic"),
    ({"topic": "notes", "op": "replace", "data": {"a": 1}}, "key 'a': a text topic takes a"),
    ({"topic": "blobs", "key": "a", "data": "x"}, "a bytes topic takes data_b64"),
    ({"topic": "blobs", "op": "replace", "data_b64": {"a": "!"}}, "key 'a': data_b64 is not"),
    ({"topic": "blobs", "op": "replace", "data": {"a": "AA=="}}, "op replace takes data_b64"),
    ({"topic": "prices.A", "key": "a", "data": 1}, '"key" and "op" are for keyed topics'),
    ({"topic": "prices.A", "op": "set", "data": 1}, "'prices.A' is a ring topic"),
    ({"topic": "table", "key": "a", "data": 1, "id": "x"}, "unknown field 'id'"),
]


@pytest.mark.parametrize(("entry", "reason"), BAD)
async def test_a_bad_entry_changes_nothing(
    api: tuple[Rubris, httpx.AsyncClient], entry: dict[str, Any], reason: str
) -> None:
    rubris, http = api
    await publish(http, {"topic": "table", "key": "kept", "data": 0})
    good = [
        {"topic": "prices.A", "data": 1},
        {"topic": "table", "key": "kept", "op": "delete"},
        {"topic": "table", "key": "new", "data": 1},
    ]
    answer = await publish(http, [*good, entry], 400)
    assert reason in answer["error"], answer
    assert answer["index"] == 3
    assert rubris.entries("table") == {"kept": 0} and seq_of(rubris, "table") == 1
    assert rubris.engine.intake.count + seq_of(rubris, "prices.A") == 0


async def test_unknown_topics_and_presence(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    answer = await publish(http, [{"topic": "table", "key": "a", "data": 1}, {"topic": "x"}], 404)
    assert answer["index"] == 1 and "no shared channel offers the topic 'x'" in answer["error"]
    # the server's own account of who subscribes: no forged member, no forged count
    for name in ("room.1@presence", "room.1@count"):
        entry = {"topic": name, "key": "mallory", "data": {"sessions": 1}}
        if name.endswith("@count"):
            entry = {"topic": name, "data": 99}
        answer = await publish(http, entry, 403)
        assert "is written by the server (presence)" in answer["error"]
    assert rubris.entries("table") == {}


async def test_max_keys_refuses_the_whole_request(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    await publish(http, [{"topic": "book.A", "key": k, "data": 1} for k in "abc"])
    # a fifth key past max_keys (4): 409 naming the entry and the topic; nothing applied, not
    # even the entries before it, nor the message of another topic
    entries = [
        {"topic": "prices.A", "data": 1},
        {"topic": "book.A", "key": "a", "data": 2},
        {"topic": "book.A", "key": "d", "data": 1},
        {"topic": "book.A", "key": "e", "data": 1},
    ]
    answer = await publish(http, entries, 409)
    assert answer["index"] == 3
    assert answer["error"] == "keyed topic 'book.A' holds its max_keys (4): 'e' not added"
    assert rubris.entries("book.A") == {"a": 1, "b": 1, "c": 1}
    assert rubris.engine.intake.count + seq_of(rubris, "prices.A") == 0
    # the request's own deletes make room, in order; a patch of a new key takes one too
    await publish(
        http,
        [
            {"topic": "book.A", "key": "d", "data": 1},
            {"topic": "book.A", "key": "a", "op": "delete"},
            {"topic": "book.A", "key": "e", "op": "patch", "data": {"q": 1}},
            {"topic": "book.A", "key": "e", "data": 5},  # held now: no new key
        ],
    )
    assert rubris.entries("book.A") == {"b": 1, "c": 1, "d": 1, "e": 5}
    answer = await publish(http, {"topic": "book.A", "key": "f", "op": "patch", "data": {}}, 409)
    assert answer["index"] == 0
    # a replace past max_keys, and one that makes room for the set after it
    table = {k: 0 for k in "pqrst"}
    answer = await publish(http, {"topic": "book.A", "op": "replace", "data": table}, 409)
    assert answer == {
        "error": "keyed topic 'book.A': a table of 5 keys is past its max_keys (4)",
        "index": 0,
        "fill": 0,
    }
    await publish(
        http,
        [
            {"topic": "book.A", "op": "replace", "data": {"p": 0, "q": 0}},
            {"topic": "book.A", "key": "r", "data": 0},
            {"topic": "book.A", "key": "b", "op": "patch", "data": {"x": 1}},  # b is gone: new
        ],
    )
    assert rubris.entries("book.A") == {"p": 0, "q": 0, "r": 0, "b": {"x": 1}}
    answer = await publish(
        http,
        [
            {"topic": "book.B", "key": "only", "data": 0},  # another topic, its own count
            {"topic": "book.A", "key": "p", "op": "delete"},
            {"topic": "book.A", "key": "s", "data": 0},
            {"topic": "book.A", "key": "t", "data": 0},
        ],
        409,
    )
    assert answer["index"] == 3 and "'book.A'" in answer["error"]
    assert rubris.entries("book.B") == {}


async def test_a_value_over_the_maximum(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    most = rubris.engine.pool.config.max_size
    big = "x" * (most * 3 // 4)
    answer = await publish(http, {"topic": "table", "key": "k", "data": "x" * most}, 400)
    assert answer["index"] == 0 and "exceeds the maximum" in answer["error"]
    # each value fits alone; the value the patch makes does not: refused before anything
    entries = [
        {"topic": "table", "key": "k", "data": {"a": big}},
        {"topic": "table", "key": "k", "op": "patch", "data": {"b": big}},
    ]
    answer = await publish(http, entries, 400)
    assert answer["index"] == 1 and "key 'k'" in answer["error"]
    assert rubris.entries("table") == {}


async def test_the_hook_is_asked_in_entry_order() -> None:
    asked: list[str] = []

    def authorize(request: Any, name: str) -> bool:
        asked.append(name)
        return name != "book.B"

    async with make(api_token=None, authorize_api=authorize) as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            entries = [
                {"topic": "book.A", "key": "a", "data": 1},
                {"topic": "prices.A", "data": 1},
                {"topic": "book.B", "key": "a", "data": 1},
            ]
            r = await http.post("/api/publish", json=entries)
            assert r.status_code == 403 and r.json()["index"] == 2
            assert asked == ["$api", "book.A", "prices.A", "book.B"]
            assert "book.A" not in rubris.engine.topics  # nothing made before the hook said no


# reading


async def test_the_whole_table_then_the_changes(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    empty = await read(http, "table")
    epoch = rubris.engine.topics["table"].epoch
    assert empty == {
        "topic": "table",
        "mode": "keyed",
        "codec": "json",
        "epoch": epoch,
        "head": 0,
        "reset": True,
        "base": 0,
        "next": 0,
        "entries": [],
        "fill": 0,
    }
    rubris.set("table", "b", {"px": 1})  # 1
    rubris.set("table", "a", {"px": 2})  # 2
    rubris.set("table", "c", [3])  # 3
    rubris.set("table", "b", {"px": 4})  # 4: b's latest change is now after a's and c's
    rubris.delete("table", "c")  # 5
    body = await read(http, "table")
    assert body["reset"] is True and (body["head"], body["base"], body["next"]) == (5, 5, 5)
    assert body["entries"] == [
        {"seq": 2, "key": "a", "op": "set", "data": {"px": 2}},
        {"seq": 4, "key": "b", "op": "set", "data": {"px": 4}},
    ]
    rubris.patch("table", "a", {"qty": 7})  # 6
    rubris.delete("table", "b")  # 7
    rubris.set("table", "d", None)  # 8
    body = await read(http, "table", epoch=epoch, after=5, base=5)
    assert body["reset"] is False and (body["head"], body["base"], body["next"]) == (8, 5, 8)
    assert body["entries"] == [
        {"seq": 6, "key": "a", "op": "set", "data": {"px": 2, "qty": 7}},
        {"seq": 7, "key": "b", "op": "delete"},
        {"seq": 8, "key": "d", "op": "set", "data": None},
    ]
    # without epoch, after is taken as of the topic's epoch (as for rings)
    assert [e["seq"] for e in (await read(http, "table", after=6))["entries"]] == [7, 8]
    # at or past the head: no entries, the cheap way to read the numbers
    for after in (8, 99):
        body = await read(http, "table", epoch=epoch, after=after)
        assert body["entries"] == [] and body["reset"] is False and body["head"] == 8
    # another epoch: the numbering restarted, the reader's table means nothing here
    body = await read(http, "table", epoch=epoch + 1, after=5, base=5)
    assert body["reset"] is True and body["base"] == 8
    assert [e["key"] for e in body["entries"]] == ["a", "d"]


async def test_pages(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    rubris, http = api
    for i in range(10):
        rubris.set("table", f"k{i}", i)  # seqs 1..10
    page = await read(http, "table", limit=4)
    assert page["reset"] is True and page["base"] == 10 and page["next"] == 4
    assert [e["seq"] for e in page["entries"]] == [1, 2, 3, 4]
    rubris.delete("table", "k1")  # 11: a key this reader holds
    rubris.set("table", "k6", 60)  # 12: one it has not read yet
    held = {e["key"]: e["data"] for e in page["entries"]}
    after, base, epoch = page["next"], page["base"], page["epoch"]
    nexts = []
    while True:
        page = await read(http, "table", epoch=epoch, after=after, base=base, limit=4)
        assert page["reset"] is False and page["base"] == 10
        for e in page["entries"]:
            if e["op"] == "delete":
                held.pop(e["key"], None)
            else:
                held[e["key"]] = e["data"]
        after = page["next"]
        nexts.append(after)
        if after == page["head"]:
            break
    assert nexts == [9, 12]  # 5, 6, 8, 9 (k6 moved to 12); then 10, 11 (k1's delete), 12
    assert held == rubris.entries("table")
    # limit=1: exactly one entry a page, and the last page says it reached the head
    body = await read(http, "table", epoch=epoch, after=10, limit=1)
    assert [e["seq"] for e in body["entries"]] == [11] and body["next"] == 11
    body = await read(http, "table", epoch=epoch, after=11, limit=1)
    assert [e["seq"] for e in body["entries"]] == [12] and body["next"] == 12


async def test_a_page_stops_at_the_body_limit() -> None:
    async with make(limits=Limits(api_body=2500)) as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            for i in range(5):
                rubris.set("table", f"k{i}", "x" * 1000)
            body = await read(http, "table")
            assert [e["seq"] for e in body["entries"]] == [1, 2] and body["next"] == 2
            rubris.set("table", "huge", "y" * 5000)
            # one entry always comes, however large: a reader never stalls on it
            body = await read(http, "table", after=5)
            assert [e["key"] for e in body["entries"]] == ["huge"] and body["next"] == 6


async def test_forgotten_deletes_reset_the_reader() -> None:
    clock = FakeClock()
    async with make(clock) as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            for k in "abcd":
                rubris.set("table", k, k)  # 1..4
            first = await read(http, "table")
            epoch = first["epoch"]
            rubris.delete("table", "b")  # 5
            rubris.set("table", "e", "e")  # 6
            clock.advance(TOMBSTONES / 2)
            rubris.delete("table", "c")  # 7
            # both deletes still known: the reader at 4 is told of them
            body = await read(http, "table", epoch=epoch, after=4, base=4)
            assert body["reset"] is False
            assert [(e["key"], e["op"]) for e in body["entries"]] == [
                ("b", "delete"),
                ("e", "set"),
                ("c", "delete"),
            ]
            clock.advance(TOMBSTONES / 2 + 0.1)  # b's tombstone is past Timing.tombstones
            assert rubris.engine.forget_tombstones(clock()) == 1
            # a reader at 4 may hold b, whose delete cannot be told any more: the whole table
            body = await read(http, "table", epoch=epoch, after=4, base=4)
            assert body["reset"] is True and (body["base"], body["next"]) == (7, 7)
            assert [(e["seq"], e["key"]) for e in body["entries"]] == [(1, "a"), (4, "d"), (6, "e")]
            # a reader at 5 or later held no b after its delete: its changes go on
            body = await read(http, "table", epoch=epoch, after=5, base=5)
            assert body["reset"] is False
            assert [(e["key"], e["op"]) for e in body["entries"]] == [("e", "set"), ("c", "delete")]
            body = await read(http, "table", epoch=epoch, after=6)  # base 0: after decides
            assert body["reset"] is False and body["base"] == 0


async def test_paging_a_whole_table_after_a_forgotten_delete() -> None:
    # A delete forgotten at or before the reset's head (base) is of a key the paging reader
    # never held: its pages go on. Without base every page would be a reset again.
    clock = FakeClock()
    async with make(clock) as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            for i in range(6):
                rubris.set("table", f"k{i}", i)  # 1..6
            rubris.delete("table", "k4")  # 7
            page = await read(http, "table", limit=2)
            assert page["reset"] is True and (page["base"], page["next"]) == (7, 2)
            held = {e["key"]: e["data"] for e in page["entries"]}
            assert held == {"k0": 0, "k1": 1}
            clock.advance(TOMBSTONES + 1)
            assert rubris.engine.forget_tombstones(clock()) == 1
            epoch = page["epoch"]
            again = await read(http, "table", epoch=epoch, after=2, limit=2)
            assert again["reset"] is True  # what a reader without base would get, every page
            after = 2
            while True:
                page = await read(http, "table", epoch=epoch, after=after, base=7, limit=2)
                assert page["reset"] is False
                # k4's delete (7, at base) is not sent: the reader never held k4
                assert all(e["op"] == "set" for e in page["entries"])
                held.update({e["key"]: e["data"] for e in page["entries"]})
                after = page["next"]
                if after == page["head"]:
                    break
            assert held == rubris.entries("table")
            # a delete after base, forgotten, may be of a key the reader holds: reset
            rubris.delete("table", "k5")  # 8
            clock.advance(TOMBSTONES + 1)
            assert rubris.engine.forget_tombstones(clock()) == 1
            page = await read(http, "table", epoch=epoch, after=after, base=7)
            assert page["reset"] is True and page["base"] == 8
            assert [e["key"] for e in page["entries"]] == ["k0", "k1", "k2", "k3"]


async def test_a_reader_folding_pages_keeps_the_table() -> None:
    # Random changes (some between a reader's pages), random forgetting, a reader that pages
    # by small limits and folds what it reads (dropping everything on a reset): whenever it
    # reaches the head its table is the topic's.
    rng = random.Random(7)
    clock = FakeClock()

    def change(n: int) -> None:
        for _ in range(n):
            key = f"k{rng.randrange(30)}"
            roll = rng.random()
            if roll < 0.5:
                rubris.set("table", key, {"v": rng.randrange(100)})
            elif roll < 0.7:
                rubris.patch("table", key, {"w": rng.randrange(100)})
            else:
                rubris.delete("table", key)
        clock.advance(rng.choice([0.0, 0.0, 0.3, 1.5]))
        rubris.engine.forget_tombstones(clock())

    async with make(clock) as rubris:
        transport = httpx.ASGITransport(app=rubris)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            held: dict[str, Any] = {}
            after = base = epoch = 0
            resets = 0
            for _round in range(40):
                change(rng.randrange(0, 40))
                for _page in range(1000):
                    limit = rng.randrange(1, 8)
                    page = await read(
                        http, "table", epoch=epoch, after=after, base=base, limit=limit
                    )
                    if page["reset"]:
                        held.clear()
                        resets += 1
                    assert len(page["entries"]) <= limit
                    for e in page["entries"]:
                        if e["op"] == "delete":
                            held.pop(e["key"], None)
                        else:
                            held[e["key"]] = e["data"]
                    after, base, epoch = page["next"], page["base"], page["epoch"]
                    if after == page["head"]:
                        break
                    if rng.random() < 0.3:
                        change(rng.randrange(1, 4))  # while the reader is between pages
                assert after == rubris.engine.topics["table"].seq
                assert held == rubris.entries("table")
            assert 1 < resets < 40


async def test_presence_counted_only_is_not_read(api: tuple[Rubris, httpx.AsyncClient]) -> None:
    _rubris, http = api
    r = await http.get("/api/topics/lobby@presence", headers=AUTH)
    assert r.status_code == 403 and "are not shown" in r.json()["error"]
    body = await read(http, "room.1@presence")
    assert body["mode"] == "keyed" and body["entries"] == []


@pytest.mark.parametrize("query", ["base=-1", "base=x", f"base={2**64}"])
async def test_a_bad_base_is_named(api: tuple[Rubris, httpx.AsyncClient], query: str) -> None:
    _rubris, http = api
    r = await http.get(f"/api/topics/table?{query}", headers=AUTH)
    assert r.status_code == 400 and r.json()["error"].startswith("?base= must be an integer")

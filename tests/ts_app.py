"""The server tests/typescript/check.ts talks to (tests/test_typescript.py serves it).

rubris at /rubris with one channel of each mode and the methods the check calls to make the
server act while it watches: publish to a snapshot or a ring topic, send to the caller's private
topic, enqueue work items, open a batch of work items, change a keyed topic's table and read it
back (``table``); ``room.{id}`` shows who subscribes (presence). Nothing is compressed except the
``big`` topic's value, which the check reads when its Node can inflate raw DEFLATE.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Mount

from rubris_asgi import Config, Reject, Rubris, Session, Timing
from rubris_asgi.batches import MemoryBatchStore

BIG_TEXT = "rubris " * 300  # 2,100 bytes that deflate well
NOTE = "n" * 100  # a book level this large changes one member as a PATCH


def make_app() -> tuple[Rubris, Starlette]:
    rubris = Rubris(
        Config(timing=Timing(poll_timeout=1.0, session_timeout=5.0)),
        compress_at=None,
        batches=MemoryBatchStore(),
    )
    trades_sent: dict[str, int] = {}

    @rubris.shared("prices.{symbol}", snapshot=True)
    async def prices(session: Session, symbol: str) -> Any:
        if symbol == "NOPE":
            raise Reject("unknown symbol")
        return {"symbol": symbol, "px": 100.0}

    @rubris.shared("trades.{symbol}", ring=16)
    async def trades(session: Session, symbol: str) -> None:
        return None

    @rubris.shared("big", snapshot=True, compress_at=64)
    async def big(session: Session) -> Any:
        return {"text": BIG_TEXT}

    @rubris.shared("book.{symbol}", keyed=True)
    async def book(session: Session, symbol: str) -> Any:
        return {"100": {"px": 100.0, "qty": 1, "note": NOTE}}

    @rubris.shared("room.{id}", snapshot=True, presence=True)
    async def room(session: Session, id: str) -> Any:  # noqa: A002
        return {"room": id}

    @rubris.private("fills", queue=64)
    async def fills(session: Session) -> None:
        return None

    @rubris.queue("jobs.{kind}")
    async def jobs(session: Session, kind: str) -> None:
        return None

    @rubris.rpc("echo")
    async def echo(session: Session, args: Any) -> Any:
        return args

    @rubris.rpc("fail")
    async def fail(session: Session, args: Any) -> Any:
        raise Reject("no such thing")

    @rubris.rpc("count")
    async def count(session: Session, args: Any) -> AsyncIterator[int]:
        """0, 1, … args - 1 as a stream; a negative count fails it (code 10)."""
        if int(args) < 0:
            raise Reject("cannot count to a negative number")
        for i in range(int(args)):
            yield i

    @rubris.rpc("set_price")
    async def set_price(session: Session, args: Any) -> int:
        symbol = str(args["symbol"])
        return rubris.publish(f"prices.{symbol}", {"symbol": symbol, "px": float(args["px"])})

    @rubris.rpc("trade")
    async def trade(session: Session, args: Any) -> int:
        """Publish ``count`` trades to ``trades.{symbol}``, numbered 1, 2, … per symbol;
        returns the last number."""
        symbol = str(args["symbol"])
        for _ in range(int(args["count"])):
            n = trades_sent.get(symbol, 0) + 1
            trades_sent[symbol] = n
            rubris.publish(f"trades.{symbol}", {"symbol": symbol, "n": n})
        return trades_sent.get(symbol, 0)

    @rubris.rpc("fill")
    async def fill(session: Session, args: Any) -> int:
        for i in range(int(args)):
            await rubris.send(session, "fills", {"i": i})
        return int(args)

    @rubris.rpc("enqueue")
    async def enqueue(session: Session, args: Any) -> int:
        for n in range(int(args["count"])):
            rubris.enqueue(f"jobs.{args['kind']}", {"n": n})
        return int(args["count"])

    @rubris.rpc("table")
    async def table(session: Session, args: Any) -> Any:
        """``{name, op, key, value}``: set, patch or delete an entry of a keyed topic, then
        ``{seq, entries}``: the topic's head and its whole table (``op`` "read" changes
        nothing)."""
        name, op = str(args["name"]), args["op"]
        if op == "set":
            rubris.set(name, args["key"], args["value"])
        elif op == "patch":
            rubris.patch(name, args["key"], args["value"])
        elif op == "delete":
            rubris.delete(name, args["key"])
        seq = rubris.engine.topics[name].seq
        return {"seq": seq, "entries": rubris.entries(name)}

    @rubris.rpc("open_batch")
    async def open_batch(session: Session, args: Any) -> str:
        """A batch of ``count`` work items on ``jobs.{kind}`` (each {"n": i}), sealed unless
        ``seal`` is false; its id."""
        batch = await rubris.batches.open()
        count = int(args["count"])
        if count:
            group = await rubris.batches.add(batch, count)
            for n, item in enumerate(group.ids()):
                rubris.enqueue(f"jobs.{args['kind']}", {"n": n}, batch_item=item)
        if args.get("seal", True):
            await rubris.batches.seal(batch)
        return batch

    app = Starlette(routes=[Mount("/rubris", rubris)], lifespan=rubris.lifespan)
    return rubris, app

"""The demo app: FastAPI with rubris mounted at /rubris and a live trading page at /.

Channels:
    prices.{symbol}   snapshot: the latest quote of each of ~50 symbols
    trades            ring of 4096: every trade printed (the Spark pipeline reads it)
    book.{symbol}     keyed: a 100-level order book, one entry per price level; a tick changes
                      a few levels, sent as PATCHes of their sizes (protocol.md 5b)
    book.{symbol}@presence, @count
                      who is watching that book now (one member per user, across tabs and
                      workers), and how many
    positions.{user}  keyed: the user's positions, one entry per symbol, marked to market
    fills             private: this session's own fills, lossless
    reprice           work queue: "reprice" jobs, worked by the page's tabs and by
                      ``python3 -m example_app.worker`` processes (competing consumers)
    reprice.failed    work queue: jobs that failed three times (dead letters)
    reprice.results   ring of 64: what each worker computed (workers PUBLISH here)
    reprice.stats     snapshot: the queue's counters, once a second
    batch.{id}        snapshot: a batch's progress (rubris's own, for reprice_all's batches)
    bars.{symbol}     ring of 256: OHLC/VWAP bars written by the Spark pipeline
                      (``python3 -m example_app.pipeline``), drawn as candles
    pipeline.batches  ring of 16: the pipeline's tracked batches, announced as they open and seal
RPC: symbols, place_order, history (streamed), reprice_result (a tab's result, published on
"reprice.results" for it: the browser client has no PUBLISH), reprice_all (one "reprice" job
per symbol enqueued as one batch, sealed; returns {"batch", "total", "ahead"}: the page
follows batch.{id} with watchBatch; one running batch a session).
Users: the page names itself with a cookie (``demo_user``, a random "trader-…" it keeps): that is
the user of its sessions (``authenticate``), so two tabs of one browser are one member of a
book's presence and share their positions.
HTTP API: POST /rubris/api/publish with the bearer token API_TOKEN (RUBRIS_API_TOKEN, or a
random one printed at start): another program can print trades on the tape.
Operations: Prometheus metrics at /metrics; the live operations page at /rubris/ops (HTTP Basic:
any user name, the API token as the password).
Batch store: in memory, like the queue whose jobs the batches track (a restart loses both, and
nothing is written to disk); RUBRIS_BATCHES=path keeps them in that SQLite file instead.
Several workers (``python3 -m example_app --workers N``) share topics, queues and batches through
the Redis of RUBRIS_REDIS_URL (batches in RedisBatchStore then, RUBRIS_BATCHES unused), and one
market: cluster.py (one worker simulates, by lease; the others follow its ticks).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.requests import HTTPConnection

from rubris_asgi import Reject, Rubris, Session
from rubris_asgi.batches import BatchStore, MemoryBatchStore, SQLiteBatchStore, State
from rubris_asgi.errors import UnknownBatch
from rubris_asgi.ops.metrics import Metrics

from . import cluster as clustering
from .market import SYMBOLS, Market

STATIC = Path(__file__).parent / "static"

API_TOKEN = os.environ.get("RUBRIS_API_TOKEN") or clustering.new_token()

REDIS_URL = clustering.redis_url()
"""RUBRIS_REDIS_URL: the Redis that several workers share (cluster.py); None: one process."""

BATCH_FILE = None if REDIS_URL else os.environ.get("RUBRIS_BATCHES") or None
"""The SQLite file of batch tracking (made when the first batch opens); None: in memory, or in
Redis with REDIS_URL (where the queue's jobs are too, for every worker).

Not rubris's default (a SQLite file in the working directory): the jobs a batch tracks live in
this process's queue, so a batch kept past a restart could only wait for jobs that are gone."""


def _batch_store() -> BatchStore:
    if REDIS_URL:
        from rubris_asgi.cluster.redis.batch_store import RedisBatchStore

        return RedisBatchStore(REDIS_URL)
    return SQLiteBatchStore(BATCH_FILE) if BATCH_FILE else MemoryBatchStore()


batch_store = _batch_store()

USER = re.compile(r"[a-z0-9-]{1,32}")
"""What a ``demo_user`` cookie may hold: anything else is no user (an anonymous session)."""


def demo_user(conn: HTTPConnection) -> str | None:
    """The page's name for itself (its ``demo_user`` cookie): a demo's stand-in for a login."""
    name = conn.cookies.get("demo_user", "")
    return name if USER.fullmatch(name) else None


rubris = Rubris(
    compress_at=512,
    api_token=API_TOKEN,
    batches=batch_store,
    ops=True,
    authenticate=demo_user,
)
market = Market()
cluster = clustering.from_env(market)
"""With RUBRIS_REDIS_URL: this worker's part in the one market of all workers; else None."""


@rubris.shared("prices.{symbol}", snapshot=True)
async def prices(session: Session, symbol: str) -> dict[str, object]:
    if symbol not in SYMBOLS:
        raise Reject(f"unknown symbol {symbol!r}")
    q = market.quotes[symbol]
    return q.as_dict(q.history[-1][0] if q.history else 0)


# a few minutes of trades: the Spark pipeline reads this ring and, stopped for less than that,
# resumes from its checkpoint without losing any
@rubris.shared("trades", ring=4096)
async def trades(session: Session) -> None:
    return None


@rubris.shared("bars.{symbol}", ring=256)
async def bars(session: Session, symbol: str) -> None:
    if symbol not in SYMBOLS:
        raise Reject(f"unknown symbol {symbol!r}")


@rubris.shared("pipeline.batches", ring=16)
async def pipeline_batches(session: Session) -> None:
    return None


@rubris.shared(
    "book.{symbol}",
    keyed=True,
    presence=True,
    presence_info=lambda session: {"name": session.user or "guest"},
)
async def book(session: Session, symbol: str) -> dict[str, dict[str, Any]]:
    if symbol not in SYMBOLS:
        raise Reject(f"unknown symbol {symbol!r}")
    return market.book(symbol).table()  # the first table, while the topic has none


@rubris.shared("positions.{user}", keyed=True, max_keys=len(SYMBOLS))
async def positions(session: Session, user: str) -> None:
    if session.user != user:
        raise Reject("these are another user's positions")


_traders: set[str] = set()
"""The users who placed an order on this worker: whose positions it marks to the market."""


def _book_fill(user: str, fill: dict[str, Any]) -> None:
    """A fill moves its user's position in its symbol: quantity, average price, P&L. The
    position is read from the table itself (this worker follows it: the user's page subscribes
    to it), so with several workers each fill starts from the position as all of them left it."""
    symbol, qty, price = fill["symbol"], fill["qty"], fill["price"]
    signed = qty if fill["side"] == "buy" else -qty
    name = f"positions.{user}"
    pos = dict(rubris.entries(name).get(symbol) or {"qty": 0, "avg": 0.0, "realized": 0.0})
    held = pos["qty"]
    if held == 0 or (held > 0) == (signed > 0):  # opening or adding: a new average
        pos["avg"] = round((held * pos["avg"] + signed * price) / (held + signed), 4)
    else:  # reducing (or flipping): what is closed is realized at this price
        closed = min(abs(held), abs(signed)) * (1 if held > 0 else -1)
        pos["realized"] = round(pos["realized"] + closed * (price - pos["avg"]), 2)
        if abs(signed) > abs(held):
            pos["avg"] = price
    pos["qty"] = held + signed
    _traders.add(user)
    _mark(name, symbol, pos)


def _mark(name: str, symbol: str, pos: dict[str, Any]) -> None:
    """A position marked to the market: its last price and unrealized P&L (a PATCH of those
    members on the wire, as the quote moves)."""
    last = round(market.quotes[symbol].last, 2)
    pnl = round(pos["qty"] * (last - pos["avg"]), 2)
    if pos.get("last") != last or pos.get("pnl") != pnl:
        rubris.set(name, symbol, {**pos, "last": last, "pnl": pnl})


async def mark_positions(every: float = 0.25) -> None:
    """Mark the positions of this worker's traders to its market (the holder's prices, at
    most a second old on the others: cluster.py)."""
    while True:
        await asyncio.sleep(every)
        for user in list(_traders):
            name = f"positions.{user}"
            if not rubris.has_subscribers(name):
                _traders.discard(user)  # its pages are gone: marked again at its next fill
                continue
            for symbol, pos in rubris.entries(name).items():
                _mark(name, symbol, pos)


@rubris.private("fills", queue=256, batch=8)
async def fills(session: Session) -> None:
    return None


REPRICE_MAX = 1000
"""The reprice queue's max_length: jobs waiting at most."""


@rubris.queue("reprice", max_length=REPRICE_MAX, delivery_limit=3, dead_letter="reprice.failed")
async def reprice(session: Session) -> None:
    return None


@rubris.queue("reprice.failed")
async def reprice_failed(session: Session) -> None:
    return None


@rubris.shared("reprice.results", ring=64, client_publish=True)
async def reprice_results(session: Session) -> None:
    return None


@rubris.rpc("reprice_result")
async def reprice_result(session: Session, args: Any) -> None:
    """A page tab's result of a reprice job, published on "reprice.results" as a worker would."""
    if not isinstance(args, dict):
        raise Reject("a result is an object: {job, symbol, fair, worker, attempt, ms}")
    result = {k: args.get(k) for k in ("job", "symbol", "fair", "worker", "attempt", "ms")}
    counts = (result["job"], result["attempt"], result["ms"])
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
        raise Reject("job, attempt and ms are whole numbers")
    if result["symbol"] not in SYMBOLS:
        raise Reject(f"unknown symbol {result['symbol']!r}")
    if not isinstance(result["fair"], int | float) or isinstance(result["fair"], bool):
        raise Reject("fair is a number")
    worker = result["worker"]
    if not isinstance(worker, str) or not 1 <= len(worker) <= 40:
        raise Reject("worker is a name of 1 to 40 characters")
    rubris.publish("reprice.results", result)


@rubris.shared("reprice.stats", snapshot=True)
async def reprice_stats(session: Session) -> dict[str, int]:
    return _reprice_stats()


def _reprice_stats() -> dict[str, int]:
    """What reprice.stats shows: the queue's counters, with several workers summed over all of
    them by the market's holder, which alone publishes them (cluster.py)."""
    own = _queue_stats()
    return own if cluster is None else cluster.queue_stats(own)


def _queue_stats() -> dict[str, int]:
    try:
        st = rubris.queue_stats("reprice")
    except KeyError:  # no job enqueued yet
        return {"waiting": 0, "outstanding": 0, "consumers": 0, "acked": 0, "revoked": 0}
    return {
        "waiting": st.waiting,
        "outstanding": st.outstanding,
        "consumers": st.consumers,
        "acked": st.acked,
        "nacked": st.nacked,
        "revoked": st.revoked,
        "dead_lettered": st.dead_lettered,
    }


REPRICE_BACKLOG = 40
"""The simulator stops adding jobs while this many wait: nobody working means no pile-up."""

_job_numbers = itertools.count(1)
"""Job numbers, shared by the simulator's jobs and reprice_all's (one process alone)."""


async def _take_job_numbers(n: int) -> list[int]:
    """``n`` job numbers: this process's, or with several workers Redis's (no two alike)."""
    if cluster is not None:
        return list(await cluster.numbers(n))
    return list(itertools.islice(_job_numbers, n))


def _reprice_job(symbol: str, number: int) -> dict[str, object]:
    """A "reprice" job as the tabs and ``example_app.worker`` work it."""
    return {"job": number, "symbol": symbol, "last": market.quotes[symbol].last}


_session_batches: dict[str, str] = {}
"""The batch each session started last with reprice_all (one may run at a time)."""
_starting: set[str] = set()
"""Sessions whose reprice_all is under way."""


@rubris.rpc("reprice_all")
async def reprice_all(session: Session, args: Any) -> dict[str, object]:
    """One "reprice" job per symbol, tracked as one batch; returns ``{batch, total, ahead}``.

    The jobs are the simulator's kind ({job, symbol, last}) on the same queue, so whoever
    works the queue works them, unaware of the batch: the ACK of a job marks its batch item
    done, its dead letter failed. ``ahead``: the jobs waiting before them (the queue is FIFO).
    """
    if session.id in _starting:
        raise Reject("this session is already starting a batch")
    _starting.add(session.id)
    try:
        return await _reprice_all(session)
    finally:
        _starting.discard(session.id)


async def _reprice_all(session: Session) -> dict[str, object]:
    batches = rubris.batches
    live = {s.id for s in rubris.sessions()}
    for sid in [sid for sid in _session_batches if sid not in live]:  # sessions gone
        del _session_batches[sid]
    running = _session_batches.get(session.id)
    if running is not None:
        try:
            st = await batches.status(running)
        except UnknownBatch:  # forgotten a day after it ended
            pass
        else:
            if st.state in (State.OPEN, State.SEALED):
                raise Reject(
                    f"batch {running} from this session is still running"
                    f" ({st.done + st.failed} / {st.total} jobs ended)"
                )
    symbols = list(SYMBOLS)
    _check_room(len(symbols))  # before a batch is opened for nothing
    batch = await batches.open()
    group = await batches.add(batch, len(symbols))
    numbers = await _take_job_numbers(len(symbols))
    try:
        _check_room(len(symbols))  # others may have enqueued during the awaits
    except Reject:
        await batches.fail(group.ids())  # ends at once: complete, every item failed
        await batches.seal(batch)
        raise
    ahead = _queue_stats()["waiting"]
    # no await from the room check to the last job: all of them go in, or none
    for i, symbol in enumerate(symbols):
        job = _reprice_job(symbol, numbers[i])
        rubris.enqueue("reprice", job, id=f"{batch}:{i}", batch_item=group.id(i))
    await batches.seal(batch)
    _session_batches[session.id] = batch
    return {"batch": batch, "total": len(symbols), "ahead": ahead}


def _check_room(n: int) -> None:
    waiting = _queue_stats()["waiting"]
    if waiting + n > REPRICE_MAX:
        raise Reject(
            f"the reprice queue has room for {max(0, REPRICE_MAX - waiting)} more jobs, not {n}"
            f" ({waiting} of {REPRICE_MAX} waiting): let the workers catch up first"
        )


@rubris.rpc("symbols")
async def symbols(session: Session, args: Any) -> list[dict[str, str]]:
    return [{"symbol": s, "name": n} for s, n in SYMBOLS.items()]


@rubris.rpc("place_order")
async def place_order(session: Session, args: Any) -> dict[str, object]:
    if not isinstance(args, dict):
        raise Reject("an order is an object: {symbol, side, qty}")
    symbol, side, qty = args.get("symbol"), args.get("side"), args.get("qty")
    if symbol not in SYMBOLS:
        raise Reject(f"unknown symbol {symbol!r}")
    if side not in ("buy", "sell"):
        raise Reject("side must be 'buy' or 'sell'")
    if not isinstance(qty, int) or isinstance(qty, bool) or not 1 <= qty <= 10_000:
        raise Reject("qty must be a whole number from 1 to 10000")
    if session.private("fills") is None:
        raise Reject("subscribe to 'fills' first to receive your fills")
    fill = market.fill(symbol, side, qty)
    # the fill arrives on the private topic a moment after the order is accepted
    asyncio.get_running_loop().call_later(0.05, _deliver_fill, session, fill)
    return {"order_id": fill["order_id"], "status": "accepted"}


def _deliver_fill(session: Session, fill: dict[str, object]) -> None:
    with contextlib.suppress(Exception):  # the session may have ended meanwhile
        rubris.send_nowait(session, "fills", fill)
    if isinstance(session.user, str):
        _book_fill(session.user, fill)


@rubris.rpc("history")
async def history(session: Session, args: Any) -> AsyncIterator[dict[str, object]]:
    symbol = args.get("symbol") if isinstance(args, dict) else None
    if symbol not in SYMBOLS:
        raise Reject(f"unknown symbol {symbol!r}")
    for ts, last in list(market.quotes[symbol].history):
        yield {"ts": ts, "last": last}


async def simulate(tick: float = 0.1) -> None:
    """Move every price each tick, print a few trades, step the watched books.

    With several workers, only in the one that holds the market's lease (cluster.py)."""
    rng = market.rng
    syms = list(SYMBOLS)
    stepped: set[str] = set()
    """The books stepped last tick: a book watched again (or by a new holder) is sent whole
    first, as the differences from what its topic holds."""
    n = 0
    while True:
        await asyncio.sleep(tick)
        if cluster is not None and not cluster.holds:
            continue  # the lease may be another worker's by now
        n += 1
        moved = []
        for sym in syms:
            if rng.random() < 0.6:
                rubris.publish(f"prices.{sym}", market.step(sym))
                moved.append(sym)
        for _ in range(rng.randrange(0, 4)):
            rubris.publish("trades", market.trade(rng.choice(syms)))
        stepped = _step_books(syms, stepped)
        if n % 2 == 0 and _queue_stats()["waiting"] < REPRICE_BACKLOG:
            symbol = rng.choice(syms)
            (number,) = await _take_job_numbers(1)
            rubris.enqueue("reprice", _reprice_job(symbol, number), id=f"job-{number}")
        if n % 10 == 0:
            rubris.publish("reprice.stats", _reprice_stats())
        if cluster is not None:
            await cluster.record(moved)  # the other workers' markets follow this one


def _step_books(syms: list[str], stepped: set[str]) -> set[str]:
    """Step the books someone watches (here, or on another worker); returns their symbols."""
    now: set[str] = set()
    for sym in syms:
        name = f"book.{sym}"
        if not (rubris.has_subscribers(name) or (cluster is not None and sym in cluster.books)):
            continue
        book_ = market.book(sym)
        changes = book_.step(market.quotes[sym].bid)
        if sym not in stepped:
            rubris.replace(name, book_.table())
        else:
            for op, key, level in changes:
                if op == "set":
                    rubris.set(name, key, level)
                else:
                    rubris.delete(name, key)
        now.add(sym)
    return now


def _report() -> dict[str, object]:
    """This worker's report to the market's holder (cluster.py): its own queue counters, and
    the books its sessions watch."""
    books = [s for s in SYMBOLS if rubris.has_subscribers(f"book.{s}")]
    return {"queue": _queue_stats(), "books": books}


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with rubris:
        # with several workers, the simulation runs where the market's lease is (cluster.py)
        task = asyncio.create_task(
            simulate() if cluster is None else cluster.run(simulate, _report)
        )
        marking = asyncio.create_task(mark_positions())
        try:
            yield
        finally:
            for t in (task, marking):
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            if cluster is not None:
                await cluster.close()  # the lease goes at once to a worker that carries on


app = FastAPI(title="rubris_asgi demo", lifespan=lifespan)
app.add_route("/metrics", Metrics(rubris), include_in_schema=False)
app.mount("/rubris", rubris)
app.mount("/static", StaticFiles(directory=STATIC), name="static")


@app.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html")

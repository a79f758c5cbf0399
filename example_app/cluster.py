"""Several workers, one market: ``python3 -m example_app --workers N`` with ``RUBRIS_REDIS_URL``.

rubris shares the topics, the work queues and the batches of every worker through Redis, but the
simulated market is the demo's own: every worker imports example_app.app, and each would run its
random walk on the same topics (the page's prices would jump between N markets). So, in Redis,
under keys of their own (``example:*``, next to rubris's ``rubris:*``):

- **One simulator, by lease.** ``SET example:market <worker> NX PX 3000``: the worker that set it
  runs ``simulate()``. It renews the lease every second while it still holds it (``RENEW``: a
  compare-and-expire), and stops moving prices once it cannot be sure it holds it any more (2.5 s
  after its last successful renewal was sent). The others try every second, so a holder that dies
  is replaced within about 3 s; one that stops releases the lease at once (the same script,
  expiring it now).
- **Every worker's copy of the market.** Each tick the holder appends the quotes it moved to the
  stream ``example:ticks`` (``XADD``, pipelined with its expiry): field ``q``, JSON
  ``{symbol: [step, ts, last, bid, ask]}``, and field ``t``, the last trade id. The stream keeps
  about ``TICKS_KEPT`` ticks (a minute) and expires a minute after the last one. Every other
  worker reads what is new each second into its own ``Market``, so ``place_order`` fills at the
  market's prices (at most a second old), ``history`` streams the market's recent prices and a
  new subscriber's first quote or book is the market's. A worker that takes the lease first reads
  the stream to its end: the market goes on from the last holder's prices, step counts and trade
  ids (each quote's ``step`` counts its moves: one market, one count).
- **Job numbers** come from ``INCRBY example:jobs n`` (never expires): a reprice job's number,
  and the queue id ``job-N`` of the simulator's jobs, are unique across workers and across
  holders, as they must be with the queue's dedup window shared by all.
- **Reports.** Each second every worker writes its field of the hash ``example:workers``: its own
  reprice counters (rubris counts consumers, deliveries and ACKs per worker; only ``waiting`` is
  global: Redis's queue length) and the order books its sessions watch (``has_subscribers`` is
  per worker). The holder sums the reports of the last 3 s into ``reprice.stats``, which it alone
  publishes (a worker gone drops out of the sums), and refreshes every book some worker watches.

Order ids stay per worker: an order's fill goes to its own session, which lives on the worker
that took the order, and the id only labels it there. Without ``RUBRIS_REDIS_URL`` none of this
runs (the module does not even import redis): one process, its own market, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

import orjson

from rubris_asgi.cluster import ENV as REDIS_ENV
from rubris_asgi.ops.observer import worker_id
from rubris_asgi.ops.workers import ENV as STATS_ENV

from .market import Market

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("example_app")

LEASE = "example:market"
"""The market's lease: the holder's worker id, for ``LEASE_MS``."""
TICKS = "example:ticks"
"""The stream of the market's ticks (module docstring)."""
REPORTS = "example:workers"
"""Each worker's report, a field of this hash (module docstring)."""
JOBS = "example:jobs"
"""The last reprice job number given out."""

LEASE_MS = 3000
BEAT = 1.0
"""Seconds between two turns of ``Cluster.run``: renew or take the lease, sync, report."""
MARGIN = 0.5
"""Seconds before the lease's end at which its holder stops, unsure its renewal arrived."""
TICKS_KEPT = 600
TICKS_TTL_MS = 60_000
REPORT_AGE = 3.0
"""Seconds after which a worker's report is left out (the worker is gone) and removed."""
REDIS_TIMEOUT = 1.0
"""Seconds a Redis command may take before it counts as failed."""

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
"""Compare-and-expire: ``ARGV[2]`` ms more if ``ARGV[1]`` still holds the lease (0: release)."""


def new_token() -> str:
    """A random API token for a demo started without one: 128 bits in hex.

    Hex, not ``token_urlsafe``: a URL-safe token starts with ``-`` one time in 64, and a command
    line ``--token -x...`` is then read as an option (argparse: "expected one argument").
    """
    return secrets.token_hex(16)


def redis_url() -> str | None:
    """The Redis the workers share (``$RUBRIS_REDIS_URL``, which rubris reads too), or None."""
    return os.environ.get(REDIS_ENV) or None


def prepare_workers(workers: int) -> str | None:
    """In ``python3 -m example_app --workers N``, before the app is imported: what every worker
    must agree on. The API token (``$RUBRIS_API_TOKEN``, made up when unset, so that the printed
    curl command and ops password are every worker's) and, unless set, a directory for the
    workers' figures (``$RUBRIS_STATS_DIR``: the ops page lists every worker). Returns the
    directory made here, to remove at the end, or None."""
    if workers < 2:
        return None
    if redis_url() is None:
        raise SystemExit(
            f"--workers {workers} needs Redis, which the workers share: set {REDIS_ENV}, e.g."
            f" {REDIS_ENV}=redis://127.0.0.1:6379/0 (a redis-server with --appendonly yes)"
        )
    if not os.environ.get("RUBRIS_API_TOKEN"):
        os.environ["RUBRIS_API_TOKEN"] = new_token()
    if any(os.environ.get(name) for name in STATS_ENV):
        return None
    made = tempfile.mkdtemp(prefix="rubris-demo-stats-")
    os.environ[STATS_ENV[0]] = made
    return made


class Cluster:
    """This worker's part in one market shared by several (module docstring)."""

    def __init__(self, url: str, market: Market) -> None:
        from redis.asyncio import Redis  # the redis extra, only with RUBRIS_REDIS_URL
        from redis.exceptions import RedisError

        self.failures: tuple[type[Exception], ...] = (OSError, asyncio.TimeoutError, RedisError)
        """What a Redis command that failed raises."""
        self.market = market
        self.worker = worker_id()
        self.redis: Redis = Redis.from_url(
            url, socket_timeout=REDIS_TIMEOUT, socket_connect_timeout=REDIS_TIMEOUT
        )
        self._renew = self.redis.register_script(RENEW)
        self._until = 0.0
        """``time.monotonic()`` up to which the lease is surely this worker's."""
        self._cursor: bytes | str = "0"
        """The last entry of ``TICKS`` this worker's market has (read, or written)."""
        self._others: dict[str, dict[str, Any]] = {}
        """The other workers' fresh reports (the holder's view)."""
        self.books: set[str] = set()
        """The symbols whose book some other worker's sessions watch (the holder's view)."""
        self._trouble = False

    @property
    def holds(self) -> bool:
        """Whether this worker runs the market now."""
        return time.monotonic() < self._until

    async def numbers(self, n: int) -> range:
        """``n`` reprice job numbers no other worker gets."""
        end = int(await self.redis.incrby(JOBS, n))
        return range(end - n + 1, end + 1)

    def queue_stats(self, own: dict[str, int]) -> dict[str, int]:
        """``own`` (this worker's reprice counters, ``waiting`` global already) plus the other
        workers' as they last reported them (the holder's figures: it alone publishes them)."""
        out = dict(own)
        for report in self._others.values():
            for key, value in report.get("queue", {}).items():
                if key != "waiting" and isinstance(value, int):
                    out[key] = out.get(key, 0) + value
        return out

    async def record(self, moved: Iterable[str]) -> None:
        """The holder's tick: the quotes of ``moved`` (just stepped) onto ``TICKS``."""
        quotes = self.market.quotes
        tick = {
            s: [quotes[s].step, *quotes[s].history[-1], quotes[s].bid, quotes[s].ask] for s in moved
        }
        if not tick:
            return
        fields: dict[str, bytes | int] = {"q": orjson.dumps(tick), "t": self.market.trade_id}
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(TICKS, fields, maxlen=TICKS_KEPT, approximate=True)  # type: ignore[arg-type]
            pipe.pexpire(TICKS, TICKS_TTL_MS)
            entry, _ = await pipe.execute()
        self._cursor = entry  # not read back as another holder's ticks, should this one lose

    async def run(
        self,
        simulate: Callable[[], Coroutine[Any, Any, None]],
        report: Callable[[], dict[str, Any]],
    ) -> None:
        """Every ``BEAT`` until cancelled: renew or take the lease, running ``simulate()`` while
        it holds it (started again should it fail); or bring the market up to date. Then write
        ``report()``, this worker's report."""
        task: asyncio.Task[None] | None = None
        try:
            while True:
                began = time.monotonic()
                try:
                    task = await self._beat(simulate, report, task, began)
                except self.failures as exc:
                    if not self._trouble:
                        log.warning("worker %s: Redis failed (%r); trying again", self.worker, exc)
                    self._trouble = True
                else:
                    if self._trouble:
                        log.warning("worker %s: Redis answers again", self.worker)
                    self._trouble = False
                if task is not None and not self.holds:  # lost, or no longer sure of it
                    log.warning("worker %s no longer runs the market", self.worker)
                    await _stop(task)
                    task = None
                await asyncio.sleep(max(0.0, BEAT - (time.monotonic() - began)))
        finally:
            if task is not None:
                await _stop(task)

    async def _beat(
        self,
        simulate: Callable[[], Coroutine[Any, Any, None]],
        report: Callable[[], dict[str, Any]],
        task: asyncio.Task[None] | None,
        began: float,
    ) -> asyncio.Task[None] | None:
        if task is not None:
            if await self._renew(keys=[LEASE], args=[self.worker, LEASE_MS]):
                self._until = began + LEASE_MS / 1000 - MARGIN
            else:
                self._until = 0.0  # run() stops the simulation
        else:
            await self._catch_up()
            if await self.redis.set(LEASE, self.worker, nx=True, px=LEASE_MS):
                self._until = began + LEASE_MS / 1000 - MARGIN
                await self._catch_up()  # what the last holder wrote since
                print(f"worker {self.worker} runs the market", flush=True)
                task = asyncio.create_task(simulate())
        if task is not None and task.done() and self.holds:
            if not task.cancelled() and task.exception() is not None:
                log.error(
                    "the market simulation failed: starting it again", exc_info=task.exception()
                )
            task = asyncio.create_task(simulate())
        await self._report(report())
        return task

    async def _catch_up(self) -> None:
        """Apply the ticks written since ``_cursor`` to this worker's market."""
        quotes, market = self.market.quotes, self.market
        while True:
            got: Any = await self.redis.xread({TICKS: self._cursor}, count=1000)
            entries: list[tuple[bytes, dict[bytes, bytes]]] = got[0][1] if got else []
            for entry, fields in entries:
                for symbol, (step, ts, last, bid, ask) in orjson.loads(fields[b"q"]).items():
                    q = quotes.get(symbol)
                    if q is not None:
                        q.step, q.last, q.bid, q.ask = step, last, bid, ask
                        q.history.append((ts, round(last, 2)))
                market.trade_id = max(market.trade_id, int(fields[b"t"]))
                self._cursor = entry
            if len(entries) < 1000:
                return

    async def _report(self, mine: dict[str, Any]) -> None:
        now = time.time()
        holds = self.holds
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(REPORTS, self.worker, orjson.dumps({**mine, "at": now}))
            pipe.pexpire(REPORTS, int(REPORT_AGE * 1000) * 3)
            if holds:
                pipe.hgetall(REPORTS)
            replies = await pipe.execute()
        self._others = {}
        self.books = set()
        if not holds:
            return
        gone = []
        for field, value in replies[2].items():
            name = field.decode()
            report = orjson.loads(value)
            if now - float(report.get("at", 0)) > REPORT_AGE:
                gone.append(field)
            elif name != self.worker:
                self._others[name] = report
                self.books.update(report.get("books", ()))
        if gone:
            await self.redis.hdel(REPORTS, *gone)

    async def close(self) -> None:
        """Release the lease (if still this worker's) and say goodbye; after ``run``."""
        self._until = 0.0
        with contextlib.suppress(*self.failures):
            await self._renew(keys=[LEASE], args=[self.worker, 0])
            await self.redis.hdel(REPORTS, self.worker)
        await self.redis.aclose()


def from_env(market: Market) -> Cluster | None:
    """A ``Cluster`` for ``market`` when ``$RUBRIS_REDIS_URL`` is set, else None."""
    url = redis_url()
    return Cluster(url, market) if url else None


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled() and task.exception() is not None:
        log.error("the market simulation failed", exc_info=task.exception())

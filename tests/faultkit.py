"""The fault suite's machinery, shared by tests/test_faults.py and bench/faults.py.

One scenario (:func:`run`) is: a fresh ``redis-server`` (append-only file, and the DEBUG
command enabled so that ``DEBUG SLEEP`` can stall it), two real uvicorn nodes of
tests/fault_app.py on it, a :class:`~tests.lbkit.Balancer` in front of them, and ``clients``
of the project's own Python client, each subscribed to the ring topics and its private inbox,
every other one also consuming the work queue. A :class:`Load` publishes to the rings, sends
private messages (``send_to`` from node B, through the node's ``/fault/send``) and enqueues
work items at a steady rate; the scenario's fault strikes in the middle; then the load stops
and every promise is counted (:class:`Tally`):

- every ring seq 1..head of every client received exactly once or inside a GAP it was told;
- every accepted ring publish numbered (seen by some client);
- every private message whose ``send_to`` returned received exactly once, every one that
  raised a *refused* error never received;
- every accepted work item handled and ACKed (nothing left in Redis), a second delivery of
  an item always marked ``attempt`` + 1;
- every client whose connection the fault dropped resumed its session (where the node lives).

Scenarios: ``reset`` (every connection to node A reset by RST, clients resumed on B),
``blackhole`` (the paths to node A dead without a reset, noticed by the client's heartbeat),
``kill`` (node A killed with SIGKILL), ``redis_restart`` (Redis stopped and started again, its
data in the append-only file), ``redis_stall`` (``DEBUG SLEEP`` past ``node_timeout``),
``burst`` (every session of node A resumed on B at once, then one ``send_to`` to each from B,
all at once).

Everything is bounded: every wait has a deadline, the load runs for a fixed time, and a
scenario's settling stops as soon as nothing more can come.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import redis as redis_sync

from rubris_asgi.client import Client, GapInfo, PushInfo, QueueItem
from rubris_asgi.cluster.redis.queues.runs import records_of

from .fault_app import NODE_TIMEOUT, TOKEN
from .lbkit import Balancer
from .rediskit import RedisServer, _free_port

REFUSED = frozenset({"SessionClosed", "QueueFull", "ProtocolError", "BrokerUnavailable"})
"""Exceptions of ``send_to`` that say the message was certainly not delivered; any other
(a "may have been delivered" error, a timeout) is an *unknown* outcome."""
START_S = 30.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The repository: the nodes import ``tests.fault_app`` from there."""
PREFIX = "rubris:"
QUEUE = "work"
UNANSWERED = "Unanswered"
"""The outcome of a ``send_to`` not answered within ``Scale.inflight_s`` (an unknown)."""
END = -1
"""The payload ``p`` of the marker published on each ring after the load: its seq is the head
every client must reach."""
SETTLE_BASE_S = 20.0
SETTLE_PER_CLIENT_S = 0.25
"""The bound on the rings' settling: 20 s + 0.25 s a client (270 s for 1,000). Measured on
2 busy cores: 1,000 sessions relayed through Redis after ``reset`` took ~120 s to reach the
marker (~900-1,100 ring messages/s)."""
SETTLE_IDLE_S = 10.0
"""The settling also ends when no client received anything for this long (nothing more is
coming): the relay's progress is bursty, with pauses of 2-4 s under load."""


# ---------------------------------------------------------------------------- Redis and nodes


class FaultRedis(RedisServer):
    """A ``RedisServer`` with its append-only file (so a restart keeps the data, and a node that
    checks Redis's persistence accepts it) and ``--enable-debug-command local`` (Redis 7 refuses
    ``DEBUG SLEEP`` without it). The flag goes through a two-line wrapper script named as the
    executable, so rediskit's launching and waiting are reused as they are."""

    def __init__(self) -> None:
        self._wrap_dir = tempfile.mkdtemp(prefix="rubris-faultredis-")
        wrapper = os.path.join(self._wrap_dir, "redis-server")
        real = "redis-server"
        for d in os.environ.get("PATH", "").split(os.pathsep):
            if os.access(os.path.join(d, real), os.X_OK):
                real = os.path.join(d, real)
                break
        with open(wrapper, "w") as f:  # exec: the pid rediskit holds is redis-server's
            f.write(f'#!/bin/sh\nexec {real} "$@" --enable-debug-command local\n')
        os.chmod(wrapper, os.stat(wrapper).st_mode | stat.S_IXUSR)
        super().__init__(wrapper, persist=True)

    async def stall(self, seconds: float) -> None:
        """``DEBUG SLEEP seconds``: Redis answers nobody for that long. Returns when it is
        awake again (its reply to the command)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        arg = f"{seconds:.3f}"
        writer.write(f"*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n${len(arg)}\r\n{arg}\r\n".encode())
        try:
            reply = await asyncio.wait_for(reader.readline(), seconds + 10)
            if not reply.startswith(b"+OK"):
                raise RuntimeError(f"DEBUG SLEEP answered {reply!r}")
        finally:
            writer.close()

    def sync(self) -> redis_sync.Redis:
        return redis_sync.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def stop(self) -> None:
        super().stop()
        with contextlib.suppress(OSError):
            os.remove(os.path.join(self._wrap_dir, "redis-server"))
            os.rmdir(self._wrap_dir)


class Node:
    """One uvicorn process serving tests/fault_app.py on its own port; its output goes to a
    file (a busy scenario's warnings never block it on a pipe), read by :meth:`log`."""

    def __init__(self, redis_url: str, logdir: str, name: str) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.redis_url = redis_url
        self.logfile = os.path.join(logdir, f"node-{name}.log")
        self.proc: asyncio.subprocess.Process | None = None
        self.killed = False
        self.paused = False

    async def start(self) -> None:
        env = {**os.environ, "RUBRIS_REDIS_URL": self.redis_url}
        argv = [
            sys.executable,
            "-m",
            "uvicorn",
            "tests.fault_app:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            "--no-access-log",
            "--ws-per-message-deflate",
            "false",
            "--backlog",
            "4096",
            # a send_to still waiting (for a dead node's answer) must not hold a stop up
            "--timeout-graceful-shutdown",
            "3",
        ]
        log = await asyncio.to_thread(open, self.logfile, "wb")
        with log:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        async with httpx.AsyncClient(timeout=2) as http:
            deadline = time.monotonic() + START_S
            while time.monotonic() < deadline:
                if self.proc.returncode is not None:
                    raise AssertionError(f"node exited with {self.proc.returncode}:\n{self.log()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(self.base + "/rubris/client.js")).status_code == 200:
                        return
                await asyncio.sleep(0.05)
        raise AssertionError(f"{self.base} did not come up in {START_S} s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL: no drain, no goodbye, its Redis custody left for the others to reclaim."""
        assert self.proc is not None
        self.proc.kill()
        self.killed = True

    def pause(self) -> None:
        """SIGSTOP: the process stands still, its sockets open, until ``resume``."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    async def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if self.paused and proc.returncode is None:
            self.resume()
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 8)
            except asyncio.TimeoutError:
                proc.kill()
        await proc.wait()

    def log(self, tail: int = 40) -> str:
        with contextlib.suppress(OSError), open(self.logfile, "rb") as f:
            return b"\n".join(f.read().splitlines()[-tail:]).decode(errors="replace")
        return ""

    def log_lines(self) -> int:
        with contextlib.suppress(OSError), open(self.logfile, "rb") as f:
            return len(f.read().splitlines())
        return 0


# ---------------------------------------------------------------------------- one client


class Watch:
    """One client and everything it received."""

    def __init__(self, index: int, client: Client, topics: list[str]) -> None:
        self.index = index
        self.client = client
        self.first_sid = ""
        self.seqs: dict[str, list[int]] = {t: [] for t in topics}
        self.payloads: dict[str, set[int]] = {t: set() for t in topics}
        self.gaps: dict[str, list[tuple[int, int]]] = {t: [] for t in topics}
        self.epochs: dict[str, set[int]] = {t: set() for t in topics}
        self.private: collections.Counter[int] = collections.Counter()
        self.items: list[tuple[int, int]] = []  # (item id, attempt), in delivery order
        self.subs: dict[str, Any] = {}
        self.end_seq: dict[str, int] = {}
        """The seq of the end marker on each ring, once received: the head to reach."""

    def on_ring(self, topic: str) -> Callable[[Any, PushInfo], None]:
        def got(value: Any, info: PushInfo) -> None:
            self.seqs[topic].append(info.seq)
            p = int(value["p"])
            self.payloads[topic].add(p)
            if p == END:
                self.end_seq[topic] = info.seq
            sub = self.subs.get(topic)
            if sub is not None:
                self.epochs[topic].add(sub.epoch)

        return got

    def on_gap(self, topic: str) -> Callable[[GapInfo], None]:
        def gap(info: GapInfo) -> None:
            self.gaps[topic].append((info.start, info.count))

        return gap

    def on_private(self, value: Any, info: PushInfo) -> None:
        self.private[int(value["n"])] += 1

    def last(self, topic: str) -> int:
        """The highest seq this client has been given or told lost."""
        top = max(self.seqs[topic], default=0)
        for start, count in self.gaps[topic]:
            top = max(top, start + count - 1)
        return top


async def open_watch(
    index: int, url: str, topics: list[str], consume: bool, work_s: float
) -> Watch:
    client = Client(url, backoff=(0.05, 0.5), open_timeout=20.0)
    await client.connect()
    w = Watch(index, client, topics)
    w.first_sid = client.session_id or ""
    for t in topics:
        w.subs[t] = await client.subscribe(t, w.on_ring(t), on_gap=w.on_gap(t))
    await client.subscribe("inbox", w.on_private)
    if consume:

        async def handle(item: QueueItem) -> None:
            w.items.append((int(item.value["id"]), item.attempt))
            await asyncio.sleep(work_s)  # the work: long enough that items are in hand

        await client.consume(QUEUE, handle, prefetch=4, codel_target=None)
    return w


# ---------------------------------------------------------------------------- the probe

FROZEN_S = 10.0
"""A node that answers no request for this long is frozen (a loop that never awaits; seen in
issue 35: a node spinning for good after a long Redis stall). Far above what a busy node on
2 cores takes to answer (well under a second), far below the minutes a freeze lasts."""


class Probe:
    """Asks every node ``GET /fault/ping`` four times a second, from the start of the load to
    its count, and keeps the longest time each went without an answer (a node killed or paused
    by the scenario is not asked meanwhile)."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.longest = [0.0] * len(nodes)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._ask(i)) for i in range(len(self.nodes))]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _ask(self, i: int) -> None:
        node = self.nodes[i]
        loop = asyncio.get_running_loop()
        answered = loop.time()
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                await asyncio.sleep(0.25)
                now = loop.time()
                if node.killed or node.paused:
                    answered = now
                    continue
                ok = False
                with contextlib.suppress(httpx.HTTPError):
                    ok = (await http.get(node.base + "/fault/ping")).status_code == 200
                now = loop.time()
                self.longest[i] = max(self.longest[i], now - answered)  # since the last answer
                if ok:
                    answered = now

    @property
    def frozen(self) -> int:
        return sum(s > FROZEN_S for s in self.longest)


# ---------------------------------------------------------------------------- the load


@dataclass
class Scale:
    """How big a scenario is: clients and the load's rates."""

    clients: int = 40
    topics: int = 2
    tick: float = 0.05
    """Seconds between the load's rounds: one publish per ring topic, a few private sends,
    a few work items each round."""
    sends_per_tick: int = 8
    items_per_tick: int = 2
    work_s: float = 0.2
    """A work item's handling time: long enough that consumers have items in hand (and
    their node in its custody) when the fault strikes."""
    before_s: float = 1.0
    """Load before the fault."""
    after_s: float = 3.0
    """Load after the fault strikes (its own duration included)."""
    inflight_s: float = 8.0
    """How long one request of the load is waited for (a ``send_to`` may rightly wait for a
    stalled Redis: 4.5 s here); one not answered by then has an unknown outcome."""
    connect_batch: int = 100


class Load:
    """The steady traffic of a scenario, all through node ``base`` (B, which every scenario
    keeps alive). Each round's requests run as tasks of their own, so a request stalled by the
    fault never holds back the rounds after it; every outcome is recorded."""

    def __init__(self, base: str, watches: list[Watch], scale: Scale, topics: list[str]) -> None:
        self.base = base
        self.watches = watches
        self.scale = scale
        self.topics = topics

        def http(connections: int) -> httpx.AsyncClient:
            # a request unanswered after inflight_s is given up by httpx itself (which closes
            # its connection), never cancelled from outside: its outcome is then unknown
            return httpx.AsyncClient(
                timeout=httpx.Timeout(scale.inflight_s, connect=5.0, pool=scale.inflight_s),
                limits=httpx.Limits(max_connections=connections),
                headers={"Authorization": f"Bearer {TOKEN}"},
            )

        self.http = http(64)
        # sends have their own connections: one that hangs (a reply lost between the nodes)
        # must not hold back the rounds' publishes and enqueues
        self.sends_http = http(2048)
        self.published: dict[str, dict[int, str]] = {t: {} for t in topics}
        self.sends: dict[int, tuple[int, str, str]] = {}  # n: (watch index, sid, outcome)
        self.burst: set[int] = set()  # the n of burst sends (burst scenario)
        self.enqueued: dict[int, str] = {}
        self._next_p = 0
        self._next_n = 0
        self._next_id = 0
        self._turn = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._runner = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop the rounds and wait for the requests in flight: each ends by itself within
        ``scale.inflight_s`` (its timeout; the outcome of one that times out is unknown)."""
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2 * self.scale.inflight_s + 10)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await self.http.aclose()
        await self.sends_http.aclose()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        rounds = 0
        while True:
            rounds += 1
            self.round()
            # scheduled, not slept: a slow round does not slow the rate down
            await asyncio.sleep(max(0.0, start + rounds * self.scale.tick - loop.time()))

    def round(self) -> None:
        for t in self.topics:
            self._spawn(self.publish(t, self._next_p))
        self._next_p += 1
        pairs: list[tuple[int, str, int]] = []
        for _ in range(min(self.scale.sends_per_tick, len(self.watches))):
            w = self.watches[self._turn % len(self.watches)]
            self._turn += 1
            pairs.append((w.index, w.client.session_id or "", self._next_n))
            self._next_n += 1
        self._spawn(self.send(pairs))
        ids = list(range(self._next_id, self._next_id + self.scale.items_per_tick))
        self._next_id += len(ids)
        if ids:
            self._spawn(self.enqueue(ids))

    async def publish(self, topic: str, p: int) -> None:
        body = [{"topic": topic, "data": {"p": p}}]
        try:
            r = await self.http.post(self.base + "/rubris/api/publish", json=body)
        except httpx.HTTPError:
            self.published[topic][p] = "unknown"  # sent, answer lost: may have been accepted
            return
        self.published[topic][p] = "accepted" if r.status_code == 200 else "refused"

    async def send(self, pairs: list[tuple[int, str, int]], burst: bool = False) -> None:
        body = {"sends": [[sid, n] for _, sid, n in pairs]}
        for index, sid, n in pairs:  # until answered
            self.sends[n] = (index, sid, UNANSWERED)
            if burst:
                self.burst.add(n)
        try:
            r = await self.sends_http.post(self.base + "/fault/send", json=body)
            outcomes = orjson.loads(r.content) if r.status_code == 200 else None
            failed = f"HTTP {r.status_code}"
        except httpx.TimeoutException:
            outcomes, failed = None, UNANSWERED
        except httpx.HTTPError as exc:
            outcomes, failed = None, type(exc).__name__
        for i, (index, sid, n) in enumerate(pairs):
            self.sends[n] = (index, sid, failed if outcomes is None else str(outcomes[i]))

    async def send_burst(self) -> None:
        """One ``send_to`` to every client's session, all at once, from node B."""
        pairs = [(w.index, w.client.session_id or "", self._next_n + w.index) for w in self.watches]
        self._next_n += len(self.watches)
        await self.send(pairs, burst=True)

    async def enqueue(self, ids: list[int]) -> None:
        body = [{"topic": QUEUE, "data": {"id": i}, "id": f"item-{i}"} for i in ids]
        try:
            r = await self.http.post(self.base + "/rubris/api/enqueue", json=body)
            outcome = "accepted" if r.status_code == 200 else "refused"
        except httpx.HTTPError:
            outcome = "unknown"
        for i in ids:
            self.enqueued[i] = outcome

    async def publish_end(self, deadline_s: float = 10.0) -> bool:
        """The end marker on every ring, retried until accepted (bounded)."""
        deadline = time.monotonic() + deadline_s
        for t in self.topics:
            while True:
                await self.publish(t, END)
                if self.published[t].get(END) == "accepted":
                    break
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.2)
        return True


# ---------------------------------------------------------------------------- the count


@dataclass
class Tally:
    """What one scenario counted. Losses are ``silent_ring_loss``, ``ring_unnumbered``,
    ``private_lost``, ``queue_lost``, ``queue_left``; duplicates ``ring_doubled``,
    ``private_doubled``, ``queue_doubled``; lies ``false_refusals`` (refused yet delivered)
    and ``queue_unmarked`` (delivered again without a higher ``attempt``)."""

    name: str
    clients: int = 0
    seconds: float = 0.0
    ring_expected: int = 0
    ring_received: int = 0
    ring_gapped: int = 0
    silent_ring_loss: int = 0
    ring_doubled: int = 0
    ring_restarted: int = 0
    clients_with_silent_loss: int = 0
    publishes_accepted: int = 0
    publishes_refused: int = 0
    publishes_unknown: int = 0
    ring_unnumbered: int = 0
    private_sent: int = 0
    private_ok: int = 0
    private_refused: int = 0
    private_unknown: int = 0
    private_unanswered: int = 0
    """Sends not answered within ``inflight_s`` (counted in unknown too)."""
    private_lost: int = 0
    private_doubled: int = 0
    private_gone_with_node: int = 0
    false_refusals: int = 0
    unknown_delivered: int = 0
    refusals: dict[str, int] = field(default_factory=dict)
    burst_sends: int = 0
    burst_failed: int = 0
    queue_accepted: int = 0
    queue_refused: int = 0
    queue_unknown: int = 0
    queue_lost: int = 0
    queue_doubled: int = 0
    queue_redelivered: int = 0
    queue_unmarked: int = 0
    queue_left: int = 0
    reconnected: int = 0
    resumed: int = 0
    resumes_expected: int = 0
    new_sessions: int = 0
    reconnect_s: float = 0.0
    node_log_lines: int = 0
    frozen: int = 0
    """Nodes that answered no request for ``FROZEN_S`` at some point (``Probe``)."""
    unanswered_s: float = 0.0
    """The longest any node went without answering a probe."""
    outbox_peak: int = 0
    """The most publishes node B's outbox held at once (``BrokerStats.pending_peak``)."""
    outbox_over_limit: int = 0
    """1 when that passed the outbox's bound (``outbox_messages``)."""
    flood_accepted: int = 0
    """Messages of the publish flood the API answered 200 for (``flood``)."""
    flood_unnumbered: int = 0
    """Of those, never numbered by Redis (lost)."""
    own_refused: int = 0
    """The application's own publishes refused during the flood (its share of the outbox)."""
    publishing_back: bool = True
    """Node B accepted the end marker within 10 s of the load's end (the fault is over by
    then: refusing publishes still is a refusal with no cause)."""
    ring_settled: bool = True
    """Every client reached every ring's end marker (received it or a GAP past it) within the
    settling bound; False: the ring counts are taken at the bound, and what was still on its
    way counts as lost."""
    ring_settle_s: float = 0.0
    """Seconds from the end marker's acceptance until every client had reached it."""
    ring_rate: float = 0.0
    """Ring messages per second the clients received while settling (with sessions relayed
    through Redis, the relay's throughput: one frame in flight per session, one ring message
    per frame and topic)."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds each phase of the scenario took (setup, load, settle, ...)."""
    notes: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """Every broken promise, one line each (empty when the scenario kept them all)."""
        out = []
        for name in (
            "silent_ring_loss",
            "ring_doubled",
            "ring_unnumbered",
            "private_lost",
            "private_doubled",
            "false_refusals",
            "queue_lost",
            "queue_unmarked",
            "queue_left",
            "burst_failed",
            "frozen",
            "outbox_over_limit",
            "flood_unnumbered",
            "own_refused",
        ):
            value = getattr(self, name)
            if value:
                out.append(f"{name}={value}")
        if not self.publishing_back:
            out.append("publishes still refused 10 s after the fault")
        if not self.ring_settled:
            out.append(f"rings not settled after {self.ring_settle_s:.0f} s")
        if self.resumed != self.resumes_expected:
            out.append(f"resumed={self.resumed}/{self.resumes_expected}")
        return out


def count(
    name: str,
    watches: list[Watch],
    load: Load,
    heads: dict[str, int],
    dead_nodes: set[str],
    redis_left: int,
    replaced: set[str] | None = None,
) -> Tally:
    """Count every promise over what the clients received and what the load was told."""
    t = Tally(name, clients=len(watches))
    for w in watches:
        lost_here = 0
        for topic, head in heads.items():
            seqs = w.seqs[topic]
            got = set(seqs)
            t.ring_doubled += len(seqs) - len(got)
            gapped: set[int] = set()
            for start, n in w.gaps[topic]:
                gapped.update(range(start, start + n))
            want = set(range(1, head + 1))
            t.ring_expected += head
            t.ring_received += len(got & want)
            t.ring_gapped += len((gapped - got) & want)
            lost_here += len(want - got - gapped)
            if len(w.epochs[topic]) > 1:
                t.ring_restarted += 1
        t.silent_ring_loss += lost_here
        t.clients_with_silent_loss += lost_here > 0
    for topic, outcomes in load.published.items():
        seen: set[int] = set()
        for w in watches:
            seen |= w.payloads[topic]
        for p, outcome in outcomes.items():
            if outcome == "accepted":
                t.publishes_accepted += 1
                t.ring_unnumbered += p not in seen
            elif outcome == "refused":
                t.publishes_refused += 1
            else:
                t.publishes_unknown += 1
    by_index = {w.index: w for w in watches}
    refusals: collections.Counter[str] = collections.Counter()
    for n, (index, sid, outcome) in load.sends.items():
        t.private_sent += 1
        got = by_index[index].private[n]
        if outcome == "ok":
            t.private_ok += 1
            if got == 0:
                # a session whose node was killed takes its unacknowledged messages with it, as
                # documented, when its client was given a new session (resumed=0: told); one
                # that resumed after all must have them
                if sid.split("~")[0] in dead_nodes and (replaced is None or sid in replaced):
                    t.private_gone_with_node += 1
                else:
                    t.private_lost += 1
        elif outcome in REFUSED:
            t.private_refused += 1
            refusals[outcome] += 1
            t.false_refusals += got > 0
        else:
            t.private_unknown += 1
            t.private_unanswered += outcome == UNANSWERED
            refusals[outcome] += 1
            t.unknown_delivered += got > 0
        t.private_doubled += max(0, got - 1)
        if n in load.burst:
            t.burst_sends += 1
            t.burst_failed += outcome != "ok"
    t.refusals = dict(refusals)
    deliveries: dict[int, list[int]] = collections.defaultdict(list)
    for w in watches:
        for item, attempt in w.items:
            deliveries[item].append(attempt)
    for item, outcome in load.enqueued.items():
        if outcome == "accepted":
            t.queue_accepted += 1
            t.queue_lost += item not in deliveries
        elif outcome == "refused":
            t.queue_refused += 1
        else:
            t.queue_unknown += 1
    for attempts in deliveries.values():
        t.queue_doubled += len(attempts) - 1
        t.queue_redelivered += any(a > 1 for a in attempts)
        # every delivery of an item carries its own attempt number: one repeated is a second
        # delivery that did not say so (in any order: two clients' handlers may start them
        # out of order)
        t.queue_unmarked += len(attempts) - len(set(attempts))
    t.queue_left = redis_left
    return t


def redis_queue_left(r: redis_sync.Redis) -> int:
    """Items still waiting or in some node's custody in Redis (neither ACKed nor dead)."""
    # a list element is a run of items, a custody field a piece whose marks say which ended
    left = sum(len(list(records_of(run))) for run in r.lrange(f"{PREFIX}q:{QUEUE}", 0, -1))
    for key in r.scan_iter(match=f"{PREFIX}qh:{QUEUE}:*", count=1000):
        fields = r.hgetall(key)
        for name, value in fields.items():
            if not name.endswith(b"!"):
                marks = fields.get(name + b"!", b"")
                left += len(list(records_of(value))) - sum(bin(b).count("1") for b in marks[4:])
    return left


# ---------------------------------------------------------------------------- a scenario


@dataclass
class Cluster:
    """What a fault function may act on."""

    redis: FaultRedis
    nodes: list[Node]
    lb: Balancer
    load: Load
    watches: list[Watch]
    scale: Scale
    homes: dict[str, int] = field(default_factory=dict)
    """Node id (a session id's prefix) -> the index of the node it names."""
    relay: Balancer | None = None
    """The TCP relay between the nodes and Redis (``via_relay``), which ``hold()`` stalls."""
    flood: Flood | None = None
    """The publish flood and the application's own publishes (``flood``), when it ran."""


Fault = Callable[[Cluster], Awaitable[None]]


async def _until(
    cond: Callable[[], bool],
    timeout: float,
    idle: float | None = None,
    progress: Callable[[], int] | None = None,
) -> bool:
    """Wait until ``cond()`` (True), or ``timeout`` (False), or, given ``progress``, until it
    has not moved for ``idle`` seconds (False): what did not come by then is not coming."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = progress() if progress else 0
    moved = loop.time()
    while loop.time() < deadline:
        if cond():
            return True
        if progress is not None and idle is not None:
            now = progress()
            if now != last:
                last, moved = now, loop.time()
            elif loop.time() - moved > idle:
                return False
        await asyncio.sleep(0.05)
    return cond()


@contextlib.asynccontextmanager
async def cluster(scale: Scale, split: bool, via_relay: bool = False) -> AsyncIterator[Cluster]:
    """Redis, two nodes, the balancer, the clients (all on node A, or alternately on A and B
    with ``split``) and the load, not started; everything stopped on exit. ``via_relay``: the
    nodes reach Redis through a TCP relay (tests/lbkit.py's ``Balancer``) that can stall."""
    logdir = tempfile.mkdtemp(prefix="rubris-faults-")
    redis = FaultRedis()
    await asyncio.to_thread(redis.start)
    watches: list[Watch] = []
    load: Load | None = None
    nodes: list[Node] = []
    relay_cm = Balancer([redis.url]) if via_relay else contextlib.nullcontext()
    try:
        relay = await relay_cm.__aenter__()
        url = redis.url if relay is None else relay.base.replace("http:", "redis:") + "/0"
        nodes = [Node(url, logdir, "a"), Node(url, logdir, "b")]
        await asyncio.gather(*(n.start() for n in nodes))
        # split: the balancer alternates the nodes connection by connection (the scenarios
        # that split their clients never drop connections, so reconnections do not matter)
        async with Balancer([n.base for n in nodes], rotate=split) as lb:
            topics = [f"ring.f{i}" for i in range(scale.topics)]
            url = lb.base + "/rubris"
            for lo in range(0, scale.clients, scale.connect_batch):
                hi = min(scale.clients, lo + scale.connect_batch)
                watches.extend(
                    await asyncio.gather(
                        *(
                            open_watch(i, url, topics, i % 2 == 0, scale.work_s)
                            for i in range(lo, hi)
                        )
                    )
                )
            homes: dict[str, int] = {}
            pids = {n.proc.pid: i for i, n in enumerate(nodes) if n.proc is not None}
            for w in watches[: min(len(watches), 8)]:
                pid = await w.client.call("pid", None, timeout=10)
                homes[w.first_sid.split("~")[0]] = pids[pid]
            load = Load(nodes[1].base, watches, scale, topics)
            yield Cluster(redis, nodes, lb, load, watches, scale, homes, relay)
    except BaseException as exc:
        for n in nodes:  # what the nodes said is what explains a scenario that broke
            exc.add_note(f"node {n.base} log tail:\n{n.log()}")
        raise
    finally:
        if load is not None:
            await load.close()
        await asyncio.gather(*(w.client.close() for w in watches), return_exceptions=True)
        await asyncio.gather(*(n.stop() for n in nodes), return_exceptions=True)
        await relay_cm.__aexit__(None, None, None)
        await asyncio.to_thread(redis.stop)
        if os.environ.get("RUBRIS_FAULT_DEBUG"):
            print(f"debug: node logs kept in {logdir}", file=sys.stderr)
        else:
            for n in nodes:
                with contextlib.suppress(OSError):
                    os.remove(n.logfile)
            with contextlib.suppress(OSError):
                os.rmdir(logdir)


async def run(
    name: str,
    fault: Fault,
    scale: Scale,
    *,
    split: bool = False,
    reconnects: bool = True,
    via_relay: bool = False,
    burst: bool = False,
) -> Tally:
    """One scenario: load, the fault, more load, then settle and count. ``reconnects``: the
    fault drops the clients' connections (each must come back, and resume unless its node
    died); ``via_relay``: the nodes reach Redis through a relay the fault may stall;
    ``burst``: after the load, one ``send_to`` to every client at once."""
    began = time.monotonic()
    phases: dict[str, float] = {}

    def mark(phase: str) -> None:
        phases[phase] = round(max(0.0, time.monotonic() - began - sum(phases.values())), 2)

    async with cluster(scale, split, via_relay) as c:
        mark("setup")
        load = c.load
        probe = Probe(c.nodes)
        probe.start()
        load.start()
        await asyncio.sleep(scale.before_s)
        struck = time.monotonic()
        await fault(c)
        reconnect_s = 0.0
        if reconnects:
            ok = await _until(
                lambda: all(
                    w.client.stats.reconnects >= 1 and w.client.state == "open" for w in c.watches
                ),
                15.0,
            )
            reconnect_s = time.monotonic() - struck if ok else -1.0
        # the load goes on a while after the clients are back too
        await asyncio.sleep(max(1.0, scale.after_s - (time.monotonic() - struck)))
        await load.stop()
        mark("load")
        if burst:
            await load.send_burst()
        ended = await load.publish_end()
        mark("end")
        heads: dict[str, int] = {}
        notes: list[str] = []
        if not ended:
            notes.append("the end marker was never accepted: node B still refused publishes")

        def ring_progress() -> int:
            n = 0
            for w in c.watches:
                n += sum(map(len, w.seqs.values())) + sum(map(len, w.gaps.values()))
            return n

        def settled() -> bool:
            # a client that received the marker (or a GAP past it) has all it will ever get
            # below it; the marker's seq is known once any client has it
            for t in load.topics:
                head = next((w.end_seq[t] for w in c.watches if t in w.end_seq), 0)
                if not head or any(w.last(t) < head for w in c.watches):
                    return False
            return True

        settle_began, delivered = time.monotonic(), ring_progress()
        if ended:
            # delivery may lag far behind the publishes (a relayed session takes one frame
            # at a time through Redis): wait for every client to reach the marker, as long as
            # they progress, within a bound that grows with the number of clients
            ok = await _until(
                settled,
                SETTLE_BASE_S + SETTLE_PER_CLIENT_S * len(c.watches),
                idle=SETTLE_IDLE_S,
                progress=ring_progress,
            )
        else:
            ok = False
        settle_s = time.monotonic() - settle_began
        for topic in load.topics:
            # the head is the marker's seq (without a marker, or if it never came, the highest
            # seq any client has: the count is then only as good as that)
            heads[topic] = max((max(w.seqs[topic], default=0) for w in c.watches), default=0)
            if ended and any(topic in w.end_seq for w in c.watches):
                heads[topic] = next(w.end_seq[topic] for w in c.watches if topic in w.end_seq)
        if ended and not ok:
            behind = sum(any(w.last(t) < h for t, h in heads.items()) for w in c.watches)
            notes.append(
                f"rings not settled after {settle_s:.1f} s: {behind} clients short of the end "
                f"marker; the ring counts are taken now"
            )
        ring_rate = (ring_progress() - delivered) / max(settle_s, 1e-3)
        mark("rings")
        ok_sends = [(n, i) for n, (i, _sid, o) in load.sends.items() if o == "ok"]
        by_index = {w.index: w for w in c.watches}
        await _until(
            lambda: all(by_index[i].private[n] for n, i in ok_sends),
            20.0 + 0.02 * len(c.watches),
            idle=SETTLE_IDLE_S,
            progress=lambda: sum(sum(w.private.values()) for w in c.watches),
        )
        mark("private")
        wanted = {i for i, o in load.enqueued.items() if o == "accepted"}
        await _until(
            lambda: wanted <= {i for w in c.watches for i, _ in w.items},
            NODE_TIMEOUT + 25.0,
            idle=NODE_TIMEOUT + 5.0,
            progress=lambda: sum(len(w.items) for w in c.watches),
        )
        mark("queue")
        r = c.redis.sync()
        try:
            # the last ACKs reach Redis within a moment; what stays there was never ACKed
            left = -1
            for _ in range(30):
                left = await asyncio.to_thread(redis_queue_left, r)
                if left == 0:
                    break
                await asyncio.sleep(0.1)
        finally:
            r.close()
        mark("redis")
        await probe.stop()
        dead = {nid for nid, i in c.homes.items() if c.nodes[i].killed}
        replaced = {w.first_sid for w in c.watches if w.client.session_id != w.first_sid}
        tally = count(name, c.watches, load, heads, dead, left, replaced)
        tally.frozen = probe.frozen
        tally.unanswered_s = max(probe.longest)
        await outbox_count(c, tally)
        tally.notes.extend(notes)
        tally.publishing_back = ended
        tally.ring_settled = ok or not ended  # no marker: already said by publishing_back
        tally.ring_settle_s = settle_s
        tally.ring_rate = ring_rate
        tally.reconnect_s = reconnect_s
        for w in c.watches:
            cl = w.client
            if cl.stats.reconnects:
                tally.reconnected += 1
                if cl.resumed and cl.session_id == w.first_sid:
                    tally.resumed += 1
                else:
                    tally.new_sessions += 1
        # where the sessions' node lives on, every dropped connection must resume: all of
        # them when the fault drops them, and any other that reconnected for its own reasons
        if not dead:
            tally.resumes_expected = len(c.watches) if reconnects else tally.reconnected

        if os.environ.get("RUBRIS_FAULT_DEBUG"):
            tally.notes.extend(await postmortem(c, heads))
            heads2 = {
                t: max((max(w.seqs[t], default=0) for w in c.watches), default=0)
                for t in load.topics
            }
            again = count(name, c.watches, load, heads2, dead, left)
            tally.notes.append(
                f"debug: recount at heads {heads2}: silent_ring_loss={again.silent_ring_loss} "
                f"ring_unnumbered={again.ring_unnumbered} ring_gapped={again.ring_gapped} "
                f"private_lost={again.private_lost} problems={again.problems()}"
            )
        tally.node_log_lines = sum(n.log_lines() for n in c.nodes)
        for n in c.nodes:
            tail = n.log(8)
            if tail.strip():
                tally.notes.append(f"node {n.base} log tail:\n{tail}")
    mark("teardown")
    tally.phases = phases
    tally.seconds = time.monotonic() - began
    return tally


async def _debug_state(c: Cluster) -> dict[str, Any]:
    """Redis's head seq of every ring topic, each node's /fault/debug, the clients' view."""
    r = c.redis.sync()
    try:
        redis_heads = {
            t: int(await asyncio.to_thread(r.hget, f"{PREFIX}t:{t}", "s") or 0)
            for t in c.load.topics
        }
    finally:
        r.close()
    nodes = []
    async with httpx.AsyncClient(timeout=20) as http:
        for n in c.nodes:
            if n.killed:
                continue
            try:
                d = (await http.get(n.base + "/fault/debug")).json()
            except httpx.HTTPError as exc:
                nodes.append({"node": n.base, "error": repr(exc)})
            else:
                st = d["stats"]
                nodes.append(
                    {
                        "node": n.base,
                        "topics": d["topics"],
                        "relay_homes": d["relay_homes"],
                        "relay_entries": d["relay_entries"],
                        "telemetry": d["telemetry"],
                        "broker": {
                            k: st["broker"][k]
                            for k in ("relayed", "numbered", "refused", "pending", "received")
                        },
                        "intake": st["intake"],
                    }
                )
    clients = {}
    for t in c.load.topics:
        lasts = sorted(max(w.seqs[t], default=0) for w in c.watches)
        clients[t] = {
            "min": lasts[0],
            "median": lasts[len(lasts) // 2],
            "max": lasts[-1],
            "with_end": sum(END in w.payloads[t] for w in c.watches),
            "accepted": sum(o == "accepted" for o in c.load.published[t].values()),
        }
    return {"redis_heads": redis_heads, "clients": clients, "nodes": nodes}


async def postmortem(c: Cluster, heads: dict[str, int]) -> list[str]:
    """RUBRIS_FAULT_DEBUG: after the count, the state of Redis, the nodes and the clients;
    then wait (up to 300 s) until every client has every ring's end marker, sampling how many
    ring frames per second the clients receive meanwhile; then the state again."""
    out = [
        f"debug: heads counted {heads}",
        "debug: at count " + orjson.dumps(await _debug_state(c)).decode(),
    ]
    began = time.monotonic()

    def frames() -> int:
        return sum(len(s) for w in c.watches for s in w.seqs.values())

    samples = []
    last, t0 = frames(), began
    wait = float(os.environ.get("RUBRIS_FAULT_DEBUG_WAIT", "60"))
    while time.monotonic() - began < wait:
        if all(END in w.payloads[t] for w in c.watches for t in c.load.topics):
            break
        await asyncio.sleep(2.0)
        now, t1 = frames(), time.monotonic()
        samples.append(round((now - last) / (t1 - t0)))
        last, t0 = now, t1
    took = time.monotonic() - began
    out.append(
        f"debug: all clients had the end marker after {took:.1f} s more; "
        f"ring messages/s every 2 s: {samples}"
    )
    out.append("debug: after " + orjson.dumps(await _debug_state(c)).decode())
    short = []
    for w in c.watches:
        for t, h in heads.items():
            if w.last(t) < h:
                cl = w.client
                seqs = sorted(set(w.seqs[t]))
                short.append(
                    {
                        "i": w.index,
                        "topic": t,
                        "first_sid": w.first_sid[:16],
                        "sid": (cl.session_id or "")[:16],
                        "resumed": cl.resumed,
                        "reconnects": cl.stats.reconnects,
                        "state": cl.state,
                        "last": w.last(t),
                        "got": len(seqs),
                        "holes": [x for x in range(1, w.last(t)) if x not in set(seqs)][:10],
                        "gaps": w.gaps[t][:5],
                        "epochs": len(w.epochs[t]),
                    }
                )
    out.append(f"debug: {len(short)} clients short of the head:")
    out.extend("debug:   " + orjson.dumps(x).decode() for x in short[:15])
    print("\n".join(out), file=sys.stderr, flush=True)  # before the (slow) teardown
    return out


# ---------------------------------------------------------------------------- the flood

OUTBOX_MESSAGES = 10_000
"""``RedisBroker``'s default ``outbox_messages``, which tests/fault_app.py keeps."""
FLOOD_TOPIC = "ring.flood"
"""The flood's topic: no client follows it (the intake hands it on at once, and the rings'
count is not the flood's)."""


class Flood:
    """The publish flood of issue 35: ``posters`` publishers each sending requests of
    ``size`` messages to node B's ``/api/publish`` as fast as they are answered, while the
    application's own publish (``/fault/own``) runs every 20 ms. Counts what the API accepted
    and what the application was refused."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.accepted = 0
        self.unknown = 0
        self.refused = 0
        self.own_ok = 0
        self.own_refused: list[str] = []
        """The application's publishes refused for the outbox's bound (its share taken)."""
        self.own_other: list[str] = []
        """Refused for another reason (Redis away: true, and not the share's failure)."""

    async def run(self, seconds: float, posters: int = 4, size: int = 500) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(timeout=10.0, headers=headers) as http:

            async def poster(k: int) -> None:
                n = 0
                while loop.time() < deadline:
                    body = [
                        {"topic": FLOOD_TOPIC, "data": {"k": k, "n": n + i}} for i in range(size)
                    ]
                    n += size
                    try:
                        r = await http.post(self.base + "/rubris/api/publish", json=body)
                    except httpx.HTTPError:
                        self.unknown += size
                        continue
                    if r.status_code == 200:
                        self.accepted += size
                    else:
                        self.refused += size
                        await asyncio.sleep(0.05)  # a flood ignores Retry-After, but never spins

            async def own() -> None:
                n = 0
                while loop.time() < deadline:
                    with contextlib.suppress(httpx.HTTPError):
                        r = await http.post(self.base + "/fault/own", json={"n": n})
                        outcome = str(orjson.loads(r.content))
                        if outcome == "ok":
                            self.own_ok += 1
                        elif "publishes wait" in outcome or "bytes of publishes" in outcome:
                            self.own_refused.append(outcome)
                        else:
                            self.own_other.append(outcome)
                    n += 1
                    await asyncio.sleep(0.02)

            await asyncio.gather(*(poster(k) for k in range(posters)), own())


async def outbox_count(c: Cluster, t: Tally) -> None:
    """Node B's outbox at its fullest, and what became of the flood (when it ran)."""
    async with httpx.AsyncClient(timeout=20) as http:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            d = (await http.get(c.nodes[1].base + "/fault/debug")).json()
            t.outbox_peak = int(d["stats"]["broker"]["pending_peak"])
    t.outbox_over_limit = int(t.outbox_peak > OUTBOX_MESSAGES)
    f = c.flood
    if f is None:
        return
    r = c.redis.sync()
    try:
        numbered = 0
        for _ in range(100):  # the intake may still hand the last of it on
            numbered = int(await asyncio.to_thread(r.hget, f"{PREFIX}t:{FLOOD_TOPIC}", "s") or 0)
            if numbered >= f.accepted:
                break
            await asyncio.sleep(0.1)
    finally:
        r.close()
    t.flood_accepted = f.accepted
    t.flood_unnumbered = max(0, f.accepted - numbered)
    t.own_refused = len(f.own_refused)
    t.notes.append(
        f"flood: {f.accepted} accepted, {f.refused} refused, {f.unknown} unknown, "
        f"{numbered} numbered; own publishes {f.own_ok} ok, {len(f.own_refused)} refused for "
        f"the outbox, {len(f.own_other)} otherwise {f.own_other[:2]}"
    )


# ---------------------------------------------------------------------------- the faults


async def reset_a(c: Cluster) -> None:
    """Every connection through the balancer (all to node A) reset by RST at once; the clients
    reconnect through the balancer, now routing to B, and resume their sessions on A."""
    c.lb.route(1)
    c.lb.reset()


async def blackhole_a(c: Cluster) -> None:
    """Every path to node A dead without a reset; new connections go to B."""
    c.lb.route(1)
    c.lb.blackhole()


async def kill_a(c: Cluster) -> None:
    """Node A killed with SIGKILL while its clients hold work items; they reconnect to B."""
    c.lb.route(1)
    c.nodes[0].kill()


async def restart_redis(c: Cluster) -> None:
    """Redis stopped (SIGTERM: it writes its append-only file) and started again on the same
    port 1 s later, the load going on all the while."""
    await asyncio.to_thread(c.redis.kill)
    await asyncio.sleep(1.0)
    await asyncio.to_thread(c.redis.restart)


async def stall_redis(c: Cluster) -> None:
    """Redis answers nobody for ``node_timeout`` + 1.5 s (``DEBUG SLEEP``): long enough that
    every node's heartbeat looks stale to the others when it wakes."""
    await c.redis.stall(NODE_TIMEOUT + 1.5)


def stall_redis_for(seconds: float) -> Fault:
    """Redis answers nobody for ``seconds`` (``DEBUG SLEEP``): past the nodes' 5 s socket
    timeout, every command in flight fails and every connection made meanwhile hangs."""

    async def stall(c: Cluster) -> None:
        await c.redis.stall(seconds)

    return stall


async def restart_redis_then_resume_all(c: Cluster) -> None:
    """Redis away for 3 s (stopped, started again), then at once every connection to node A
    reset: every client resumes through B at the same moment, while the nodes' pools are
    coming back from the outage."""
    await asyncio.to_thread(c.redis.kill)
    await asyncio.sleep(3.0)
    await asyncio.to_thread(c.redis.restart)
    c.lb.route(1)
    c.lb.reset()


async def kill_redis_clients(c: Cluster) -> None:
    """``CLIENT KILL TYPE normal`` and ``TYPE pubsub``: every connection of every node to
    Redis dropped by Redis itself, twice, 1 s apart."""
    r = c.redis.sync()
    try:
        for _ in range(2):
            for kind in ("normal", "pubsub"):
                await asyncio.to_thread(r.execute_command, "CLIENT", "KILL", "TYPE", kind)
            await asyncio.sleep(1.0)
    finally:
        r.close()


async def redis_out_of_memory(c: Cluster) -> None:
    """``maxmemory`` below what Redis uses, ``noeviction``: every write refused (OOM) for 4 s,
    reads and pub/sub still answered."""
    r = c.redis.sync()
    try:
        used = int((await asyncio.to_thread(r.info, "memory"))["used_memory"])
        await asyncio.to_thread(r.config_set, "maxmemory-policy", "noeviction")
        await asyncio.to_thread(r.config_set, "maxmemory", max(1, used // 2))
        await asyncio.sleep(4.0)
        await asyncio.to_thread(r.config_set, "maxmemory", 0)
    finally:
        r.close()


async def flood_with_slow_redis(c: Cluster) -> None:
    """The publish flood through node B's API for 8 s, Redis standing still for 3 s of it
    (``DEBUG SLEEP``, below the socket timeout: slow, not away), so the outbox fills."""
    c.flood = Flood(c.nodes[1].base)
    flood = asyncio.create_task(c.flood.run(8.0))
    await asyncio.sleep(2.0)
    await c.redis.stall(3.0)
    await flood


async def stall_the_path_to_redis(c: Cluster) -> None:
    """The TCP relay between the nodes and Redis forwards nothing for 15 s, closing nothing,
    then lets everything through (Redis unreachable without a close)."""
    assert c.relay is not None
    c.relay.hold()
    await asyncio.sleep(15.0)
    c.relay.release()


async def pause_a(c: Cluster) -> None:
    """Node A stopped (SIGSTOP) for 15 s, past ``node_timeout``, then continued: meanwhile
    its clients reconnect to B and B takes A for dead, giving back the work items A held."""
    c.lb.route(1)
    c.nodes[0].pause()
    await asyncio.sleep(15.0)
    c.nodes[0].resume()


@dataclass(frozen=True)
class Spec:
    """A scenario: its fault and how the cluster is laid out for it."""

    fault: Fault
    split: bool
    """Clients alternately on both nodes (the faults of Redis); else all on node A."""
    reconnects: bool
    """The fault drops the clients' connections (each must come back)."""
    description: str
    via_relay: bool = False
    burst: bool = False


SCENARIOS: dict[str, Spec] = {
    "reset": Spec(reset_a, False, True, "every session of node A reset (RST), resumed on B"),
    "blackhole": Spec(blackhole_a, False, True, "paths to node A dead without a reset"),
    "kill": Spec(kill_a, False, True, "node A killed (SIGKILL) with sessions and items"),
    "redis_restart": Spec(restart_redis, True, False, "Redis restarted (appendonly yes)"),
    "redis_stall": Spec(stall_redis, True, False, "Redis stalled past node_timeout"),
    "burst": Spec(reset_a, False, True, "concurrent resumes, then concurrent send_to", burst=True),
    "redis_stall_12": Spec(
        stall_redis_for(12.0), True, False, "Redis stalled 12 s (past the socket timeout)"
    ),
    "redis_stall_30": Spec(stall_redis_for(30.0), True, False, "Redis stalled 30 s"),
    "restart_burst": Spec(
        restart_redis_then_resume_all,
        False,
        True,
        "Redis restarted, then every session resumed at once and one send_to to each",
        burst=True,
    ),
    "relay_stall": Spec(
        stall_the_path_to_redis,
        True,
        False,
        "the path to Redis forwards nothing for 15 s, closing nothing",
        via_relay=True,
    ),
    "node_pause": Spec(pause_a, False, True, "node A paused (SIGSTOP) 15 s, then continued"),
    "redis_oom": Spec(redis_out_of_memory, True, False, "Redis out of memory (noeviction) 4 s"),
    "client_kill": Spec(
        kill_redis_clients, True, False, "Redis kills every node connection (CLIENT KILL)"
    ),
    "flood": Spec(
        flood_with_slow_redis, True, False, "publish flood through the API, Redis slow 3 s"
    ),
}


async def scenario(name: str, scale: Scale) -> Tally:
    spec = SCENARIOS[name]
    return await run(
        name,
        spec.fault,
        scale,
        split=spec.split,
        reconnects=spec.reconnects,
        via_relay=spec.via_relay,
        burst=spec.burst,
    )


def raise_nofile() -> None:
    """Clients and the balancer's two sockets per connection need more than 1,024 files."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 65536)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

"""``ShardedClient``: commands and scripts sent to the master that serves a partition, on a
capped pool per master, following the cluster's redirects.

A Redis Cluster answers a command sent to the wrong master with ``MOVED`` (the slot lives
elsewhere now), a command on a slot half moved with ``ASK`` (this one command goes to the
importing master, after ``ASKING``) or ``TRYAGAIN`` (its keys are split between the two), and
refuses every command with ``CLUSTERDOWN`` while it cannot serve the slot. ``call`` follows
the first three within bounds and raises the last as Redis refusing (``SlotsRefused``, one of
``nodes.REFUSING``), so the broker's ``Reach.until_answered`` pauses and retries as it does for
a standalone Redis that refuses writes. Every one of these errors means the command did not
run: what ``call`` sends again runs once.

Not redis-py's ``RedisCluster``: it retries a command on a lost connection by itself (a lost
connection must reach the caller, which knows whether the command is safe to repeat and what
it missed), it has no capped pool per node, and redis-py 5's asyncio cluster has no sharded
pub/sub for the subscriber beside it (pubsub.py).

Every connection speaks RESP2 (``protocol=2``): redis-py 5 defaults to it, redis-py 8 to
RESP3, and the replies (``CLUSTER SHARDS`` a flat list, not a map) and the subscriber's
messages (plain arrays, not push frames) are then the same under both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from ..nodes import DOWN
from ..pool import MAX_CONNECTIONS, POOL_TIMEOUT, Pool, check_pool
from .address import Address, cluster_url
from .answers import ASK, MOVED, NOSCRIPT, TRYAGAIN, SlotsRefused, kind_of, redirect, refusal
from .partitions import PARTITIONS, SLOTS, prefix, slot_of_partition
from .pipeline import PartitionPipeline
from .scripts import Command, Script
from .slotmap import SlotMap, from_shards, from_slots

log = logging.getLogger("rubris_asgi.broker")

REDIRECTS = 5
"""``MOVED`` and ``ASK`` one call follows at most before it refuses (``SlotsRefused``): a slot
moves once in a resharding, twice if it is moved back meanwhile; more is a map that does not
settle, which a pause and a retry of the caller's serve better than a loop here."""
TRY_AGAIN = 40
"""``TRYAGAIN`` answers one call waits out at most, ``TRY_AGAIN_PAUSE`` apart (2 s in all),
before it raises ``TryAgainError`` (Redis refusing): a command whose keys a migration holds
split waits for the slot's last keys to move, which ``redis-cli --cluster reshard`` does within
a second for a slot of rubris's keys."""
TRY_AGAIN_PAUSE = 0.05
REFRESH_TIMEOUT = 5.0
"""Seconds a read of the slot map takes at most, every node asked in turn included."""
REFRESH_EVERY = 0.2
"""Seconds between the end of a read of the slot map and the start of the next, at least:
while a master is away every call to it fails and asks for one, and a node that read the map
for each (twenty a second, seen) only adds load on the masters that still answer."""
SUSPECT = 10.0
"""Seconds a node that failed a connection is asked for the map after every other node."""
SOCKET_TIMEOUT = 5.0
"""Seconds a command waits for its reply, and a connection for its connect, by default."""


@dataclass
class ShardStats:
    """What a ``ShardedClient`` met, counted since it started (for the broker's figures)."""

    moved: int = 0
    """Commands answered ``MOVED`` (sent again to the slot's new master)."""
    asked: int = 0
    """Commands answered ``ASK`` (sent to the importing master after ``ASKING``)."""
    tried_again: int = 0
    """Commands answered ``TRYAGAIN`` (sent again after a pause)."""
    refused: int = 0
    """Commands left refused: ``CLUSTERDOWN``, or ``TRYAGAIN``/redirects past their bound."""
    noscript: int = 0
    """Scripts answered ``NOSCRIPT`` (sent again by their body)."""
    failures: int = 0
    """Connections to a node that failed (the command raised ``nodes.DOWN``)."""
    map_reads: int = 0
    """Reads of the slot map that succeeded."""


class ShardedClient:
    """A client of a Redis Cluster for rubris's partitions (partitions.py).

    Args:
        url: ``redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...][?OPTION=...]``
            (address.py); its options (``socket_timeout``, ``socket_connect_timeout``,
            ``max_connections``, ``pool_timeout``) win over the arguments below.
        partitions: how many partitions the key space is cut into (partitions.py).
        max_connections: connections this client opens to each master at most; a command
            waits for a free one up to ``pool_timeout``, then raises ``PoolBusy``.
        socket_timeout / connect_timeout: seconds a reply, and a connect, is waited for;
            past them the call raises ``TimeoutError``/``ConnectionError`` (``nodes.DOWN``).
        refresh_timeout: seconds a read of the slot map may take in all.
    """

    def __init__(
        self,
        url: str,
        *,
        partitions: int = PARTITIONS,
        max_connections: int = MAX_CONNECTIONS,
        pool_timeout: float = POOL_TIMEOUT,
        socket_timeout: float = SOCKET_TIMEOUT,
        connect_timeout: float = SOCKET_TIMEOUT,
        refresh_timeout: float = REFRESH_TIMEOUT,
    ) -> None:
        target = cluster_url(url)
        options = target.options
        self.max_connections = int(options.get("max_connections", max_connections))
        self.pool_timeout = float(options.get("pool_timeout", pool_timeout))
        check_pool(self.max_connections, self.pool_timeout)
        self.socket_timeout = float(options.get("socket_timeout", socket_timeout))
        self.connect_timeout = float(options.get("socket_connect_timeout", connect_timeout))
        self.refresh_timeout = refresh_timeout
        self.partitions = partitions
        slot_of_partition(0, partitions)  # checks the count before anything is opened
        self.seeds = target.seeds
        self._username = target.username
        self._password = target.password
        self._map = SlotMap()
        self._pools: dict[Address, Pool] = {}
        """One per node this client sent a command to: the masters, and a node an ``ASK`` or
        a ``MOVED`` named. Bounded by the cluster's nodes; closed with the client."""
        self._clients: dict[Address, aioredis.Redis] = {}
        self._scripts: dict[str, str] = {}
        """SHA1 -> body of every script run: a handful."""
        self._loaded: dict[Address, set[str]] = {}
        """The scripts each node has loaded, as far as this client knows: forgotten when a
        connection to it fails (it may come back restarted) or it answers ``NOSCRIPT``."""
        self._suspects: dict[Address, float] = {}
        self._refreshing: asyncio.Task[bool] | None = None
        self._read_at = -REFRESH_EVERY
        """When the last read of the map ended (monotonic seconds)."""
        self._why = "not read yet"
        self._closed = False
        self.stats = ShardStats()

    # life

    async def start(self) -> None:
        """Read the slot map from the first seed that answers. Raises ``ConnectionError``
        (``nodes.DOWN``) when none does within ``refresh_timeout``, saying why of each."""
        if not await self.refresh():
            raise RedisConnectionError(f"cannot read the cluster's slot map: {self._why}")

    async def close(self) -> None:
        """Stop the map's refresh and close every connection."""
        self._closed = True
        task, self._refreshing = self._refreshing, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        clients, self._clients = list(self._clients.values()), {}
        pools, self._pools = list(self._pools.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                await client.aclose()
        for pool in pools:
            with contextlib.suppress(Exception):
                await pool.disconnect()

    # where

    @property
    def slot_map(self) -> SlotMap:
        """The slot map as last read or corrected."""
        return self._map

    def slot(self, partition: int) -> int:
        """The slot of every key of ``partition``."""
        return slot_of_partition(partition, self.partitions)

    def prefix(self, base: str, partition: int) -> str:
        """``base{tag}:``, what every key and channel of ``partition`` starts with."""
        return prefix(base, partition, self.partitions)

    def owner(self, slot: int) -> Address:
        """The master of ``slot`` by the map. Raises ``SlotsRefused`` when the map read gave
        it none (the map is read again meanwhile)."""
        address = self._map.owner(slot)
        if address is None:
            self.refresh_soon()
            raise SlotsRefused(f"CLUSTERDOWN no master serves slot {slot} in the map read")
        return address

    def client_for(self, partition: int) -> aioredis.Redis:
        """A redis-py client of the master serving ``partition`` now, for commands that need
        redis-py's replies as it parses them. It follows no redirect: a command on it after
        the slot moved raises ``MOVED`` (``execute`` follows them; prefer it)."""
        return self.client_at(self.owner(self.slot(partition)))

    def client_at(self, address: Address) -> aioredis.Redis:
        """A redis-py client of the node at ``address``, on its capped pool."""
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = aioredis.Redis(connection_pool=self.pool(address))
        return client

    def pool(self, address: Address) -> Pool:
        """The capped pool of the node at ``address``. Its connections retry nothing inside
        redis-py (``Retry(NoBackoff(), 0)``): a lost connection reaches the caller."""
        pool = self._pools.get(address)
        if pool is None:
            if self._closed:
                raise RedisConnectionError("the sharded client is closed")
            pool = self._pools[address] = Pool(
                host=address[0],
                port=address[1],
                max_connections=self.max_connections,
                timeout=self.pool_timeout,
                **self.connection_options(self.socket_timeout),
            )
        return pool

    def connection_options(self, socket_timeout: float | None) -> dict[str, Any]:
        """What every connection of this client is made with (``socket_timeout`` None: a
        subscriber's, which waits for messages for ever and checks its master by PING)."""
        return {
            "username": self._username,
            "password": self._password,
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": self.connect_timeout,
            "retry": Retry(NoBackoff(), 0),
            "protocol": 2,
        }

    def connection(self, address: Address, socket_timeout: float | None) -> Connection:
        """A connection of its own to the node at ``address``, outside the pools (a map read,
        a subscriber); the caller disconnects it."""
        return Connection(
            host=address[0], port=address[1], **self.connection_options(socket_timeout)
        )

    # commands

    async def execute(self, partition: int, *command: Any) -> Any:
        """Run ``command`` on the master of ``partition`` and return its raw reply (bytes,
        ints, lists: no redis-py response callback), following ``MOVED``/``ASK``/``TRYAGAIN``
        (``call``). Raises the command's own error, ``TryAgainError``/``SlotsRefused``
        (``nodes.REFUSING``), ``nodes.DOWN`` (the master unreachable: whether the command ran
        is unknown), or ``PoolBusy``."""
        (reply,) = await self.call(self.slot(partition), [command])
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def run_script(
        self, partition: int, script: Script, keys: Sequence[Any], args: Sequence[Any]
    ) -> Any:
        """Run ``script`` on the master of ``partition`` (``EVALSHA``, its body on
        ``NOSCRIPT``), as ``execute``. ``keys`` must be keys of the partition (under its
        ``prefix``), at least one: the cluster routes and checks the script by them. While
        the partition's slot is being moved, Redis runs the script where its declared keys
        are, and answers ``TRYAGAIN`` while they are split: declare every key the script
        writes, or a key it touches undeclared may be missing on the master that runs it
        (the script then fails on it, or reads it as absent on the importing master)."""
        self._scripts[script.sha] = script.body
        return await self.execute(partition, *script.command(keys, args))

    def pipeline(self, partition: int) -> PartitionPipeline:
        """Commands of ``partition`` to send together (pipeline.py)."""
        return PartitionPipeline(self, partition)

    def remember(self, script: Script) -> None:
        """Know ``script``'s body by its SHA1, for ``NOSCRIPT``."""
        self._scripts[script.sha] = script.body

    async def call(self, slot: int, commands: Sequence[Command]) -> list[Any]:
        """Send ``commands`` (all on keys of ``slot``) in one pipeline to the slot's master;
        return each one's reply or error, in order (errors returned, not raised).

        A reply that says the command did not run is handled, and only those commands are
        sent again (in their order, after the others ran, so a pipeline's commands must not
        depend on their order across a redirect: put such into one script):

        - ``MOVED``: the map takes the slot's new master at once, a full read is started,
          and they go there;
        - ``ASK``: they go to the named master, each after ``ASKING`` on the same
          connection; the map stays (the slot is still the owner's);
        - ``TRYAGAIN``: they go to the owner again after ``TRY_AGAIN_PAUSE``, at most
          ``TRY_AGAIN`` times, then stand as ``TryAgainError``;
        - ``NOSCRIPT``: an ``EVALSHA`` of a known script goes again as ``EVAL`` (rare: a
          script is loaded on each node before its first use there, ``_send``);
        - ``CLUSTERDOWN``: stands, as ``SlotsRefused``.

        More than ``REDIRECTS`` redirects make the rest ``SlotsRefused``. A lost connection
        raises (``nodes.DOWN``) after a map read is started: the master may have failed over.
        Then it is unknown which commands ran; the caller sends again only what is safe to run
        twice (rubris's scripts answer a batch id they ran from their first run)."""
        todo = list(commands)
        replies: list[Any] = [None] * len(todo)
        pending = list(range(len(todo)))
        address, asking = self.owner(slot), False
        redirects = waits = 0
        while pending:
            answers = await self._send(address, [todo[j] for j in pending], asking)
            again: list[int] = []
            moved = ask = None
            wait = False
            for j, reply in zip(pending, answers, strict=True):
                kind = kind_of(reply)
                if kind is None:
                    replies[j] = reply
                elif kind == NOSCRIPT:
                    self.stats.noscript += 1
                    body = self._body(todo[j])
                    if body is None:
                        replies[j] = reply
                    else:
                        todo[j] = ("EVAL", body, *todo[j][2:])
                        again.append(j)
                elif kind in (MOVED, ASK):
                    where = redirect(reply, kind, address)
                    if where is None:
                        replies[j] = reply
                        continue
                    if kind == MOVED:
                        self.stats.moved += 1
                        moved = where
                    else:
                        self.stats.asked += 1
                        ask = where
                    replies[j] = SlotsRefused(f"CLUSTERDOWN slot {slot} redirected too often")
                    again.append(j)
                else:  # TRYAGAIN stays if the waits run out; CLUSTERDOWN stays
                    replies[j] = refusal(reply, kind)
                    if kind == TRYAGAIN:
                        self.stats.tried_again += 1
                        wait = True
                        again.append(j)
                    else:
                        self.stats.refused += 1
            pending = again
            if not pending:
                break
            if moved is not None or ask is not None:
                redirects += 1
                if redirects > REDIRECTS:
                    self.stats.refused += len(pending)
                    break
                if moved is not None:
                    if self._map.moved(moved.slot, moved.address):
                        log.info("slot %d moved to %s:%d", moved.slot, *moved.address)
                    self.refresh_soon()
                    address, asking = moved.address, False
                else:
                    assert ask is not None
                    address, asking = ask.address, True
            elif wait:
                waits += 1
                if waits > TRY_AGAIN:
                    self.stats.refused += len(pending)
                    break
                await asyncio.sleep(TRY_AGAIN_PAUSE)
                address, asking = self.owner(slot), False
            # else NOSCRIPT alone: the same node again, as EVAL
        return replies

    def _body(self, command: Command) -> str | None:
        sha = self._sha(command)
        return None if sha is None else self._scripts[sha]

    async def _send(self, address: Address, commands: list[Command], asking: bool) -> list[Any]:
        """One round trip: ``commands`` written at once on one connection of ``address``'s
        pool (each after ``ASKING`` when ``asking``), their replies read in order. A script
        this node may not know yet goes first as ``SCRIPT LOAD``, in the same round trip:
        then no ``NOSCRIPT`` comes (whose command alone would be sent again, after the
        others), but where its cache was emptied while every connection lived (``SCRIPT
        FLUSH``)."""
        loaded = self._loaded.setdefault(address, set())
        loads = [
            sha for sha in dict.fromkeys(map(self._sha, commands)) if sha and sha not in loaded
        ]
        pool = self.pool(address)
        try:
            conn = await pool.get_connection()
        except DOWN:
            await self._failed(address)
            raise
        try:
            sent: list[Command] = [("SCRIPT", "LOAD", self._scripts[sha]) for sha in loads]
            for command in commands:
                if asking:
                    sent.append(("ASKING",))
                sent.append(command)
            await conn.send_packed_command(conn.pack_commands(sent), check_health=False)
            replies: list[Any] = []
            for _ in sent:
                try:
                    replies.append(await conn.read_response())
                except ResponseError as exc:  # an error reply: the connection stays good
                    replies.append(exc)
        except DOWN:
            # redis-py disconnected this connection already; the idle ones went with it
            # (a master restarted closed them all) and go now, so the next call connects
            await pool.release(conn)
            await self._failed(address)
            raise
        except BaseException:
            await pool.release(conn)
            raise
        await pool.release(conn)
        for sha, reply in zip(loads, replies, strict=False):
            if not isinstance(reply, ResponseError):
                loaded.add(sha)
        replies = replies[len(loads) :]
        for command, reply in zip(commands, replies[1::2] if asking else replies, strict=True):
            if kind_of(reply) == NOSCRIPT:
                loaded.discard(self._sha(command) or "")
        return replies[1::2] if asking else replies

    def _sha(self, command: Command) -> str | None:
        """The SHA1 of the known script an ``EVALSHA`` runs; None for any other command."""
        if len(command) < 2 or str(command[0]).upper() != "EVALSHA":
            return None
        sha = command[1].decode() if isinstance(command[1], bytes) else str(command[1])
        return sha if sha in self._scripts else None

    def suspect(self, address: Address) -> None:
        """A connection to ``address`` failed: it is asked for the map after every other node
        for a while (``SUSPECT``), and its scripts are loaded again before their next use
        (it may come back restarted, its script cache empty)."""
        self._suspects[address] = time.monotonic()
        self._loaded.pop(address, None)

    async def _failed(self, address: Address) -> None:
        self.stats.failures += 1
        self.suspect(address)
        with contextlib.suppress(Exception):
            await self.pool(address).disconnect(inuse_connections=False)
        self.refresh_soon()

    # the map

    def refresh_soon(self) -> asyncio.Task[bool] | None:
        """Start a read of the slot map unless one is under way (single-flight); the task."""
        if self._closed:
            return None
        task = self._refreshing
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(
                self._refresh(), name="rubris-shards-refresh"
            )
            self._refreshing = task
        return task

    async def refresh(self) -> bool:
        """Read the slot map now, or wait for the read under way; whether it was read (else
        the map stays as it was). Takes at most ``refresh_timeout``."""
        task = self.refresh_soon()
        if task is None:
            return False
        return await asyncio.shield(task)

    async def _refresh(self) -> bool:
        wait = self._read_at + REFRESH_EVERY - time.monotonic()
        if wait > 0:  # every call failing while a master is away asks for a read
            await asyncio.sleep(wait)
        try:
            return await asyncio.wait_for(self._read_map(), self.refresh_timeout)
        except asyncio.TimeoutError:
            self._why = f"no node gave the map within {self.refresh_timeout:g} s"
            log.warning("cannot read the cluster's slot map: %s", self._why)
            return False
        finally:
            self._read_at = time.monotonic()

    async def _read_map(self) -> bool:
        """Ask the nodes in turn (``_ask_order``); take the first map that covers every slot,
        else the one that covers most."""
        best: SlotMap | None = None
        failures = []
        for address in self._ask_order():
            try:
                found = await self._ask(address)
            except (*DOWN, ResponseError) as exc:
                failures.append(f"{address[0]}:{address[1]}: {exc}")
                continue
            if best is None or found.covered > best.covered:
                best = found
            if found.covered == SLOTS:
                break
        if best is None or not best.covered:
            self._why = "; ".join(failures) or "no node serves a slot"
            return False
        before = self._map.masters
        self._map = best
        self.stats.map_reads += 1
        if best.masters != before and before:
            log.info("cluster masters now %s", sorted(best.masters))
        return True

    def _ask_order(self) -> list[Address]:
        """The masters, then the other nodes known (replicas), then the seeds; those that
        failed a connection lately last (a failed master's replica knows of the failover)."""
        now = time.monotonic()
        seen: dict[Address, None] = {}
        for address in (*sorted(self._map.masters), *sorted(self._map.nodes), *self.seeds):
            seen.setdefault(address, None)
        order = list(seen)
        return sorted(order, key=lambda a: now - self._suspects.get(a, -SUSPECT) < SUSPECT)

    async def _ask(self, address: Address) -> SlotMap:
        """The map as the node at ``address`` sees it: ``CLUSTER SHARDS`` (Redis 7), else
        ``CLUSTER SLOTS``; on a connection of its own, closed after."""
        conn = self.connection(address, self.connect_timeout)
        try:
            await conn.connect()  # type: ignore[no-untyped-call]  # untyped in redis-py
            await conn.send_command("CLUSTER", "SHARDS", check_health=False)
            try:
                return from_shards(await conn.read_response(), address)
            except ResponseError as exc:
                if "unknown" not in str(exc).lower():  # cluster support disabled, an ACL...
                    raise
            await conn.send_command("CLUSTER", "SLOTS", check_health=False)
            return from_slots(await conn.read_response(), address)
        finally:
            await conn.disconnect()

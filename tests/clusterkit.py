"""A real Redis Cluster for tests: several ``redis-server --cluster-enabled yes`` on 127.0.0.1.

``RedisCluster`` starts ``masters`` masters (and ``replicas`` replicas of each), each a
:class:`~tests.rediskit.RedisServer` of its own (free port, temporary directory, append-only
file unless ``appendonly=False``), joins them with ``redis-cli --cluster create`` (which wants
3 masters at least: 1 or 2 without replicas get their slots from the kit itself) and waits
until every node says ``cluster_state:ok`` and all agree on the slot map. A context manager
(``with``, or ``async with`` from an async test: starting and stopping then run in a thread,
off the event loop); everything is stopped and removed on exit, also when starting fails.

What a test does to it (blocking calls: from an async test, ``await asyncio.to_thread(...)``):

- ``url``, ``urls``, ``startup_nodes``, ``ports``; ``client()``: a sync
  ``redis.cluster.RedisCluster`` on it;
- ``masters()``, ``node_for_slot(slot)``: who serves what now, from ``CLUSTER NODES``;
  ``cluster_info(port)``, ``cluster_nodes(port)``: one node's view;
- ``kill(port)`` / ``start(port)`` / ``restart(port)``: a node's process stopped (SIGTERM, or
  SIGKILL with ``hard=True``) and started again on the same port and ``nodes.conf``;
- ``migrate_slots(slots, to_port)``, ``migrate_half(from_port, to_port)``: a resharding done the
  way ``redis-cli --cluster reshard`` does it, key by key, usable while clients write (they
  follow ``ASK`` and ``MOVED``); ``open_migration`` / ``move_keys`` / ``close_migration`` are its
  steps, to hold a slot half moved;
- ``flush()``: every master emptied; ``wait_ok()``: until the cluster is whole again.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import redis as redis_sync
import redis.cluster

from .rediskit import RedisServer, _free_port

SLOTS = 16384
HOST = "127.0.0.1"
NODE_TIMEOUT_MS = 2000
"""``cluster-node-timeout``: small, so a dead node is noticed (and a failover happens) within
seconds; large enough that a busy test machine does not flag a live node as failing."""
CREATE_TIMEOUT = 60.0
OK_TIMEOUT = 30.0
"""The bound on every wait for ``cluster_state:ok``: a restarted master waits 2 s before it
serves (``CLUSTER_WRITABLE_DELAY``), a master flagged FAIL is cleared 2 node timeouts later."""
CHUNK = 512
"""Slots of one owner in migration at once (``migrate_slots``)."""
MIGRATE_TIMEOUT_MS = 10_000
"""MIGRATE's own bound on one batch's transfer."""
COMMAND_TIMEOUT = 10.0


@dataclass(frozen=True)
class NodeLine:
    """One line of ``CLUSTER NODES``: a node as one node sees it."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    connected: bool
    slots: tuple[tuple[int, int], ...]
    """The ranges it serves (inclusive)."""
    migrating: dict[int, str]
    """slot -> node id it migrates to (only on the ``myself`` line)."""
    importing: dict[int, str]
    """slot -> node id it imports from (only on the ``myself`` line)."""

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})


@dataclass(frozen=True)
class Master:
    """A master as the cluster sees it now."""

    node_id: str
    port: int
    slots: tuple[tuple[int, int], ...]
    """Its slot ranges, inclusive, in order."""
    replicas: tuple[int, ...]
    """The ports of its replicas."""
    failing: bool = False
    """Flagged as failing (``fail?`` or ``fail``) by the node asked."""

    def slot_list(self) -> list[int]:
        return [s for first, last in self.slots for s in range(first, last + 1)]

    def owns(self, slot: int) -> bool:
        return any(first <= slot <= last for first, last in self.slots)

    @property
    def slot_count(self) -> int:
        return sum(last - first + 1 for first, last in self.slots)


def parse_nodes(text: str) -> list[NodeLine]:
    """``CLUSTER NODES``'s reply, parsed."""
    nodes = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split()
        # "ip:port@cport[,hostname]"; a node still in handshake may have ":0@0"
        address = fields[1].split("@")[0]
        port = int(address.rsplit(":", 1)[1] or 0)
        slots: list[tuple[int, int]] = []
        migrating: dict[int, str] = {}
        importing: dict[int, str] = {}
        for item in fields[8:]:
            if item.startswith("["):  # "[slot->-id]" migrating, "[slot-<-id]" importing
                body = item[1:-1]
                if "->-" in body:
                    slot, other = body.split("->-")
                    migrating[int(slot)] = other
                else:
                    slot, other = body.split("-<-")
                    importing[int(slot)] = other
            elif "-" in item:
                first, last = item.split("-")
                slots.append((int(first), int(last)))
            else:
                slots.append((int(item), int(item)))
        nodes.append(
            NodeLine(
                node_id=fields[0],
                port=port,
                flags=frozenset(fields[2].split(",")),
                master_id=None if fields[3] == "-" else fields[3],
                connected=fields[7] == "connected",
                slots=tuple(sorted(slots)),
                migrating=migrating,
                importing=importing,
            )
        )
    return nodes


class _ClusterNode(RedisServer):
    """A RedisServer with cluster mode on. The cluster bus port is chosen free too (given with
    ``cluster-port``) rather than left at port + 10000, which may be taken or past 65535;
    it is kept across restarts, as ``nodes.conf`` and the other nodes know it."""

    def __init__(self, appendonly: bool, node_timeout_ms: int, args: tuple[str, ...]) -> None:
        self._base_args = (
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",  # relative to the node's own directory (--dir)
            "--cluster-node-timeout",
            str(node_timeout_ms),
            *args,
        )
        super().__init__(appendonly=appendonly, args=self._base_args)
        self.bus_port = 0
        self._bus_for = 0

    def _launch(self, exe: str) -> str | None:
        if self._bus_for != self.port:  # a new port (a first start or its retry): a new bus
            bus = _free_port()
            while bus == self.port:
                bus = _free_port()
            self.bus_port, self._bus_for = bus, self.port
            self.args = (*self._base_args, "--cluster-port", str(bus))
        return super()._launch(exe)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill_hard(self) -> None:
        """SIGKILL: no last write, no goodbye to the other nodes."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


class RedisCluster:
    """``masters`` masters (and ``replicas`` replicas of each) on free ports of 127.0.0.1.

    ``appendonly`` as in RedisServer (a restarted master keeps its keys); ``node_timeout_ms``
    is ``cluster-node-timeout``; ``args`` are more options for every node."""

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 0,
        *,
        appendonly: bool = True,
        node_timeout_ms: int = NODE_TIMEOUT_MS,
        args: tuple[str, ...] = (),
    ) -> None:
        if masters < 1 or replicas < 0:
            raise ValueError("a cluster needs a master, and no negative replica count")
        if masters < 3 and replicas > 0:
            # redis-cli --cluster create refuses fewer than 3 masters; with fewer and no
            # replicas, the kit assigns the slots itself
            raise ValueError("replicas need at least 3 masters (redis-cli --cluster create)")
        self.master_count = masters
        self.replica_count = replicas
        self.appendonly = appendonly
        self.node_timeout_ms = node_timeout_ms
        self.args = args
        self._nodes: dict[int, _ClusterNode] = {}

    # ------------------------------------------------------------------ addresses

    @property
    def ports(self) -> list[int]:
        """Every node's port, in the order they were started."""
        return list(self._nodes)

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """(host, port) of every node."""
        return [(HOST, port) for port in self._nodes]

    @property
    def urls(self) -> list[str]:
        """A ``redis://`` URL of every node."""
        return [f"redis://{HOST}:{port}" for port in self._nodes]

    @property
    def url(self) -> str:
        """A ``redis://`` URL of one running node (a cluster client finds the others)."""
        return f"redis://{HOST}:{self._any_running()}"

    def client(self, **kwargs: Any) -> redis.cluster.RedisCluster:
        """A sync ``redis.cluster.RedisCluster`` on the running nodes (close it when done)."""
        nodes = [redis.cluster.ClusterNode(HOST, p) for p in self._running_ports()]
        return redis.cluster.RedisCluster(startup_nodes=nodes, **kwargs)

    def output(self, port: int) -> str:
        """What the node on ``port`` printed so far."""
        return self._nodes[port].output()

    # ------------------------------------------------------------------ lifecycle

    def start(self, port: int | None = None) -> None:
        """Start the cluster; with ``port``, start that node again after ``kill`` (same
        port, ``nodes.conf`` and data), returning once it answers PING, which is before the
        cluster is ok again (``wait_ok``)."""
        if port is not None:
            node = self._nodes[port]
            if node.running:
                raise RuntimeError(f"the node on port {port} is running")
            node.restart()
            return
        if self._nodes:
            raise RuntimeError("the cluster is started already")
        if shutil.which("redis-cli") is None:
            raise RuntimeError("redis-cli not found on PATH: the cluster tests need it")
        try:
            for _ in range(self.master_count * (1 + self.replica_count)):
                node = _ClusterNode(self.appendonly, self.node_timeout_ms, self.args)
                try:
                    node.start()
                except BaseException:  # interrupted while starting: not in _nodes yet
                    node.stop()
                    raise
                self._nodes[node.port] = node
            if self.master_count >= 3:
                self._create()
            else:
                self._create_small()
            self.wait_ok(CREATE_TIMEOUT)
        except BaseException:
            self.stop()
            raise

    def _create_small(self) -> None:
        # redis-cli --cluster create refuses fewer than 3 masters: what it does, by hand (each
        # master its share of the slots and its own config epoch, then all meet the first)
        ports = list(self._nodes)
        for i, port in enumerate(ports):
            first, last = i * SLOTS // len(ports), (i + 1) * SLOTS // len(ports) - 1
            self._ok(port, "CLUSTER", "ADDSLOTSRANGE", first, last)
            self._ok(port, "CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        for port in ports[1:]:
            self._ok(ports[0], "CLUSTER", "MEET", HOST, port, self._nodes[port].bus_port)

    def _create(self) -> None:
        # redis-cli makes the first `masters` nodes masters (all on one host) and gives each
        # its replicas; --cluster-yes accepts the plan (and the warning that replicas share
        # their master's host)
        command = [
            "redis-cli",
            "--cluster",
            "create",
            *(f"{HOST}:{port}" for port in self._nodes),
            "--cluster-replicas",
            str(self.replica_count),
            "--cluster-yes",
        ]
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=CREATE_TIMEOUT,
            )
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(
                f"redis-cli --cluster create did not end within {CREATE_TIMEOUT:.0f} s:\n"
                f"{(e.stdout or b'').decode(errors='replace')}{self._logs()}"
            ) from None
        if done.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed (code {done.returncode}):\n"
                f"{done.stdout.decode(errors='replace')}{done.stderr.decode(errors='replace')}"
            )

    def stop(self) -> None:
        """Stop every node and remove its directory (every one, even if one fails to stop)."""
        nodes, self._nodes = list(self._nodes.values()), {}
        failures: list[BaseException] = []
        for node in nodes:
            try:
                node.stop()
            except BaseException as e:  # raised below, once all are stopped
                failures.append(e)
        if failures:
            raise failures[0]

    def kill(self, port: int, *, hard: bool = False) -> None:
        """Stop the node on ``port`` (SIGTERM, or SIGKILL with ``hard``), keeping its files."""
        node = self._nodes[port]
        if hard:
            node.kill_hard()
        else:
            node.kill()

    def restart(self, port: int, *, hard: bool = False, timeout: float = OK_TIMEOUT) -> None:
        """Stop the node on ``port`` and start it again, then wait for ``cluster_state:ok``."""
        self.kill(port, hard=hard)
        self.start(port)
        self.wait_ok(timeout)

    def __enter__(self) -> RedisCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> RedisCluster:
        # in a thread: starting takes seconds, which the test's event loop should not stall
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)

    # ------------------------------------------------------------------ state

    def cluster_info(self, port: int) -> dict[str, str]:
        """``CLUSTER INFO`` of the node on ``port``."""
        with self._connect(port) as r:
            text = _text(r.execute_command("CLUSTER", "INFO"))
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def cluster_nodes(self, port: int) -> list[NodeLine]:
        """``CLUSTER NODES`` of the node on ``port``: the cluster as it sees it."""
        with self._connect(port) as r:
            return parse_nodes(_text(r.execute_command("CLUSTER", "NODES")))

    def masters(self) -> list[Master]:
        """The masters, in slot order (those without slots last), as a running node sees
        them; one that is down still serves its slots in that view (flagged ``failing``)
        until a replica takes them over."""
        view = self.cluster_nodes(self._any_running())
        masters = [
            Master(
                node_id=n.node_id,
                port=n.port,
                slots=n.slots,
                replicas=tuple(sorted(r.port for r in view if r.master_id == n.node_id)),
                failing=n.failing,
            )
            for n in view
            if n.is_master
        ]
        return sorted(masters, key=lambda m: m.slots[0][0] if m.slots else SLOTS)

    def node_for_slot(self, slot: int) -> Master:
        """The master serving ``slot`` now."""
        return _owner(self.masters(), slot)

    def _master_at(self, port: int) -> Master:
        for master in self.masters():
            if master.port == port:
                return master
        raise LookupError(f"no master on port {port}")

    def wait_ok(self, timeout: float = OK_TIMEOUT) -> None:
        """Wait until every running node says ``cluster_state:ok``, sees every running node
        connected and healthy, agrees with the others on who serves which slots, and every
        replica is linked to its master."""
        deadline = time.monotonic() + timeout
        while True:
            problem = self._problem()
            if problem is None:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the cluster is not ok after {timeout:.0f} s: {problem}{self._logs()}"
                )
            time.sleep(0.05)

    def _problem(self) -> str | None:
        """Why the cluster is not whole yet, or None."""
        running = self._running_ports()
        if not running:
            return "no node runs"
        views: dict[int, frozenset[tuple[str, tuple[tuple[int, int], ...]]]] = {}
        try:
            for port in running:
                info = self.cluster_info(port)
                if info.get("cluster_state") != "ok":
                    return f"node {port} says cluster_state:{info.get('cluster_state')}"
                if int(info.get("cluster_slots_assigned", 0)) != SLOTS:
                    return f"node {port} has {info.get('cluster_slots_assigned')} slots assigned"
                lines = self.cluster_nodes(port)
                if len(lines) != len(self._nodes):
                    return f"node {port} knows {len(lines)} of {len(self._nodes)} nodes"
                for line in lines:
                    if line.port in running and (line.failing or not line.connected):
                        return f"node {port} sees node {line.port} as {sorted(line.flags)}"
                    # a stopped master still owns its slots until a replica takes them over
                    # (the others may say ok for a node timeout or two before they notice)
                    if line.slots and line.port not in running:
                        return f"node {port} sees stopped node {line.port} serving slots"
                views[port] = frozenset((n.node_id, n.slots) for n in lines if n.slots)
                me = next(n for n in lines if "myself" in n.flags)
                if not me.is_master:
                    with self._connect(port) as r:
                        link = r.info("replication").get("master_link_status")
                    if link != "up":
                        return f"replica {port} has master_link_status:{link}"
        except (redis_sync.RedisError, OSError) as e:
            return f"{type(e).__name__}: {e}"
        if len(set(views.values())) > 1:
            return "the nodes do not agree on the slot map yet"
        return None

    # ------------------------------------------------------------------ data

    def flush(self) -> None:
        """Empty every master (FLUSHALL), and wait until its replicas have done it too."""
        for master in self.masters():
            with self._connect(master.port) as r:
                r.flushall()
                if master.replicas:
                    r.execute_command("WAIT", len(master.replicas), int(COMMAND_TIMEOUT * 1000))

    def migrate_slots(
        self, slots: Iterable[int], to_port: int, *, batch: int = 100, pause: float = 0.0
    ) -> int:
        """Move ``slots`` (with their keys) to the master on ``to_port`` the way
        ``redis-cli --cluster reshard`` does: IMPORTING on the target, MIGRATING on the owner,
        the keys moved ``batch`` at a time with MIGRATE (``pause`` seconds between batches, to
        stretch a migration under a test's load), then SETSLOT NODE on every master; then wait
        until the cluster agrees. Slots already there are skipped. Returns the number of keys
        moved.

        Unlike redis-cli, up to ``CHUNK`` slots of one owner are in migration at once and their
        SETSLOTs go in one pipeline per node: each SETSLOT makes the node save (and fsync) its
        ``nodes.conf``, once per event-loop turn, so one by one half a master's slots took 30 s
        and pipelined they take well under a second. The order per slot is redis-cli's."""
        target = self._master_at(to_port)
        masters = self.masters()
        by_source: dict[str, list[int]] = {}
        for slot in slots:
            owner = _owner(masters, slot)
            if owner.port != to_port:
                by_source.setdefault(owner.node_id, []).append(slot)
        moved = 0
        for source_id, todo in by_source.items():
            source = next(m for m in masters if m.node_id == source_id)
            for i in range(0, len(todo), CHUNK):
                chunk = todo[i : i + CHUNK]
                self._open(source, target, chunk)
                with self._connect(source.port) as r:
                    counts = _pipelined(r, [("CLUSTER", "COUNTKEYSINSLOT", s) for s in chunk])
                # a slot empty once MIGRATING is set stays empty on the owner: a key it
                # does not hold is written on the target (ASK)
                for slot, count in zip(chunk, counts, strict=True):
                    if int(count):
                        moved += self._move(source, target, slot, None, batch, pause)
                self._close(source, target, masters, chunk)
        self.wait_ok()
        return moved

    def migrate_half(
        self, from_port: int, to_port: int, *, batch: int = 100, pause: float = 0.0
    ) -> list[int]:
        """Move the first half of the slots of the master on ``from_port`` to the one on
        ``to_port`` (options as ``migrate_slots``); returns the slots moved."""
        slots = self._master_at(from_port).slot_list()
        half = slots[: len(slots) // 2]
        self.migrate_slots(half, to_port, batch=batch, pause=pause)
        return half

    # The steps of one slot's migration, to hold it half done (what a client meets then).

    def open_migration(self, slot: int, to_port: int) -> None:
        """Put ``slot`` in IMPORTING on the master on ``to_port`` and MIGRATING on its owner."""
        source = self.node_for_slot(slot)
        if source.port == to_port:
            raise ValueError(f"slot {slot} is already on port {to_port}")
        self._open(source, self._master_at(to_port), [slot])

    def move_keys(
        self,
        slot: int,
        to_port: int,
        *,
        limit: int | None = None,
        batch: int = 100,
        pause: float = 0.0,
    ) -> int:
        """MIGRATE the keys of ``slot`` (opened with ``open_migration``) from its owner to
        ``to_port``, ``batch`` at a time, all of them or at most ``limit``; returns how many."""
        source = self.node_for_slot(slot)
        return self._move(source, self._master_at(to_port), slot, limit, batch, pause)

    def close_migration(self, slot: int, to_port: int) -> None:
        """Give ``slot`` to the master on ``to_port`` (SETSLOT NODE on every master)."""
        masters = self.masters()
        target = next(m for m in masters if m.port == to_port)
        self._close(_owner(masters, slot), target, masters, [slot])

    def _open(self, source: Master, target: Master, slots: list[int]) -> None:
        # the target first, as redis-cli does: a client the owner sends off with ASK is
        # then accepted there
        self._setslots(target.port, [(s, "IMPORTING", source.node_id) for s in slots])
        self._setslots(source.port, [(s, "MIGRATING", target.node_id) for s in slots])

    def _move(
        self,
        source: Master,
        target: Master,
        slot: int,
        limit: int | None,
        batch: int,
        pause: float,
    ) -> int:
        # keys written meanwhile land on the target (the owner sends ASK for a key it does not
        # hold), so the owner's count only falls and the loop ends
        moved = 0
        with self._connect(source.port) as r:
            while limit is None or moved < limit:
                count = batch if limit is None else min(batch, limit - moved)
                keys = r.execute_command("CLUSTER", "GETKEYSINSLOT", slot, count)
                if not keys:
                    break
                reply = r.execute_command(
                    "MIGRATE", HOST, target.port, "", 0, MIGRATE_TIMEOUT_MS, "KEYS", *keys
                )
                if _text(reply) not in ("OK", "NOKEY"):
                    raise RuntimeError(f"MIGRATE of slot {slot} answered {reply!r}")
                moved += len(keys)
                if pause:
                    time.sleep(pause)
        return moved

    def _close(
        self, source: Master, target: Master, masters: list[Master], slots: list[int]
    ) -> None:
        # the target first (it stops importing and bumps its config epoch, so its claim wins),
        # then the former owner (it stops sending ASK, now MOVED), then every other master;
        # the replicas learn it by gossip
        order = [target.port, source.port]
        order += [m.port for m in masters if m.port not in order and not m.failing]
        for port in order:
            self._setslots(port, [(s, "NODE", target.node_id) for s in slots])

    def _setslots(self, port: int, changes: list[tuple[int, str, str]]) -> None:
        with self._connect(port) as r:
            replies = _pipelined(r, [("CLUSTER", "SETSLOT", *change) for change in changes])
        for change, reply in zip(changes, replies, strict=True):
            if _text(reply) != "OK":
                raise RuntimeError(f"CLUSTER SETSLOT {change} on port {port} answered {reply!r}")

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _connect(self, port: int) -> Iterator[redis_sync.Redis]:
        r = redis_sync.Redis(
            host=HOST, port=port, socket_timeout=COMMAND_TIMEOUT, socket_connect_timeout=2.0
        )
        try:
            yield r
        finally:
            r.close()

    def _ok(self, port: int, *command: str | int) -> None:
        with self._connect(port) as r:
            reply = r.execute_command(*command)
        if _text(reply) != "OK":
            raise RuntimeError(f"{' '.join(map(str, command))} on port {port} answered {reply!r}")

    def _running_ports(self) -> list[int]:
        return [port for port, node in self._nodes.items() if node.running]

    def _any_running(self) -> int:
        for port in self._running_ports():
            return port
        raise RuntimeError("no node of the cluster runs")

    def _logs(self) -> str:
        tails = []
        for port, node in self._nodes.items():
            if node.dir is not None and os.path.exists(os.path.join(node.dir, "redis.log")):
                tails.append(f"\n--- node {port}:\n{node.output()[-1500:]}")
        return "".join(tails)


def _owner(masters: list[Master], slot: int) -> Master:
    for master in masters:
        if master.owns(slot):
            return master
    raise LookupError(f"no master serves slot {slot}")


def _pipelined(r: redis_sync.Redis, commands: list[tuple[str | int, ...]]) -> list[Any]:
    """Replies of ``commands`` sent in one pipeline (errors returned, not raised)."""
    pipe = r.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return pipe.execute(raise_on_error=False)


def _text(reply: object) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)

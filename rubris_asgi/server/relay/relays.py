"""``Relays``: one node's carried WebSockets, both ends, and the stream between the nodes.

With several nodes, a client whose connection dropped may reconnect to any of them. When its
HELLO resumes a session that lives on another node (a session id names its node), the node it
reached (the *entry*) does not take the session over: it asks the session's node (the
*home*) to resume it there and then carries the frames both ways. The session stays whole
(subscriptions, ring cursors, private messages not yet acknowledged) and is served by the
home's cycle like a local one; the next reconnection may go home directly.

Opening is a request (``ws.open``: the HELLO frame; the answer is the WELCOME, or 404 when the
home does not hold the session and the entry opens a new one itself). Everything after is
records (records.py) told one way (``NodeLink.tell``: in order, what one turn of the event
loop told a node in one PUBLISH): the home's frames with a window of ``FRAMES_IN_FLIGHT``
(home.py), the client's frames (entry.py), their confirmations, READY, GONE and CLOSE. A carried
session thus costs about what a local one does plus a record each way per frame, and many
sessions' records share a message: no round trip per frame, no task per frame.

**Silence.** Two nodes that carry connections for each other each tell the other something
at least every half heartbeat (KEEP when nothing else: a carried client's PINGs may be answered
by the entry alone, so traffic alone says nothing). Nobody listening where a KEEP goes is a
node gone; nothing heard from a node for two heartbeats is a node stalled, paused or dead on
a host whose connection Redis still keeps: its connections here end as for a lost stretch
(``_untold``), so no client is left talking to an entry whose home is no more, and no session
stays attached to a connection nobody carries.

**Faults.** The home's node gone (nobody hears what the entry tells it) closes its carried
connections with 1012: the client reconnects and, its session gone with its node, starts a
new one. A ``ws.open`` that fails otherwise (Redis unreachable, a home that beat lately and did
not answer in time: stalled or paused) opens nothing: the entry closes the connection with
1013 and the client, keeping its session, resumes at its next attempt (``HomeUnreachable``);
a new session there would abandon the one the home still holds. A home that does not answer
and has not beat for longer than a session outlives its connection
(``Timing.session_timeout``) is gone too (a crashed host, whose subscriber connection Redis
may keep for minutes). A stretch of records lost (Redis failed during a flush) ends every
connection carried between the two nodes: the home's sessions wait for a resume and the entry
closes with 1013, so each client resumes, restating what it holds: exact (records.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Coroutine
from typing import Any

from starlette.websockets import WebSocket

from ...cluster.nodes import Head, NodeGone, NodeLink, NoReply
from ...engine.session import Session
from ...errors import BrokerUnavailable
from ..direct import DirectSocket, Outbox
from ..gateway import Gateway
from .entry import CLOSE_WAIT, Relay
from .home import RemoteSink
from .records import (
    ACK,
    CLOSE,
    CONNS,
    FRAME,
    GONE,
    IN,
    INACK,
    KEEP,
    READY,
    close_body,
    close_record,
    record,
    records,
)

log = logging.getLogger("rubris_asgi")

OPEN = "ws.open"
RECORDS = "ws"
"""The op of the records told between nodes."""
ASK_TIMEOUT = 10.0
"""Seconds a ``ws.open`` may take; also how long an entry waits for the home to handle a
client's frames before it gives up on the connection (1013)."""
FAILED = (NodeGone, BrokerUnavailable, asyncio.TimeoutError, RuntimeError)
"""What a request to the other node raises when it cannot be done."""


class HomeUnreachable(Exception):
    """The session's node could not be asked to resume it now, and may well hold it still:
    the connection is closed with 1013 so the client tries again, its session kept."""


class Relays:
    """One node's relayed WebSockets, both ends: those it carries for other nodes' sessions
    (``Relay``) and its sessions carried by other nodes (``RemoteSink``)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.entries: dict[int, Relay] = {}
        """Connections this node carries for another node, by connection number."""
        self.homes: dict[str, RemoteSink] = {}
        """Sessions of this node carried by another, by session id."""
        self.sinks: dict[tuple[str, int], RemoteSink] = {}
        """The same, by (entry node, connection number): what records name."""
        self.blocked: dict[RemoteSink, None] = {}
        """Sinks holding a frame back (their window full), which ``close_blocked`` looks at."""
        self.ask_timeout = ASK_TIMEOUT
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._acks: dict[str, dict[int, int]] = {}
        """Frames written, to confirm at the end of the turn: home node -> conn -> n."""
        self._acking = False
        self._outboxes: list[Outbox] = []
        """Direct writes of the records being heard, to flush when they are all read."""
        self._told_at: dict[str, float] = {}
        """When this node last told each node something (the engine's clock)."""
        self._heard_at: dict[str, float] = {}
        """When each node last told this one something."""

    @property
    def nodes(self) -> NodeLink:
        return self.gateway.nodes

    def serve(self) -> None:
        """Answer the other nodes (both ends)."""
        self.nodes.on(OPEN, self._open)
        self.nodes.on_tell(RECORDS, self._told, self._untold)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def tell(self, node: str, data: bytes) -> None:
        self._told_at[node] = self.gateway.engine.clock()
        self.nodes.tell(node, RECORDS, data)

    def tell_close(self, node: str, conn: int, code: int, reason: str, last: bytes) -> None:
        self.tell(node, close_record(conn, code, reason, last))

    # the entry's side

    async def carry(
        self, ws: WebSocket, direct: DirectSocket | None, node: str, frame: bytes, owner_tag: str
    ) -> bool:
        """Carry ``ws`` for the session its HELLO (``frame``) resumes on ``node``. False when
        that node does not hold it, or is gone (nothing was sent on ``ws``): the caller opens a
        session. Raises ``HomeUnreachable`` when it could not be asked (nothing sent either)."""
        conn = next(self._ids) % CONNS
        head = {"key": owner_tag, "via": self.nodes.node, "conn": conn}
        try:
            reply, welcome = await self.nodes.ask(node, OPEN, head, frame, self.ask_timeout)
        except NodeGone:
            return False
        except NoReply as exc:
            # received and not answered: stalled, paused, or dead with its subscriber connection
            # not yet dropped by Redis (a crashed host: minutes, until TCP keepalive). Silent for
            # longer than a session outlives its connection, its sessions are gone either way
            if await self._silent(node):
                return False
            raise HomeUnreachable(f"the session's node did not answer: {exc}") from exc
        except FAILED as exc:
            raise HomeUnreachable(f"the session's node cannot be reached now: {exc}") from exc
        if reply.get("status") != 200:
            return False
        relay = Relay(self, ws, direct, node, conn, str(reply["sid"]))
        self.entries[conn] = relay
        try:
            await relay.run(welcome)
        finally:
            self.entries.pop(conn, None)
        return True

    async def _silent(self, node: str) -> bool:
        try:
            return await self.nodes.silent(node, self.gateway.config.timing.session_timeout)
        except Exception:  # Redis away: nothing known; the client tries again
            return False

    def acked(self, relay: Relay, n: int) -> None:
        """``relay`` wrote frame ``n``: confirmed at the end of this turn, with the others."""
        acks = self._acks.get(relay.node)
        if acks is None:
            acks = self._acks[relay.node] = {}
        acks[relay.conn] = n
        if not self._acking:
            self._acking = True
            asyncio.get_running_loop().call_soon(self._send_acks)

    def _send_acks(self) -> None:
        self._acking = False
        acks, self._acks = self._acks, {}
        for node, done in acks.items():
            self.tell(node, b"".join(record(ACK, conn, n) for conn, n in done.items()))

    async def close_entries(self, code: int, reason: str) -> None:
        """Close every connection carried for another node (this node shuts down: the clients
        reconnect elsewhere, their sessions untouched)."""
        relays = list(self.entries.values())
        for relay in relays:
            relay.fail(code, reason)
        closing = [r.writer for r in relays if r.writer is not None]
        if closing:  # each close is bounded by CLOSE_WAIT: wait for them, not for ever
            await asyncio.wait(closing, timeout=CLOSE_WAIT + 1.0)

    # the home's side

    async def _open(self, head: Head, body: bytes) -> tuple[Head, bytes]:
        gateway = self.gateway
        msgs = gateway.decode_client_frame(body)
        s = gateway.resume(msgs, str(head.get("key")))
        if s is None:
            return {"status": 404}, b""
        s.transport = "websocket"
        sink = RemoteSink(self, s, str(head["via"]), int(head["conn"]))
        self.homes[s.id] = sink
        self.sinks[(sink.via, sink.conn)] = sink
        gateway.engine.attach(s, sink, ready=False)  # until the WELCOME is written
        await gateway.dispatcher.handle_first(s, msgs[1:])
        return {"status": 200, "sid": s.id}, gateway.welcome(s, True)

    def forget(self, sink: RemoteSink) -> None:
        """``sink`` carries its session no more: no record reaches it from now on."""
        if self.homes.get(sink.session.id) is sink:
            del self.homes[sink.session.id]
        if self.sinks.get((sink.via, sink.conn)) is sink:
            del self.sinks[(sink.via, sink.conn)]

    def upkeep(self, now: float) -> None:
        """The housekeeping's round: end the carried sessions whose frame has waited for the
        window ``max_blocked``; keep the nodes this one carries connections with hearing from
        it, and give up on those not heard from (module docstring: silence)."""
        limit = self.gateway.config.writer.max_blocked
        for sink in list(self.blocked):
            if now - sink.writing_since > limit:
                log.info("carried session %s blocked: closing", sink.session.id[:8])
                sink.blocked_too_long()
        heartbeat = self.gateway.config.timing.heartbeat
        peers = {r.node for r in self.entries.values()} | {via for via, _ in self.sinks}
        for node in peers:
            heard = self._heard_at.setdefault(node, now)  # counted from the first connection
            if now - heard > 2 * heartbeat:
                log.warning(
                    "nothing from node %s for %.0f s: its connections end", node, now - heard
                )
                self._heard_at.pop(node, None)
                self._untold(node, False)
            elif now - self._told_at.get(node, 0.0) >= heartbeat / 2:
                self.tell(node, record(KEEP, 0, 0))
        for gone in set(self._heard_at) - peers:  # nothing carried with it any more
            del self._heard_at[gone]
            self._told_at.pop(gone, None)

    def session_ended(self, s: Session) -> None:
        sink = self.homes.get(s.id)
        if sink is not None:
            sink.ended()

    # the stream between the nodes

    def _told(self, node: str, data: bytes) -> None:
        """Records from ``node``, in order: each to its connection's end here."""
        self._heard_at[node] = self.gateway.engine.clock()
        try:
            for kind, conn, n, body in records(data):
                if kind == KEEP:
                    continue
                if kind >= IN:
                    self._to_home(node, kind, conn, n, body)
                else:
                    self._to_entry(node, kind, conn, n, body)
        except ValueError as exc:  # a message cut short: the stream from node is not whole
            log.warning("records from node %s: %s", node, exc)
            self._untold(node, False)
        finally:
            outboxes, self._outboxes = self._outboxes, []
            for outbox in outboxes:  # the frames written straight to sockets, together
                outbox.flush()

    def _to_home(self, node: str, kind: int, conn: int, n: int, body: bytes) -> None:
        sink = self.sinks.get((node, conn))
        if sink is None:  # ended here: the entry closes its end if it has one
            if kind == IN:
                self.tell_close(node, conn, 1000, "session ended", b"")
            return
        if kind == ACK:
            sink.acked(n)
        elif kind == IN:
            sink.client_frame(n, body)
        elif kind == READY:
            if sink.session.sink is sink:
                self.gateway.engine.set_ready(sink.session)
        elif kind == GONE:
            sink.lost()

    def _to_entry(self, node: str, kind: int, conn: int, n: int, body: bytes) -> None:
        relay = self.entries.get(conn)
        if relay is None or relay.node != node:
            return  # closed here already: the home heard GONE, or hears it soon
        if kind == FRAME:
            direct = relay.direct
            if direct is not None and direct.outbox not in self._outboxes:
                self._outboxes.append(direct.outbox)
            relay.frame(n, body)
        elif kind == INACK:
            relay.handled(n)
        elif kind == CLOSE:
            reason, last = close_body(body)
            relay.close(n, reason, last)

    def _untold(self, node: str, gone: bool) -> None:
        """What this node told ``node`` may be lost (or nobody listens there): every
        connection carried between the two ends on both sides (the clients resume)."""
        for sink in [s for (via, _), s in self.sinks.items() if via == node]:
            sink.lost(tell=not gone)
        code, why = (1012, "its server is gone") if gone else (1013, "try again: lost track")
        for relay in [r for r in self.entries.values() if r.node == node]:
            relay.fail(code, why)

"""``Rubris.disconnect``: the application ends a user's sessions (or one session) with a
reason, on whichever node each lives.

A session the application no longer accepts (a user logged out everywhere, banned, whose
rights changed) must stop receiving at once, not when its connection happens to drop. Each
session found is ended with GOODBYE ``code`` (4 not authorised, or 10 rejected by the
application) as its last message, then the close that code calls for (1008); one without a
connection (waiting to be resumed) is forgotten at once, so no resume token brings it back.

A session id names its node, so ending one session asks that node alone (nobody listening
there: the node is gone, and its sessions with it). Ending a user's sessions asks every node
that beat within the last ``LIVE`` seconds (``NodeLink.live``, 30 s); each ends the sessions
whose owner is that user (compared as ``owner_tag``: ``repr`` of the user's stable identity,
the same comparison a resume makes across nodes). A node that beat lately but does not listen
(its connection to Redis coming back, or a crash less than 30 s ago) is unknown, not empty: the
call says so rather than miss a session it could not see.

**Outcomes.** The call returns how many sessions were ended, on every node asked. When a
node could not be asked or did not answer, the sessions ended elsewhere stay ended and the
call raises ``BrokerUnavailable`` naming how many were ended and which nodes are unknown:
the caller retries (ending is idempotent: a second call finds nothing more to end).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..engine.engine import Engine
from ..engine.session import Session, SessionState
from ..errors import BrokerUnavailable, ErrorCode
from .nodes import Head, NodeGone, NodeLink

END = "end"
ASK_TIMEOUT = 5.0
"""Seconds another node has to answer a request to end sessions."""
CODES = (ErrorCode.NOT_AUTHORISED, ErrorCode.REJECTED)
"""The GOODBYE codes an application may end sessions with."""


class SessionEnds:
    """Ending sessions by the application's word, both ends: here, and asking other nodes."""

    def __init__(self, engine: Engine, nodes: NodeLink, on_end: Callable[[Session], None]) -> None:
        """``on_end(session)``: what else ends with a session ended here (its running
        handlers)."""
        self.engine = engine
        self.nodes = nodes
        self._on_end = on_end

    def serve(self) -> None:
        self.nodes.on(END, self._answer)

    async def end(
        self, owner_tag: str | None, session_id: str | None, code: int, reason: str
    ) -> int:
        """End the sessions of ``owner_tag`` or the session ``session_id`` everywhere; how
        many were ended (module docstring: outcomes)."""
        if code not in CODES:
            raise ValueError(f"sessions are ended with code 4 or 10, not {code}")
        head: Head = {"owner": owner_tag, "session": session_id, "code": int(code), "r": reason}
        if session_id is not None:
            home = self.nodes.home_of(session_id)
            targets = [home] if home else []
            ended = 0 if home else self.here(owner_tag, session_id, code, reason)
        else:  # here first: what can be ended is, whatever Redis does next
            ended = self.here(owner_tag, None, code, reason)
            targets = [n for n in await self._live(ended) if n != self.nodes.node]
        unknown: list[str] = []
        answers = await asyncio.gather(
            *(self.nodes.ask(n, END, head, b"", ASK_TIMEOUT) for n in targets),
            return_exceptions=True,
        )
        for node, answer in zip(targets, answers, strict=True):
            if isinstance(answer, NodeGone) and session_id is not None:
                continue  # nobody listens for the session's own node: it is gone with it
            if isinstance(answer, BaseException):  # a live node not listening: unknown
                unknown.append(node)
                continue
            ended += int(answer[0].get("ended", 0))
        if unknown:
            raise BrokerUnavailable(
                f"{ended} sessions ended; node(s) {', '.join(unknown)} did not answer: "
                "sessions there may still be open, call again"
            )
        return ended

    async def _live(self, ended: int) -> list[str]:
        try:
            return await self.nodes.live()
        except Exception as exc:  # Redis away: no other node could be asked
            raise BrokerUnavailable(
                f"{ended} sessions ended here; the other nodes cannot be listed ({exc}): "
                "sessions there may still be open, call again"
            ) from exc

    def here(self, owner_tag: str | None, session_id: str | None, code: int, reason: str) -> int:
        """End the matching sessions of this node; how many."""
        engine = self.engine
        if session_id is not None:
            s = engine.sessions.get(session_id)
            found = [s] if s is not None and _owned(s, owner_tag) else []
        else:
            found = [s for s in engine.sessions.values() if _owned(s, owner_tag)]
        ended = 0
        for s in found:
            if s.state is SessionState.CLOSED or s.state is SessionState.CLOSING:
                continue
            ended += 1
            self._on_end(s)
            if s.sink is None:  # waiting for a resume: forgotten, so none can come
                engine.end_session(s)
            else:
                engine.close_session(s, code, reason)
        return ended

    async def _answer(self, head: Head, body: bytes) -> tuple[Head, bytes]:
        owner = head.get("owner")
        sid = head.get("session")
        code = int(head.get("code", ErrorCode.NOT_AUTHORISED))
        reason = str(head.get("r", ""))
        ended = self.here(
            owner if isinstance(owner, str) else None,
            sid if isinstance(sid, str) else None,
            code,
            reason,
        )
        return {"ended": ended}, b""


def _owned(s: Session, owner_tag: str | None) -> bool:
    """Whether ``s`` belongs to ``owner_tag`` (any owner when None: a session named by id)."""
    return owner_tag is None or (s.owner is not None and repr(s.owner) == owner_tag)

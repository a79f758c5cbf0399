"""``Drain``: the first half of a graceful shutdown, over every transport of one node.

GOODBYE 9 to every session, a bounded wait (``Timing.shutdown_drain``) for their last frames,
then every connection closed: WebSockets with GOODBYE 9 (a blocked one aborted), those carried
for other nodes' sessions with 1012 (their clients reconnect elsewhere), long-poll sessions
ended once their GOODBYE is taken. One drain at a time: a second caller waits for the first.
"""

from __future__ import annotations

import asyncio

from ..config import Config
from ..engine.engine import Engine
from ..engine.session import Session
from ..errors import ErrorCode
from .http.publish import HttpApi
from .longpoll import LongPollSession
from .relay import Relays
from .websocket import WebSocketTransport


class Drain:
    """Whether this node is draining, and the drain itself."""

    def __init__(
        self,
        engine: Engine,
        config: Config,
        api: HttpApi,
        websocket: WebSocketTransport,
        relays: Relays,
    ) -> None:
        self.engine = engine
        self.config = config
        self.api = api
        self.websocket = websocket
        self.relays = relays
        self.draining = False
        """From the start of a drain to the node's next start: new sessions are refused."""
        self._drained = asyncio.Event()

    def reset(self) -> None:
        """The node starts (again): nothing drains."""
        self.draining = False
        self._drained = asyncio.Event()

    async def run(self) -> None:
        if self.draining:  # one drain at a time; a second caller waits for the first's end
            await self._drained.wait()
            return
        self.draining = True
        try:
            self.api.stop_accepting()
            engine = self.engine
            for s in list(engine.sessions.values()):
                engine.close_session(s, ErrorCode.SHUTTING_DOWN, "server shutting down")
            deadline = engine.clock() + self.config.timing.shutdown_drain
            # polled: shutdown happens once, and a drain event would cost every frame on the
            # hot path
            while engine.clock() < deadline and any(  # noqa: ASYNC110
                self._waits_for(s) for s in engine.sessions.values()
            ):
                await asyncio.sleep(0.01)
            await self.websocket.abort_all(ErrorCode.SHUTTING_DOWN, "server shutting down")
            # connections carried for other nodes' sessions: their clients reconnect elsewhere
            await self.relays.close_entries(1012, "server restarting")
            for s in list(engine.sessions.values()):
                engine.end_session(s)
        finally:
            self._drained.set()

    def _waits_for(self, s: Session) -> bool:
        """Whether the drain should still wait for ``s`` to take its last frames."""
        sink = s.sink
        if isinstance(sink, LongPollSession) and sink.answering():
            # its last frame (the GOODBYE) is handed to a poll not yet answered: ending the
            # session now would drop the frame and the poll would answer 204
            return True
        if not s.has_work() or sink is None:
            return False
        if isinstance(sink, LongPollSession):
            return sink.takes_goodbye(self.engine.clock())
        return True

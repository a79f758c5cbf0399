"""``batch.{id}``: a batch's state pushed to whoever watches it (protocol.md 8c).

A snapshot topic per watched batch: a subscriber gets the batch's current state at once (read
from the store when the topic has no value yet) and every change after it (seal, ends,
expiry). On the topic a complete batch always says ``"completed": true``: its last value is the
completion push, whether a watcher saw it happen or subscribed later, and repeated acks or
seals that change nothing push nothing. Only batches somebody watches have a topic, and
the sweeper drops the topics nobody subscribes to any more, so unwatched batches cost nothing
here. Watching needs the batch's id (random, 64 bits) and, when the application gives one, the
``authorize_batch(session, batch)`` hook's yes.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from ..engine.channels import Registry
from ..engine.engine import Engine
from ..engine.session import Session
from ..errors import ErrorCode, ProtocolError, Reject, UnknownBatch
from .service import Batches
from .tracker import BatchStatus, State

AuthorizeBatch = Callable[[Session, str], "bool | Awaitable[bool]"]

PATTERN = "batch.{batch}"
PREFIX = "batch."


class BatchTopics:
    """The ``batch.{batch}`` channel and what publishes to it."""

    def __init__(
        self,
        engine: Engine,
        registry: Registry,
        batches: Batches,
        authorize: AuthorizeBatch | None = None,
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.batches = batches
        self.authorize = authorize
        self.names: dict[str, dict[str, Any] | None] = {}
        """Batch topics made for watchers (what ``sweep`` looks at), with the last state
        published on each."""
        registry.shared(PATTERN, snapshot=True, ring=None)(self.watch)
        batches.watched_by(self.changed, self.sweep)

    async def watch(self, session: Session, batch: str) -> Any:
        """The subscribe handler: the batch's state, for a topic that has none yet."""
        if self.authorize is not None:
            allowed = self.authorize(session, batch)
            if inspect.isawaitable(allowed):
                allowed = await allowed
            if not allowed:
                raise Reject("not allowed to watch this batch", ErrorCode.NOT_AUTHORISED)
        name = PREFIX + batch
        found = self.registry.match(name)
        assert found is not None
        # the topic exists from here on, so a change while the store answers is published to
        # it, and the (older) state read below is not put over it
        t = self.engine.topic_of(name, found[0])
        self.names.setdefault(name, None)
        try:
            st = await self.batches.status(batch)
        except UnknownBatch:
            self.engine.discard_topic(name)
            self.names.pop(name, None)
            raise Reject("unknown batch", ErrorCode.UNKNOWN) from None
        value = _pushed(st)
        if t.seq == 0:  # what the subscription will publish as the topic's first value
            self.names[name] = value
        return value

    def changed(self, batch: str, st: BatchStatus) -> None:
        name = PREFIX + batch
        engine = self.engine
        t = engine.topics.get(name)
        if t is None:
            if engine.relay is None:
                return  # nobody watches it here, and there is no other node
            # several nodes share the topics: a watcher may be on another one; the broker
            # numbers the change only if some node follows the topic, else it costs nothing
            found = self.registry.match(name)
            assert found is not None
            try:
                t = engine.topic_of(name, found[0])
            except ProtocolError:  # as many topics as the server takes: a watcher there
                return  # (if any) reads the state when it subscribes again
            self.names.setdefault(name, None)  # the sweep drops it again
        value = _pushed(st)
        if self.names.get(name) != value:
            self.names[name] = value
            engine.publish_if_followed(t, value)

    def sweep(self) -> int:
        """Drop the batch topics nobody subscribes to; returns how many."""
        topics = self.engine.topics
        gone = [n for n in self.names if self.engine.discard_topic(n) or n not in topics]
        for n in gone:
            del self.names[n]
        return len(gone)


def _pushed(st: BatchStatus) -> dict[str, Any]:
    """The state as the topic carries it: a complete batch is the completion push."""
    value = st.to_json()
    if st.state is State.COMPLETE:
        value["completed"] = True
    return value

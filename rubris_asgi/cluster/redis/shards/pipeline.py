"""``PartitionPipeline``: commands of one partition sent together, one round trip on one
connection to its master, redirects followed for the batch (``ShardedClient.call``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from redis.exceptions import ResponseError

from .scripts import Command, Script


class Caller(Protocol):
    """What a pipeline needs of its client (``ShardedClient``)."""

    def slot(self, partition: int) -> int: ...

    def remember(self, script: Script) -> None: ...

    async def call(self, slot: int, commands: Sequence[Command]) -> list[Any]: ...


MAX_COMMANDS = 10_000
"""Commands one pipeline holds at most: one more raises ``OverflowError`` (send these
first). A batch is written whole into the socket and its replies held until the last: past a
few thousand, the round trip saved is nothing beside the memory held."""


class PartitionPipeline:
    """Commands of one partition, sent by ``execute`` in one pipeline.

    What is safe: a command answered ``MOVED``, ``ASK``, ``TRYAGAIN`` or ``NOSCRIPT`` did not
    run, and only those are sent again (after the others ran: their order across a redirect
    is not kept). A connection lost during ``execute`` raises, and then any of the commands
    may have run: send the pipeline again only if each is safe to run twice, as rubris's
    scripts are (a batch id answered from its first run)."""

    def __init__(self, client: Caller, partition: int) -> None:
        self._client = client
        self.partition = partition
        self._commands: list[Command] = []

    def __len__(self) -> int:
        return len(self._commands)

    def command(self, *words: Any) -> PartitionPipeline:
        """Add a command (its words); returns the pipeline."""
        if len(self._commands) >= MAX_COMMANDS:
            raise OverflowError(f"a pipeline holds at most {MAX_COMMANDS} commands")
        self._commands.append(words)
        return self

    def script(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> PartitionPipeline:
        """Add a run of ``script`` (``ShardedClient.run_script`` says what its keys must be)."""
        self._client.remember(script)
        return self.command(*script.command(keys, args))

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send the commands and return their replies in order; the pipeline is empty after.
        With ``raise_on_error``, the first error among the replies is raised (once all are
        read); else errors are returned in their places."""
        commands, self._commands = self._commands, []
        if not commands:
            return []
        replies = await self._client.call(self._client.slot(self.partition), commands)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
        return replies

"""What Redis keeps across its restart, read at start: work-queue items and batches are
accepted only where an accepted one cannot be lost to a restart (``appendonly yes``), unless
the application says it accepts that (``allow_volatile``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from ...errors import BrokerUnavailable

log = logging.getLogger("rubris_asgi.broker")


class RedisNotDurable(BrokerUnavailable):
    """Redis runs without an append-only file (or its settings cannot be read), so what it
    holds would be lost on its restart: work-queue items and batches are not kept there
    unless the broker or the store was made with ``allow_volatile=True``."""


@dataclass(frozen=True)
class Persistence:
    """What Redis said of its persistence at start."""

    aof: bool | None
    """``appendonly``: every write logged to the append-only file (None: not known)."""
    fsync: str | None
    """``appendfsync``: always, everysec or no (None: not known)."""
    save: str | None
    """``save``: the RDB snapshot points ("" none; None: not known)."""
    source: str
    """Where it was read: ``CONFIG GET``, ``INFO persistence``, or "" (nowhere)."""
    error: str = ""
    """Why nothing could be read."""

    def describe(self) -> str:
        if not self.source:
            return f"its persistence settings cannot be read ({self.error})"
        aof = {True: "yes", False: "no", None: "unknown"}[self.aof]
        fsync = self.fsync or "unknown"
        save = "unknown" if self.save is None else repr(self.save)
        return f"appendonly {aof}, appendfsync {fsync}, save {save} (from {self.source})"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def read_persistence(client: aioredis.Redis) -> Persistence:
    """Redis's persistence settings: ``CONFIG GET`` (renamed or refused on managed services),
    else ``INFO persistence`` (which tells whether the append-only file is on, not its fsync
    policy), else a ``Persistence`` that says neither answered. Raises what a lost Redis
    raises."""
    try:
        got = {_text(k): _text(v) for k, v in (await client.config_get("append*")).items()}
        save = {_text(k): _text(v) for k, v in (await client.config_get("save")).items()}
        return Persistence(
            got.get("appendonly") == "yes", got.get("appendfsync"), save.get("save"), "CONFIG GET"
        )
    except ResponseError as exc:  # unknown command (renamed), or refused by an ACL
        config = str(exc)
    try:
        info = await client.info("persistence")
    except ResponseError as exc:
        return Persistence(None, None, None, "", f"CONFIG GET: {config}; INFO: {exc}")
    aof = info.get("aof_enabled")
    return Persistence(None if aof is None else bool(int(aof)), None, None, "INFO persistence")


def require_durable(
    persistence: Persistence, what: str, allow_volatile: bool, where: str, warned: set[str]
) -> None:
    """Refuse to keep ``what`` in a Redis that may lose it on a restart (``RedisNotDurable``),
    or, allowed, say so once as a WARNING (``warned`` holds what was said)."""
    if persistence.aof:
        if persistence.fsync == "no" and "fsync" not in warned:
            warned.add("fsync")
            log.warning(
                "Redis at %s runs with appendfsync no: a restart of its process loses nothing, "
                "a crash of its host the writes of the last 30 s or so (appendfsync everysec: "
                "1 s; always: none)",
                where,
            )
        return
    message = (
        f"{what} kept in Redis at {where} would be lost on a Redis restart: "
        f"{persistence.describe()}. Run Redis with `appendonly yes` (`appendfsync everysec`, or "
        "`always` to lose nothing to a host crash either), or pass allow_volatile=True to "
        "accept the loss"
    )
    if not allow_volatile:
        raise RedisNotDurable(message)
    if what not in warned:
        warned.add(what)
        log.warning("%s (allowed: allow_volatile=True)", message)

"""What Redis keeps across its restart, read at start: work-queue items and batches are
accepted only where an accepted one cannot be lost to a restart (``appendonly yes``), unless
the application says it accepts that (``allow_volatile``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from ...errors import BrokerUnavailable, StartupError
from .pool import redacted, redis_cli

log = logging.getLogger("rubris_asgi.broker")


class RedisNotDurable(BrokerUnavailable, StartupError):
    """Redis runs without an append-only file (or its settings cannot be read), so what it
    holds would be lost on its restart: work-queue items and batches are not kept there
    unless the broker or the store was made with ``allow_volatile=True``. Its one line says
    how to turn the append-only file on (a ``StartupError``: at start it stops rubris)."""


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
            return f"its persistence settings cannot be read: {self.error}"
        aof = {True: "yes", False: "no", None: "unknown"}[self.aof]
        fsync = self.fsync or "unknown"
        save = "unknown" if self.save is None else repr(self.save)
        return f"appendonly {aof}, appendfsync {fsync}, save {save}, from {self.source}"


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
    persistence: Persistence,
    what: str,
    allow_volatile: bool,
    url: str | None,
    warned: set[str],
) -> None:
    """Refuse to keep ``what`` in the Redis at ``url`` (None: a client the caller made) if it
    may lose it on a restart (``RedisNotDurable``), or, allowed, say so once as a WARNING
    (``warned`` holds what was said)."""
    where = "the client's" if url is None else redacted(url)
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
    problem = (
        f"{what} kept in Redis at {where} would be lost on a Redis restart "
        f"({persistence.describe()})"
    )
    fix = _aof_fix(persistence, url)
    if not allow_volatile:
        raise RedisNotDurable(f"{problem}: {fix}, or pass allow_volatile=True to accept the loss")
    if what not in warned:
        warned.add(what)
        log.warning("%s (allowed: allow_volatile=True); to keep them: %s", problem, fix)


def _aof_fix(persistence: Persistence, url: str | None) -> str:
    """What turns the append-only file on where ``url`` points, as one clause."""
    if not persistence.source:  # the settings are hidden: they cannot be set from here either
        return (
            "run Redis with `appendonly yes` and let this client read CONFIG GET or INFO "
            "persistence"
        )
    # CONFIG SET takes effect at once, without a restart; redis.conf keeps it past the next one
    if url is None:
        return "run `config set appendonly yes` on it and put `appendonly yes` in its redis.conf"
    cli = redis_cli(url)
    if cli is None:  # Sentinel: the master and every replica, which may be promoted
        return (
            "run `redis-cli config set appendonly yes` on the master and each replica and put "
            "`appendonly yes` in their redis.conf"
        )
    return (
        f"run `{cli} config set appendonly yes` and put `appendonly yes` in its redis.conf "
        "(or start redis-server with --appendonly yes)"
    )

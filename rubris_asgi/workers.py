"""The workers of one host see each other's figures through a shared directory.

Under ``uvicorn --workers N`` (or gunicorn) every worker is a process of its own with its own
engine, and a request for ``/metrics`` or the ops page reaches whichever worker accepts it. So
that any of them can answer for all, each worker writes its snapshot (observer.py) to
``{directory}/rubris-{host}-{pid}.json`` every ``interval`` and the answering worker adds the
files of the others to its own, fresh, snapshot. A worker's series keep its own ``worker``
label (counters stay monotonic per worker; sum them in the query), and another worker's
figures are at most ``interval`` old.

This is prometheus-client's multiprocess mode in spirit, one file per process, but written
once a second from counters the engine keeps anyway, instead of a memory-mapped write on every
increment of the hot path. A worker that stops removes its file; one that was killed leaves it
behind and is ignored once the file is older than ``STALE`` intervals, and removed by the next
worker that starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any

import orjson

from .observer import Observer

log = logging.getLogger("rubris_asgi")

STALE = 5
"""Intervals after which another worker's file is left out (the worker is gone)."""
ENV = ("RUBRIS_STATS_DIR", "PROMETHEUS_MULTIPROC_DIR")
"""Environment variables naming the shared directory when the application does not."""


def stats_dir(directory: str | os.PathLike[str] | None) -> Path | None:
    """The directory to share, from the argument or the environment; None: this worker alone."""
    if directory is not None:
        return Path(directory)
    for name in ENV:
        value = os.environ.get(name)
        if value:
            return Path(value)
    return None


class WorkerBoard:
    """This worker's snapshot and, with a directory, the other workers' (module docstring)."""

    def __init__(self, observer: Observer, directory: Path | None, interval: float = 1.0) -> None:
        self.observer = observer
        self.directory = directory
        self.interval = interval
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{observer.host}-{observer.pid}")
        self.path = directory / f"rubris-{name}.json" if directory is not None else None

    def snapshots(self) -> list[dict[str, Any]]:
        """Every live worker's snapshot, this worker's first (fresh, ``self``: true)."""
        own = {**self.observer.snapshot(), "self": True}
        out = [own]
        if self.directory is None:
            return out
        now = own["time"]
        for path in sorted(self.directory.glob("rubris-*.json")):
            if path == self.path:
                continue
            try:
                snap = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue  # being replaced, or removed, right now
            if (
                not isinstance(snap, dict)
                or now - float(snap.get("time", 0)) > STALE * self.interval
            ):
                continue
            snap["self"] = False
            out.append(snap)
        return out

    async def run(self) -> None:
        """Write this worker's snapshot every ``interval`` (a task of ``Rubris.start``)."""
        if self.path is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
        self._sweep()
        while True:
            try:
                self.write()
            except OSError as exc:  # a full disk must not stop the worker; it just goes unseen
                log.warning("worker stats: cannot write %s: %s", self.path, exc)
            await asyncio.sleep(self.interval)

    def write(self) -> None:
        assert self.path is not None
        snap = self.observer.snapshot(fresh=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(snap))
        os.replace(tmp, self.path)  # readers see the old file or the new one, never half

    def close(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def _sweep(self) -> None:
        """Remove the files of workers of this host that are gone (killed, not stopped)."""
        assert self.directory is not None
        host = self.observer.host
        for path in self.directory.glob("rubris-*.json"):
            try:
                snap = orjson.loads(path.read_bytes())
                if snap.get("host") != host or _alive(int(snap.get("pid", 0))):
                    continue
                path.unlink()
            except (OSError, ValueError, orjson.JSONDecodeError, AttributeError):
                continue


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process with that pid: leave its file alone
    return True

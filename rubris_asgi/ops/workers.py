"""The workers of one host see each other's figures through a shared directory.

Under ``uvicorn --workers N`` (or gunicorn) every worker is a process of its own with its own
engine, and a request for ``/metrics`` or the ops page reaches whichever worker accepts it. So
that any of them can answer for all, each worker writes its snapshot (observer.py) to
``{directory}/rubris-{host}-{pid}.json`` every ``interval`` and the answering worker adds the
files of the others to its own, fresh, snapshot. A worker's series keep its own ``worker``
label (counters stay monotonic per worker; sum them in the query), and another worker's
figures are at most ``interval`` old.

With the ops page on, each worker also keeps the page's last five minutes (history.py) and,
with a directory, appends each second's sample to ``{directory}/history-{host}-{pid}.jsonl``
(rewritten from the ring when it reaches twice the ring's length, so it stays under 600 lines):
the worker that answers the page's first request serves every worker's history, which the page
adds up as it adds up their live snapshots.

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
import time
from pathlib import Path
from typing import Any

import orjson

from .history import History
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


def _name(host: object, pid: object) -> str:
    """A worker's part of its file names: ``host-pid``, safe as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{host}-{pid}")


class WorkerBoard:
    """This worker's snapshot and, with a directory, the other workers' (module docstring)."""

    def __init__(
        self,
        observer: Observer,
        directory: Path | None,
        interval: float = 1.0,
        *,
        history: bool = False,
    ) -> None:
        self.observer = observer
        self.directory = directory
        self.interval = interval
        name = _name(observer.host, observer.pid)
        self.path = directory / f"rubris-{name}.json" if directory is not None else None
        self.history = (
            History(observer.engine, observer.worker, interval=interval) if history else None
        )
        """The ops page's last minutes (history.py), kept when the page is on."""
        self.history_path = directory / f"history-{name}.jsonl" if directory is not None else None
        self._history_lines = 0

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

    @property
    def running(self) -> bool:
        """Whether ``run`` has anything to do: share the snapshot, or keep the history."""
        return self.path is not None or self.history is not None

    async def run(self) -> None:
        """Every ``interval``: take this worker's history sample and, with a directory, write
        its snapshot and append the sample for the other workers (a task of ``Rubris.start``
        when ``running``)."""
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._sweep()
            if self.history_path is not None:  # a killed process of the same pid left it
                with contextlib.suppress(OSError):
                    self.history_path.unlink()
        while True:
            self.tick()
            await asyncio.sleep(self.interval)

    def tick(self) -> None:
        """One turn of ``run``."""
        sample = None
        if self.history is not None:
            try:
                sample = self.history.sample()
            except Exception:  # a bug here must not stop the snapshot being shared
                log.exception("ops history: the sample failed")
        if self.path is None:
            return
        try:
            self.write()
            if sample is not None:
                self._append(sample)
        except OSError as exc:  # a full disk must not stop the worker; it just goes unseen
            log.warning("worker stats: cannot write %s: %s", self.directory, exc)

    def write(self) -> None:
        assert self.path is not None
        snap = self.observer.snapshot(fresh=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(snap))
        os.replace(tmp, self.path)  # readers see the old file or the new one, never half

    def _append(self, sample: bytes) -> None:
        """Add the newest sample to this worker's history file: one line, or the whole ring
        again once the file holds twice its length (the file stays bounded)."""
        assert self.history_path is not None and self.history is not None
        if self._history_lines >= 2 * (self.history.samples.maxlen or 1):
            lines = [data for _, data in self.history.samples]
            tmp = self.history_path.with_suffix(".tmp")
            tmp.write_bytes(b"\n".join(lines) + b"\n")
            os.replace(tmp, self.history_path)
            self._history_lines = len(lines)
            return
        with self.history_path.open("ab") as f:
            f.write(sample + b"\n")
        self._history_lines += 1

    def histories(self, snapshots: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The history of every worker in ``snapshots`` (``snapshots()``'s answer) for the
        page's first request: this worker's ring and the others' files, oldest sample first.
        None without a history (the ops page off)."""
        history = self.history
        if history is None:
            return None
        now = float(snapshots[0]["time"])
        since = now - history.span
        samples: list[tuple[float, Any]] = [
            (at, orjson.Fragment(data)) for at, data in history.recent(now)
        ]
        if self.directory is not None:
            for snap in snapshots:
                if snap.get("self"):
                    continue
                path = self.directory / f"history-{_name(snap.get('host'), snap.get('pid'))}.jsonl"
                samples.extend(_read_history(path, since, snap.get("worker")))
        samples.sort(key=lambda x: x[0])
        return {
            "interval": self.interval,
            "span": history.span,
            "bounds": history.bounds(),
            "samples": [sample for _, sample in samples],
        }

    def close(self) -> None:
        for path in (self.path, self.history_path):
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()

    def _sweep(self) -> None:
        """Remove the files of workers of this host that are gone (killed, not stopped), and
        history files left without a worker."""
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
        stale = STALE * self.interval
        for path in self.directory.glob("history-*.jsonl"):
            own = path.name.removeprefix("history-").removesuffix(".jsonl")
            with contextlib.suppress(OSError):
                # a live worker appends every interval, and its snapshot file is there
                if not (self.directory / f"rubris-{own}.json").exists() and _age(path) > stale:
                    path.unlink()


def _age(path: Path) -> float:
    return time.time() - path.stat().st_mtime


def _read_history(path: Path, since: float, worker: object) -> list[tuple[float, Any]]:
    """Another worker's samples newer than ``since``, from its history file; a line being
    written right now (or any that does not parse) is left out."""
    try:
        raw = path.read_bytes()
    except OSError:
        return []
    out = []
    for line in raw.splitlines():
        try:
            sample = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(sample, dict) or sample.get("worker") != worker:
            continue
        at = sample.get("time")
        if isinstance(at, (int, float)) and at > since:
            out.append((float(at), sample))
    return out


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

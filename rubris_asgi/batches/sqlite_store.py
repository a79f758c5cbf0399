"""``SQLiteBatchStore``: batches in one SQLite file, the embedded default.

Several processes on one host (uvicorn workers, a producer script) may share the file. Each
operation is one transaction begun with ``BEGIN IMMEDIATE``, which takes the database's write
lock before reading: the read-modify-write of a bitfield cannot interleave with another
process's (the source document does the same with ``SELECT ... FOR UPDATE``), and a writer
waiting for the lock waits (``busy_timeout``) rather than failing. WAL mode lets readers go on
meanwhile; ``synchronous=NORMAL`` makes a commit survive a crash of the process, not a power
cut.

The calls run in one thread of their own, so the event loop never waits on the disk. The file
is created on first use: an application that never opens a batch leaves no file behind.

Tables: ``rubris_batches`` (one row a batch), ``rubris_batch_groups`` (start and size of each
add) and ``rubris_batch_chunks`` (992-byte bitfields, keyed by rowid = batch number << 24 |
chunk, so no index costs space beside them).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ..errors import StartupError, UnknownBatch
from . import tracker
from .bits import CHUNK_BYTES
from .ids import ItemRef
from .store import BatchStore
from .tracker import LIVE, BatchRecord, BatchStatus, State

T = TypeVar("T")

log = logging.getLogger("rubris_asgi")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rubris_batches (
    no INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL,
    total INTEGER NOT NULL,
    done INTEGER NOT NULL,
    failed INTEGER NOT NULL,
    groups INTEGER NOT NULL,
    touched REAL NOT NULL,
    ended REAL
);
CREATE INDEX IF NOT EXISTS rubris_batches_touched ON rubris_batches (touched);
CREATE TABLE IF NOT EXISTS rubris_batch_groups (
    batch INTEGER NOT NULL,
    grp INTEGER NOT NULL,
    start INTEGER NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (batch, grp)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rubris_batch_chunks (bits BLOB NOT NULL);
"""

_CHUNK_SHIFT = 24
"""Chunk rowid = batch number << 24 | chunk: 2^24 chunks (133 billion items) a batch."""


class SQLiteBatchStore(BatchStore):
    """Batches in the SQLite database ``path`` (created on first use).

    ``busy_timeout``: seconds an operation waits for another process's transaction.
    """

    def __init__(
        self, path: str | os.PathLike[str] = "rubris-batches.sqlite3", *, busy_timeout: float = 30.0
    ) -> None:
        self.path = str(path)
        self.busy_timeout = busy_timeout
        self._db: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None

    # the thread and the connection

    async def start(self) -> None:
        """Start the store's thread and open the file if it exists (it is created by the first
        batch): a file that cannot be opened (not a database, no permission, a full disk) or
        a directory that does not exist raises ``StartupError`` here, one line that says what
        to do, rather than at the first batch."""
        if self._thread is not None:
            return
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="rubris-sqlite")
        try:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._check)
        except StartupError:
            await self.close()
            raise

    def _check(self) -> None:
        """Open the database where it exists (in the store's thread); else make sure its
        directory does, without creating the file."""
        try:
            if self.path == ":memory:" or Path(self.path).exists():
                self._connect(create=True)
                return
            folder = Path(self.path).parent
            if not folder.is_dir():
                raise FileNotFoundError(f"no directory {folder}")
        except (sqlite3.Error, OSError) as exc:
            log.debug("the batch store %s cannot be opened", self.path, exc_info=exc)
            raise StartupError(
                f"cannot open the batch store {os.path.abspath(self.path)} ({exc}): give "
                "Rubris(batches=...) a SQLite file this process can create or write (or "
                "batches=False)"
            ) from None

    async def close(self) -> None:
        if self._thread is None:
            return
        await self._call(self._disconnect)
        self._thread.shutdown(wait=True)
        self._thread = None

    def _disconnect(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        await self.start()
        assert self._thread is not None
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _connect(self, create: bool) -> sqlite3.Connection | None:
        """The connection (in the store's thread); None when the file does not exist yet
        and ``create`` is False: there is nothing to read."""
        if self._db is None:
            if not create and self.path != ":memory:" and not Path(self.path).exists():
                return None
            db = sqlite3.connect(self.path, isolation_level=None, timeout=self.busy_timeout)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            self._db = db
        return self._db

    def _tx(self, create: bool, fn: Callable[[_SQLView], T], missing: Callable[[], T]) -> T:
        """Run ``fn`` in one write transaction; ``missing()`` when there is no database."""
        db = self._connect(create)
        if db is None:
            return missing()
        db.execute("BEGIN IMMEDIATE")
        try:
            view = _SQLView(db)
            out = fn(view)
            view.flush()
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return out

    # the operations

    async def open(self, batch: str, now: float) -> BatchStatus:
        return await self._call(self._tx, True, lambda v: tracker.open_batch(v, batch, now), _never)

    async def add(self, batch: str, count: int, now: float) -> int:
        config = self.config
        return await self._call(
            self._tx, False, lambda v: tracker.add(v, batch, count, now, config), _unknown(batch)
        )

    async def seal(self, batch: str, now: float) -> BatchStatus:
        return await self._call(
            self._tx, False, lambda v: tracker.seal(v, batch, now), _unknown(batch)
        )

    async def end(
        self, items: Sequence[ItemRef], now: float, *, failed: bool = False
    ) -> dict[str, BatchStatus]:
        if not items:
            return {}
        return await self._call(
            self._tx,
            False,
            lambda v: tracker.end(v, items, now, failed=failed),
            _unknown(items[0].batch, items[0]),
        )

    async def status(self, batch: str) -> BatchStatus:
        return await self._call(
            self._tx, False, lambda v: tracker.status(v, batch), _unknown(batch)
        )

    async def check(self, items: Sequence[ItemRef]) -> None:
        if items:
            await self._call(
                self._tx,
                False,
                lambda v: tracker.check(v, items),
                _unknown(items[0].batch, items[0]),
            )

    async def sweep(self, now: float) -> list[tuple[str, BatchStatus]]:
        return await self._call(self._tx, False, lambda v: self._sweep(v, now), list)

    def _sweep(self, view: _SQLView, now: float) -> list[tuple[str, BatchStatus]]:
        c = self.config
        before = max(
            tracker.idle_cutoff(State.OPEN, now, c), tracker.idle_cutoff(State.SEALED, now, c)
        )
        rows = view.db.execute(
            "SELECT id FROM rubris_batches WHERE touched < ?", (max(before, now - c.keep),)
        ).fetchall()
        expired: list[tuple[str, BatchStatus]] = []
        for (batch,) in rows:
            rec = view.record(batch)
            assert rec is not None
            if rec.state in LIVE and rec.touched < tracker.idle_cutoff(rec.state, now, c):
                expired.append((batch, tracker.expire(view, rec, now)))
            elif rec.ended is not None and rec.ended < now - c.keep:
                view.forget(batch)
        return expired

    async def footprint(self) -> int:
        def size() -> int:
            db = self._connect(False)
            if db is None:
                return 0
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            free = db.execute("PRAGMA freelist_count").fetchone()[0]
            page = db.execute("PRAGMA page_size").fetchone()[0]
            return int((pages - free) * page)

        return await self._call(size)


def _never() -> BatchStatus:
    raise AssertionError("open always creates the database")


def _unknown(batch: str, item: ItemRef | None = None) -> Callable[[], Any]:
    """What an operation on ``batch`` answers while there is no database: nothing is known."""

    def missing() -> Any:
        named = f" (item {item})" if item is not None else ""
        raise UnknownBatch(f"unknown batch {batch!r}{named}", None if item is None else str(item))

    return missing


class _SQLView:
    """The rows one transaction reads, cached, and what it changed, written at ``flush``."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self._records: dict[str, tuple[int, BatchRecord] | None] = {}
        self._groups: dict[tuple[str, int], tuple[int, int] | None] = {}
        self._chunks: dict[int, tuple[bytearray, bytes]] = {}  # rowid -> (bits, as read)
        self._changed: dict[str, BatchRecord] = {}
        self._dropped: set[int] = set()

    def _no(self, batch: str) -> int:
        got = self._records.get(batch)
        assert got is not None
        return got[0]

    def record(self, batch: str) -> BatchRecord | None:
        if batch not in self._records:
            row = self.db.execute(
                "SELECT no, state, total, done, failed, groups, touched, ended "
                "FROM rubris_batches WHERE id = ?",
                (batch,),
            ).fetchone()
            self._records[batch] = (
                None if row is None else (row[0], BatchRecord(batch, State(row[1]), *row[2:]))
            )
        got = self._records[batch]
        return None if got is None else got[1]

    def group(self, batch: str, group: int) -> tuple[int, int] | None:
        key = (batch, group)
        if key not in self._groups:
            row = self.db.execute(
                "SELECT start, count FROM rubris_batch_groups WHERE batch = ? AND grp = ?",
                (self._no(batch), group),
            ).fetchone()
            self._groups[key] = None if row is None else (row[0], row[1])
        return self._groups[key]

    def chunk(self, batch: str, k: int) -> bytearray:
        rowid = self._no(batch) << _CHUNK_SHIFT | k
        got = self._chunks.get(rowid)
        if got is None:
            row = self.db.execute(
                "SELECT bits FROM rubris_batch_chunks WHERE rowid = ?", (rowid,)
            ).fetchone()
            read = row[0] if row else b""
            got = self._chunks[rowid] = (bytearray(read or CHUNK_BYTES), read)
        return got[0]

    def put_record(self, rec: BatchRecord) -> None:
        if rec.id not in self._records or self._records[rec.id] is None:
            cur = self.db.execute(
                "INSERT INTO rubris_batches (id, state, total, done, failed, groups, touched) "
                "VALUES (?, ?, 0, 0, 0, 0, ?)",
                (rec.id, rec.state.value, rec.touched),
            )
            assert cur.lastrowid is not None
            self._records[rec.id] = (cur.lastrowid, rec)
        self._changed[rec.id] = rec

    def put_group(self, batch: str, group: int, start: int, count: int) -> None:
        self.db.execute(
            "INSERT INTO rubris_batch_groups (batch, grp, start, count) VALUES (?, ?, ?, ?)",
            (self._no(batch), group, start, count),
        )
        self._groups[(batch, group)] = (start, count)

    def drop_bits(self, batch: str) -> None:
        no = self._no(batch)
        self._dropped.add(no)
        for rowid in [r for r in self._chunks if r >> _CHUNK_SHIFT == no]:
            del self._chunks[rowid]

    def forget(self, batch: str) -> None:
        no = self._no(batch)
        self.db.execute("DELETE FROM rubris_batch_groups WHERE batch = ?", (no,))
        self._delete_chunks(no)
        self.db.execute("DELETE FROM rubris_batches WHERE no = ?", (no,))
        self._changed.pop(batch, None)

    def _delete_chunks(self, no: int) -> None:
        self.db.execute(
            "DELETE FROM rubris_batch_chunks WHERE rowid >= ? AND rowid < ?",
            (no << _CHUNK_SHIFT, (no + 1) << _CHUNK_SHIFT),
        )

    def flush(self) -> None:
        db = self.db
        for no in self._dropped:
            self._delete_chunks(no)
        changed = [(r, bytes(buf)) for r, (buf, read) in self._chunks.items() if buf != read]
        if changed:  # a repeated ack rewrites nothing
            db.executemany(
                "INSERT OR REPLACE INTO rubris_batch_chunks (rowid, bits) VALUES (?, ?)", changed
            )
        for rec in self._changed.values():
            db.execute(
                "UPDATE rubris_batches SET state = ?, total = ?, done = ?, failed = ?, "
                "groups = ?, touched = ?, ended = ? WHERE id = ?",
                (
                    rec.state.value,
                    rec.total,
                    rec.done,
                    rec.failed,
                    rec.groups,
                    rec.touched,
                    rec.ended,
                    rec.id,
                ),
            )

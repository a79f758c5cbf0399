"""``RedisBatchStore``: batches on a Redis server, shared by every worker on every host.

Needs ``redis`` (``rubris-asgi[redis]``) and a standalone Redis server, 5.0 or later (tested
with 7.0): one primary, with replicas if you like, but not Redis Cluster, since the scripts
reach keys they derive from the ones they are passed (a batch's groups and chunks, and in the
sweep every batch it finds), which Cluster forbids. The server must not evict keys
(``maxmemory-policy noeviction``, the default): a lost chunk would be a lost batch.

Every operation that reads and then writes is one Lua script, so it is atomic on the server:
two workers acking items of one batch at the same time never lose a bit, and the ack that
clears the last bit of a sealed batch is the only one that answers ``completed``. Times are
always the caller's (passed in, never the server's ``TIME``), so a fake clock drives expiry
in tests.

Keys, for the prefix ``P`` (default ``rubris:``) and a batch ``ID``; every key of one batch
carries the hash tag ``{ID}``:

- ``P batch:{ID}`` (a hash): the record. Fields ``state`` (open, sealed, complete,
  expired), ``total``, ``done``, ``failed``, ``groups``, ``touched`` (last activity),
  ``ended`` (once complete or expired) and ``no`` (the batch's number in the order batches
  were opened, so that ``sweep`` lists what it expired in the order the memory store does).
- ``P batch:{ID}:g`` (a string): where each group starts, group ``g`` at bytes ``8g`` …
  ``8g+7`` as a little-endian uint64. A group ends where the next starts (the last one at
  ``total``), so one ``GETRANGE`` finds a group's start and size in O(1), at 8 bytes a group.
- ``P batch:{ID}:c:K`` (strings): chunk ``K`` of the pending bits, exactly ``CHUNK_BYTES``
  bytes each, the same bytes as ``bits.py`` makes (``SETBIT`` numbers bits as it does). A
  chunk is made at its full size by one ``SET`` before any bit of it is touched, because
  ``SETBIT`` or ``SETRANGE`` on a missing or shorter string grows it greedily. The chunks go
  when the batch completes or expires.
- ``P batches:open``, ``P batches:sealed`` (sorted sets): live batch ids scored by last
  activity, one set per state since the two expire after different idle times.
  ``P batches:ended``: complete and expired batch ids scored by when they ended, for the
  sweeper to forget them ``config.keep`` later. ``P batches:seq``: the counter behind ``no``.

Scripts (each one ``EVALSHA``):

- ``open``: creates the record (``BatchExists`` when the id is taken).
- ``add``: checks the batch is open and the count within ``config``, appends the group's
  start, makes the new chunks and sets the group's bits (whole bytes with ``SETRANGE``, the
  ragged ends bit by bit).
- ``seal``: open to sealed, or straight to complete when every item already ended.
- ``end``: ack, fail or just check items of one or more batches, in one call whatever their
  number (KEYS: the three sorted sets, then each batch's record). It first locates every
  item (no write until every item proved in range), then clears each bit with ``SETBIT``,
  whose answer (the old bit) says whether this end is the first, adds the count of newly
  ended items to ``done`` or ``failed`` and completes a sealed batch whose items all ended.
- ``sweep``: forgets batches ended before ``now - keep``, and expires live ones idle past
  their expiry, a bounded number per call.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import sys
from array import array
from collections.abc import Sequence
from itertools import chain
from typing import Any, NoReturn

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from ...batches import tracker
from ...batches.bits import CHUNK_BITS, CHUNK_BYTES
from ...batches.ids import ItemRef
from ...batches.store import BatchStore
from ...batches.tracker import BatchStatus, State
from ...errors import BadCount, BatchExists, BatchSealed, ItemOutOfRange, UnknownBatch
from .persistence import Persistence, read_persistence, require_durable
from .pool import MAX_CONNECTIONS, POOL_TIMEOUT, check_pool, connect, startup_error
from .replicas import Replicas

log = logging.getLogger("rubris_asgi.broker")

START_TIMEOUT = 10.0
"""Seconds ``start`` waits for Redis: a host that drops packets would otherwise hold it for the
system's TCP timeout, minutes (the operations wait for as long as Redis takes)."""

_U64_MAX = (1 << 64) - 1
_PAIR = operator.attrgetter("group", "index")
_BATCH = operator.attrgetter("batch")
_SWEEP_LIMIT = 500
"""Batches one sweep script handles per list, so one call never blocks the server long."""

# Lua shared by the scripts. A chunk key is rebuilt from its record key, so the scripts
# never format more than one key per chunk touched.
_PRELUDE = f"""
local CHUNK_BITS = {CHUNK_BITS}
local CHUNK_BYTES = {CHUNK_BYTES}
local call = redis.call
local floor = math.floor

local function drop_chunks(rec, total)
  local n = math.ceil(total / CHUNK_BITS)
  local k = 0
  while k < n do  -- in runs: unpack() is bounded by Lua's C stack
    local stop = math.min(n, k + 1000)
    local keys = {{}}
    for i = k, stop - 1 do keys[#keys + 1] = rec .. ':c:' .. i end
    call('DEL', unpack(keys))
    k = stop
  end
end

local function finish(rec, id, state, total, now, zlive, zended)
  drop_chunks(rec, total)
  call('HSET', rec, 'state', state, 'ended', now)
  call('ZREM', zlive, id)
  call('ZADD', zended, now, id)
end
"""

_OPEN = """
-- KEYS: record, open set, sealed set, ended set, sequence. ARGV: id, now.
local rec, id, now = KEYS[1], ARGV[1], ARGV[2]
if call('EXISTS', rec) == 1 then return 0 end
local no = call('INCR', KEYS[5])
call('HSET', rec, 'state', 'open', 'total', 0, 'done', 0, 'failed', 0, 'groups', 0,
     'touched', now, 'no', no)
call('ZADD', KEYS[2], now, id)
return 1
"""

_ADD = """
-- KEYS: record, open set. ARGV: id, count, now, max items, max groups.
-- Returns the group number, or {why, detail} when refused.
local rec, id, now = KEYS[1], ARGV[1], ARGV[3]
local r = call('HMGET', rec, 'state', 'total', 'groups')
if not r[1] then return {'unknown'} end
if r[1] ~= 'open' then return {'sealed', r[1]} end
local count, total, groups = tonumber(ARGV[2]), tonumber(r[2]), tonumber(r[3])
if count < 1 then return {'count'} end
if total + count > tonumber(ARGV[4]) then return {'items', r[2]} end
if groups >= tonumber(ARGV[5]) then return {'groups', r[3]} end
call('APPEND', rec .. ':g', struct.pack('<I8', total))
local pos, stop = total, total + count
while pos < stop do
  local k = floor(pos / CHUNK_BITS)
  local lo = pos - k * CHUNK_BITS
  local hi = math.min(CHUNK_BITS, lo + stop - pos)
  local key = rec .. ':c:' .. k
  if lo == 0 and hi == CHUNK_BITS then
    call('SET', key, string.rep('\\255', CHUNK_BYTES))
  else
    if lo == 0 then call('SET', key, string.rep('\\0', CHUNK_BYTES)) end
    local b = lo
    while b < hi and b % 8 ~= 0 do
      call('SETBIT', key, b, 1)
      b = b + 1
    end
    local whole = floor((hi - b) / 8)
    if whole > 0 then
      call('SETRANGE', key, b / 8, string.rep('\\255', whole))
      b = b + whole * 8
    end
    while b < hi do
      call('SETBIT', key, b, 1)
      b = b + 1
    end
  end
  pos = pos + hi - lo
end
call('HSET', rec, 'total', stop, 'groups', groups + 1, 'touched', now)
call('ZADD', KEYS[2], now, id)
return groups
"""

_SEAL = """
-- KEYS: record, open set, sealed set, ended set. ARGV: id, now.
-- Returns {state, total, done, failed, completed} or {'unknown'}.
local rec, id, now = KEYS[1], ARGV[1], ARGV[2]
local r = call('HMGET', rec, 'state', 'total', 'done', 'failed')
if not r[1] then return {'unknown'} end
if r[1] ~= 'open' then return {r[1], r[2], r[3], r[4], 0} end
local total = tonumber(r[2])
if tonumber(r[3]) + tonumber(r[4]) == total then
  call('HSET', rec, 'touched', now)
  finish(rec, id, 'complete', total, now, KEYS[2], KEYS[4])
  return {'complete', r[2], r[3], r[4], 1}
end
call('HSET', rec, 'state', 'sealed', 'touched', now)
call('ZREM', KEYS[2], id)
call('ZADD', KEYS[3], now, id)
return {'sealed', r[2], r[3], r[4], 0}
"""

_END = """
-- KEYS: open set, sealed set, ended set, then each batch's record.
-- ARGV: now, mode ('ack', 'fail' or 'check'), then for each batch its id and its items as
-- little-endian uint64 pairs (group, index).
-- Returns one {state, total, done, failed, completed} a batch; {} for a check; or
-- {'error', {{batch, item, why}, ...}}: the first bad item of each batch at fault (both
-- counted from 1), why = -1 unknown batch, -2 no such group, else the group's size.
local now, mode = ARGV[1], ARGV[2]
local unpack_u64 = struct.unpack
local nb = #KEYS - 3
local recs, located, errors = {}, {}, {}
for b = 1, nb do
  local rec = KEYS[b + 3]
  local r = call('HMGET', rec, 'state', 'total', 'done', 'failed', 'groups')
  if not r[1] then
    errors[#errors + 1] = {b, 1, -1}
  else
    local items = ARGV[2 * b + 2]
    local groups, total = tonumber(r[5]), tonumber(r[2])
    local gkey = rec .. ':g'
    local starts, sizes = {}, {}
    local bits = {}
    local pos = 1
    for j = 1, #items / 16 do
      local g, i
      g, i, pos = unpack_u64('<I8I8', items, pos)
      local start = starts[g]
      if not start then
        if g >= groups then
          errors[#errors + 1] = {b, j, -2}
          break
        end
        local raw = call('GETRANGE', gkey, g * 8, g * 8 + 15)
        start = unpack_u64('<I8', raw)
        local stop = total
        if #raw == 16 then stop = unpack_u64('<I8', raw, 9) end
        starts[g], sizes[g] = start, stop - start
      end
      if i >= sizes[g] then
        errors[#errors + 1] = {b, j, sizes[g]}
        break
      end
      bits[j] = start + i
    end
    recs[b], located[b] = r, bits
  end
end
if #errors > 0 then return {'error', errors} end
if mode == 'check' then return {} end

local out = {}
for b = 1, nb do
  local r = recs[b]
  local state = r[1]
  local total, done, failed = tonumber(r[2]), tonumber(r[3]), tonumber(r[4])
  local completed = 0
  if state == 'open' or state == 'sealed' then
    local rec = KEYS[b + 3]
    local prefix = rec .. ':c:'
    local keys = {}
    local bits = located[b]
    local n = 0
    for j = 1, #bits do
      local x = bits[j]
      local k = floor(x / CHUNK_BITS)
      local key = keys[k]
      if not key then
        key = prefix .. k
        keys[k] = key
      end
      n = n + call('SETBIT', key, x - k * CHUNK_BITS, 0)
    end
    if n > 0 then
      if mode == 'fail' then failed = failed + n else done = done + n end
      local id = ARGV[2 * b + 1]
      local zlive = KEYS[2]
      if state == 'open' then zlive = KEYS[1] end
      call('HSET', rec, 'done', done, 'failed', failed, 'touched', now)
      if state == 'sealed' and done + failed == total then
        finish(rec, id, 'complete', total, now, zlive, KEYS[3])
        state, completed = 'complete', 1
      else
        call('ZADD', zlive, now, id)
      end
    end
  end
  out[b] = {state, total, done, failed, completed}
end
return out
"""

_SWEEP = """
-- KEYS: open set, sealed set, ended set.
-- ARGV: record key up to the id ('P batch:{'), now, open cutoff, sealed cutoff, forget
-- before, limit. Returns {more, {{id, no, total, done, failed}, ...}}: more = 1 when a
-- list filled the limit, so there may be more to do.
local pre, now, limit = ARGV[1], ARGV[2], tonumber(ARGV[6])
local more = 0
local gone = call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[5], 'LIMIT', 0, limit)
if #gone > 0 then
  for _, id in ipairs(gone) do
    local rec = pre .. id .. '}'
    call('DEL', rec, rec .. ':g')
  end
  call('ZREM', KEYS[3], unpack(gone))
  if #gone == limit then more = 1 end
end
local expired = {}
for z = 1, 2 do
  local ids = call('ZRANGEBYSCORE', KEYS[z], '-inf', '(' .. ARGV[z + 2], 'LIMIT', 0, limit)
  for _, id in ipairs(ids) do
    local rec = pre .. id .. '}'
    local r = call('HMGET', rec, 'total', 'done', 'failed', 'no')
    if r[1] then
      finish(rec, id, 'expired', tonumber(r[1]), now, KEYS[z], KEYS[3])
      expired[#expired + 1] = {id, r[4], r[1], r[2], r[3]}
    else
      call('ZREM', KEYS[z], id)
    end
  end
  if #ids == limit then more = 1 end
end
return {more, expired}
"""


def _text(value: bytes | str) -> str:
    """A reply as text, whether the client decodes responses or not."""
    return value.decode() if isinstance(value, bytes) else value


def _num(value: float) -> str:
    """A time or score as Redis reads it back to the same double (repr round-trips)."""
    return repr(float(value))


def _status(row: Sequence[Any]) -> BatchStatus:
    state, total, done, failed, completed = row
    return BatchStatus(State(_text(state)), int(total), int(done), int(failed), bool(completed))


def _pack(refs: Sequence[ItemRef]) -> bytes:
    """The refs' (group, index) as little-endian uint64s, as the end script reads them."""
    try:
        numbers = array("Q", chain.from_iterable(map(_PAIR, refs)))
    except OverflowError:
        # A number no uint64 holds is in no group: the sentinel is past every group and size,
        # so the script names the item out of range like any other.
        numbers = array(
            "Q",
            [n if 0 <= n <= _U64_MAX else _U64_MAX for ref in refs for n in (ref.group, ref.index)],
        )
    if sys.byteorder == "big":
        numbers.byteswap()
    return numbers.tobytes()


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisBatchStore(BatchStore):
    """Batches on the Redis server at ``url`` (or through ``client``), under ``prefix``.

    A ``client`` passed in is the caller's to close; one made from ``url`` is closed by
    ``close()``. Its responses may be decoded or not.

    One made from ``url`` opens at most ``max_connections`` connections to Redis; an operation
    waits for a free one, at most ``pool_timeout`` seconds (then ``PoolBusy``, a
    ``BrokerUnavailable`` naming the local limit). A batch lost by Redis would never complete,
    so a Redis without ``appendonly yes`` (or whose settings cannot be read) is refused with
    ``RedisNotDurable``: at ``start`` (at the first batch opened when ``check_at_start`` is
    off, as for the store a ``RedisBroker`` makes for every app), unless ``allow_volatile``,
    which logs a WARNING instead.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "rubris:",
        client: aioredis.Redis | None = None,
        max_connections: int = MAX_CONNECTIONS,
        pool_timeout: float = POOL_TIMEOUT,
        allow_volatile: bool = False,
        check_at_start: bool = True,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
    ) -> None:
        check_pool(max_connections, pool_timeout)
        self.url = url
        self.prefix = prefix
        self.max_connections = max_connections
        self.pool_timeout = pool_timeout
        self.allow_volatile = allow_volatile
        self.check_at_start = check_at_start
        self.replicas = Replicas(wait_replicas, wait_timeout, f"{prefix}wait")
        """Replicas that confirm every write of a batch before it counts (replicas.py)."""
        self.persistence: Persistence | None = None
        """What Redis said of its persistence at start."""
        self._warned: set[str] = set()
        self._client = client
        self._owns_client = False
        self._scripts: dict[str, AsyncScript] = {}
        self._open_key = f"{prefix}batches:open"
        self._sealed_key = f"{prefix}batches:sealed"
        self._ended_key = f"{prefix}batches:ended"
        self._seq_key = f"{prefix}batches:seq"
        self._sets = [self._open_key, self._sealed_key, self._ended_key]

    def _record_key(self, batch: str) -> str:
        return f"{self.prefix}batch:{{{batch}}}"

    # the connection

    async def start(self) -> None:
        """Connect, read Redis's persistence (``RedisNotDurable`` here with ``check_at_start``)
        and load the scripts. A Redis out of reach or refusing raises ``BrokerStartupError``,
        one line that says what to do (its cause at DEBUG); nothing is left open."""
        try:
            await asyncio.wait_for(self._open(), START_TIMEOUT)
        except BaseException as exc:
            owned = self._owns_client
            self.persistence = None  # read again, and checked again, by the next start
            await self.close()
            failure = startup_error(self.url, exc, START_TIMEOUT) if owned else None
            if failure is None:  # RedisNotDurable, a bug, or the caller's client: as it is
                raise
            log.debug("%s", failure, exc_info=exc)
            raise failure from None

    async def _open(self) -> None:
        """``start`` without its one-line errors: what the operations call when the store was
        not started, whose callers handle what a lost Redis raises."""
        if self._client is None:
            self._client = connect(self.url, self.max_connections, self.pool_timeout)
            self._owns_client = True
        if self.persistence is None:
            self.persistence = await read_persistence(self._client)
            if self.check_at_start:
                self._durable()
        if not self._scripts:
            client = self._client
            sources = {"open": _OPEN, "add": _ADD, "seal": _SEAL, "end": _END, "sweep": _SWEEP}
            scripts = {
                name: client.register_script(_PRELUDE + src) for name, src in sources.items()
            }
            # loaded now so a Lua mistake shows at start-up, and the first call needs no retry
            for script in scripts.values():
                await client.script_load(script.script)
            self._scripts = scripts

    async def close(self) -> None:
        self._scripts = {}
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            self._owns_client = False
            await client.aclose()

    def _durable(self) -> None:
        assert self.persistence is not None
        url = self.url if self._owns_client else None
        require_durable(self.persistence, "batches", self.allow_volatile, url, self._warned)

    async def _script(self, name: str) -> AsyncScript:
        if not self._scripts:
            await self._open()
        return self._scripts[name]

    async def _write(self, name: str, *, keys: list[Any], args: list[Any]) -> Any:
        """The script ``name``, a write: confirmed by ``wait_replicas`` replicas (replicas.py)
        before its answer counts."""
        script = await self._script(name)
        return await self.replicas.run(await self._redis(), script, keys=keys, args=args)

    async def _redis(self) -> aioredis.Redis:
        if self._client is None:
            await self._open()
        assert self._client is not None
        return self._client

    # the operations

    async def open(self, batch: str, now: float) -> BatchStatus:
        if not self.check_at_start:
            await self._redis()
            self._durable()  # the first batch: refused, or warned about once
        created = await self._write(
            "open",
            keys=[self._record_key(batch), *self._sets, self._seq_key],
            args=[batch, _num(now)],
        )
        if not created:
            raise BatchExists(f"batch {batch} exists already")
        return BatchStatus(State.OPEN, 0, 0, 0)

    async def add(self, batch: str, count: int, now: float) -> int:
        limits = self.config
        reply = await self._write(
            "add",
            keys=[self._record_key(batch), self._open_key],
            args=[batch, count, _num(now), limits.max_items, limits.max_groups],
        )
        if isinstance(reply, int):
            return reply
        why = _text(reply[0])
        if why == "unknown":
            raise UnknownBatch(f"unknown batch {batch!r}")
        if why == "sealed":
            state = _text(reply[1])
            raise BatchSealed(f"batch {batch} is {state}: no items can be added")
        if why == "count":
            raise BadCount(f"count must be at least 1, got {count}")
        if why == "items":
            raise BadCount(
                f"batch {batch} would hold {int(reply[1]) + count} items, over the maximum of "
                f"{limits.max_items}"
            )
        raise BadCount(f"batch {batch} has {int(reply[1])} groups, the maximum")

    async def seal(self, batch: str, now: float) -> BatchStatus:
        reply = await self._write(
            "seal", keys=[self._record_key(batch), *self._sets], args=[batch, _num(now)]
        )
        if len(reply) == 1:
            raise UnknownBatch(f"unknown batch {batch!r}")
        return _status(reply)

    async def end(
        self, items: Sequence[ItemRef], now: float, *, failed: bool = False
    ) -> dict[str, BatchStatus]:
        if not items:
            return {}
        batches, reply = await self._end(items, now, "fail" if failed else "ack")
        return {batch: _status(row) for batch, row in zip(batches, reply, strict=True)}

    async def check(self, items: Sequence[ItemRef]) -> None:
        if items:
            await self._end(items, 0.0, "check")

    async def _end(
        self, items: Sequence[ItemRef], now: float, mode: str
    ) -> tuple[list[str], list[Any]]:
        """Run the end script over ``items``; raises for the first item at fault."""
        batches = list(dict.fromkeys(map(_BATCH, items)))
        keys = list(self._sets)
        args: list[str | bytes] = [_num(now), mode]
        if len(batches) == 1:  # the common case: no regrouping
            keys.append(self._record_key(batches[0]))
            args += (batches[0], _pack(items))
        else:
            per: dict[str, list[ItemRef]] = {batch: [] for batch in batches}
            for ref in items:
                per[ref.batch].append(ref)
            for batch, refs in per.items():
                keys.append(self._record_key(batch))
                args += (batch, _pack(refs))
        if mode == "check":  # reads only
            reply: list[Any] = await (await self._script("end"))(keys=keys, args=args)
        else:
            reply = await self._write("end", keys=keys, args=args)
        if reply and not isinstance(reply[0], list):
            _raise_first(items, batches, reply[1])
        return batches, reply

    async def status(self, batch: str) -> BatchStatus:
        client = await self._redis()
        state, total, done, failed = await client.hmget(
            self._record_key(batch), ["state", "total", "done", "failed"]
        )
        if state is None or total is None or done is None or failed is None:
            raise UnknownBatch(f"unknown batch {batch!r}")
        return BatchStatus(State(_text(state)), int(total), int(done), int(failed))

    async def sweep(self, now: float) -> list[tuple[str, BatchStatus]]:
        config = self.config
        script = await self._script("sweep")
        args: list[str | int] = [
            f"{self.prefix}batch:{{",  # a record's key up to its id
            _num(now),
            _num(tracker.idle_cutoff(State.OPEN, now, config)),
            _num(tracker.idle_cutoff(State.SEALED, now, config)),
            _num(now - config.keep),
            _SWEEP_LIMIT,
        ]
        rows: list[Any] = []
        more = 1
        while more:
            more, got = await script(keys=self._sets, args=args)
            rows += got
        # the memory store lists batches in the order they were opened
        rows.sort(key=lambda row: int(row[1]))
        return [
            (_text(batch), BatchStatus(State.EXPIRED, int(total), int(done), int(failed)))
            for batch, _, total, done, failed in rows
        ]

    async def footprint(self) -> int:
        client = await self._redis()
        keys = [key async for key in client.scan_iter(match=_glob_escape(self.prefix) + "*")]
        total = 0
        for start in range(0, len(keys), 1000):
            async with client.pipeline(transaction=False) as pipe:
                for key in keys[start : start + 1000]:
                    pipe.execute_command("MEMORY", "USAGE", key, "SAMPLES", 0)
                sizes: list[int | None] = await pipe.execute()
            total += sum(size for size in sizes if size is not None)
        return total


def _raise_first(items: Sequence[ItemRef], batches: list[str], errors: list[Any]) -> NoReturn:
    """Raise for the earliest item of ``items`` among the end script's ``errors`` (the
    first bad item of each batch at fault), as ``tracker.locate`` would have."""
    bad = {batches[int(b) - 1]: (int(j), int(why)) for b, j, why in errors}
    seen: dict[str, int] = {}
    for ref in items:
        got = bad.get(ref.batch)
        if got is None:
            continue
        n = seen[ref.batch] = seen.get(ref.batch, 0) + 1
        if n == got[0]:
            if got[1] == -1:
                raise UnknownBatch(f"unknown batch {ref.batch!r} (item {ref})", str(ref))
            why = "no such group" if got[1] == -2 else f"the group has {got[1]} items"
            raise ItemOutOfRange(f"item {ref} is not in batch {ref.batch} ({why})", str(ref))
    raise AssertionError(f"the end script named no item of the request: {errors!r}")

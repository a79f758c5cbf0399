"""The Lua scripts of keyed topics (live tables) in Redis: ``RedisTables`` (tables.py) runs them,
and the presence scripts (presence_lua.py) use their functions.

Keys, for the prefix ``P`` (default ``rubris:``) and a keyed topic ``NAME``:

- ``P t:NAME`` (a hash): ``e`` the topic's epoch, ``s`` its head (the latest change's seq),
  ``f`` the seq of the latest tombstone forgotten (*forgotten*), ``n`` its live keys.
- ``P kv:NAME`` (a hash): each key's latest change, its *record* (a tombstone once deleted).
- ``P kl:NAME`` (a sorted set): each key scored by the seq of its latest change: what a node
  that holds the table up to seq ``s`` reads to catch up (``ZRANGEBYSCORE (s +inf``); one line
  per key, so a read is bounded by the table however many changes it missed.
- ``P kd:NAME`` (a sorted set): the tombstones, scored by when they were made (Redis's clock):
  forgotten past the tombstone window (``Timing.tombstones``) and beyond ``max_keys`` of them,
  which raises ``f``.
- ``P c:NAME``: the channel every change goes out on, ``epoch:keylen:key`` then its record.
- ``P kb:BATCH``: the answer to one batch of changes, for a minute: a batch sent again after a
  lost connection (did it run?) is answered from its first run, never numbered twice.

A *record* is ``seq:prev:op:flag:plen:pflag:`` then the PATCH payload (``plen`` bytes) and
the SET payload: ``prev`` the seq of the key's change before (what the PATCH applies to), ``op``
1 (SET) or 3 (DELETE), the flags 1 when a payload is deflated. Every key of a keyed topic
expires ``ttl`` ms after its last change, follow or refresh, as a ring's does (broker_lua.py):
a table nobody uses or follows for that long starts again, empty, under a new epoch.
"""

from __future__ import annotations

NOW = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

KEYED = """
local function knum(h, field) return tonumber(redis.call('HGET', h, field) or '0') end

-- the meta hash of a keyed topic and its epoch; made under epoch0 if Redis does not know it
local function kmeta(P, name, epoch0)
  local h = P .. 't:' .. name
  local e = redis.call('HGET', h, 'e')
  if not e then
    e = epoch0
    redis.call('HSET', h, 'e', e, 's', 0, 'f', 0, 'n', 0)
  end
  return h, e
end

local function ktouch(P, name, ttl)
  for _, k in ipairs({'t:', 'kv:', 'kl:', 'kd:'}) do redis.call('PEXPIRE', P .. k .. name, ttl) end
end

-- a record's seq, op, and SET payload (flag, bytes)
local function kread(rec)
  local seq, op, flag, plen, pos = string.match(rec, '^(%d+):%d+:(%d):(%d):(%d+):%d:()')
  return tonumber(seq), op, flag, string.sub(rec, pos + tonumber(plen))
end

local function kput(P, name, h, e, key, cur, op, flag, data, pflag, patch)
  local seq = redis.call('HINCRBY', h, 's', 1)
  local rec = seq .. ':' .. cur .. ':' .. op .. ':' .. flag .. ':' .. #patch .. ':' .. pflag
    .. ':' .. patch .. data
  redis.call('HSET', P .. 'kv:' .. name, key, rec)
  redis.call('ZADD', P .. 'kl:' .. name, seq, key)
  redis.call('PUBLISH', P .. 'c:' .. name, e .. ':' .. #key .. ':' .. key .. rec)
  return seq
end

-- set key: the change's seq; the key's seq when it holds that value already (nothing
-- changes); -1 for a new key past max. The PATCH is kept only if it was made from the key's
-- latest change (prev, in the epoch known): a node's copy may be behind
local function kset(P, name, h, e, key, flag, data, pflag, patch, prev, known, max)
  local rec = redis.call('HGET', P .. 'kv:' .. name, key)
  local cur, live = 0, false
  if rec then
    local s, op, f, d = kread(rec)
    cur = s
    if op == '1' then
      if f == flag and d == data then return cur end
      live = true
    end
  end
  if not live then
    if knum(h, 'n') >= max then return -1 end
    redis.call('HINCRBY', h, 'n', 1)
    if rec then redis.call('ZREM', P .. 'kd:' .. name, key) end
  end
  if not live or cur ~= prev or e ~= known then patch, pflag = '', '0' end
  return kput(P, name, h, e, key, cur, '1', flag, data, pflag, patch)
end

-- delete key: the change's seq, 0 when it is not held
local function kdel(P, name, h, e, key, now)
  local rec = redis.call('HGET', P .. 'kv:' .. name, key)
  if not rec then return 0 end
  local cur, op = kread(rec)
  if op ~= '1' then return 0 end
  redis.call('HINCRBY', h, 'n', -1)
  redis.call('ZADD', P .. 'kd:' .. name, now, key)
  return kput(P, name, h, e, key, cur, '3', '0', '', '0', '')
end

-- forget the tombstones made before now - window and the oldest beyond max of them, at
-- most 1,000 a call (the rest at the next): a reader behind one forgotten reads it all again
local function ksweep(P, name, h, now, window, max)
  local kd = P .. 'kd:' .. name
  local total = redis.call('ZCARD', kd)
  if total == 0 then return end
  local drop = redis.call('ZCOUNT', kd, '-inf', '(' .. (now - window))
  if total - drop > max then drop = total - max end
  if drop <= 0 then return end
  if drop > 1000 then drop = 1000 end
  local kv, kl = P .. 'kv:' .. name, P .. 'kl:' .. name
  local f = knum(h, 'f')
  for _, key in ipairs(redis.call('ZRANGE', kd, 0, drop - 1)) do
    local rec = redis.call('HGET', kv, key)
    if rec then
      local seq, op = kread(rec)
      if op == '3' then
        redis.call('HDEL', kv, key)
        redis.call('ZREM', kl, key)
        if seq > f then f = seq end
      end
    end
  end
  redis.call('ZREMRANGEBYRANK', kd, 0, drop - 1)
  redis.call('HSET', h, 'f', f)
end
"""
"""The functions every script of a keyed topic shares (``now`` from ``NOW`` where needed)."""

CHANGE = (
    NOW
    + KEYED
    + """
local P, ttl, epoch0, window = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[5])
local done = P .. 'kb:' .. ARGV[4]
local cached = redis.call('GET', done)
if cached then return cjson.decode(cached) end
local out, kept, stale, made = {}, {}, {}, {}
local i = 6
while i <= #ARGV do
  local name, max, known, n = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], tonumber(ARGV[i + 3])
  i = i + 4
  local h, e = kmeta(P, name, epoch0)
  ksweep(P, name, h, now, window, max)
  for _ = 1, n do
    local op, key, prev = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
    local flag, data, pflag, patch = ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6]
    i = i + 7
    local a
    if op == 'R' then
      -- the whole table: prev sets follow; every other key is deleted first
      local m = prev
      if stale[name] then
        a = -3
      else
        local keep = {}
        for k = 0, m - 1 do keep[ARGV[i + 7 * k + 1]] = true end
        for _, k in ipairs(redis.call('ZRANGE', P .. 'kl:' .. name, 0, -1)) do
          if not keep[k] then
            kdel(P, name, h, e, k, now)
            made[name .. '\0' .. k] = true
          end
        end
        for k = 0, m - 1 do
          local j = i + 7 * k
          local r = kset(P, name, h, e, ARGV[j + 1], ARGV[j + 3], ARGV[j + 4], ARGV[j + 5],
            ARGV[j + 6], tonumber(ARGV[j + 2]), known, max)
          made[name .. '\0' .. ARGV[j + 1]] = r >= 0
        end
        a = knum(h, 's')
      end
      i = i + 7 * m
    elseif stale[name] then
      a = -3  -- after a merge sent back: the node sends it again, after that one
    elseif op == 'S' then
      a = kset(P, name, h, e, key, flag, data, pflag, patch, prev, known, max)
    elseif op == 'D' then
      a = kdel(P, name, h, e, key, now)
    else
      -- a merge, made on the key's change prev: taken only if that is still the latest,
      -- else answered with the latest (epoch:record, or epoch: for none) to merge on again.
      -- prev -1: made on the value of the key's change before it in this batch, right if
      -- that one was made
      local rec = redis.call('HGET', P .. 'kv:' .. name, key)
      local cur = 0
      if rec then cur = kread(rec) end
      local base = known
      if prev == -1 then
        prev, base = -2, e
        if made[name .. '\0' .. key] then prev = cur end
      end
      if cur ~= prev or e ~= base then
        stale[name] = true
        a = e .. ':' .. (rec or '')
      else
        a = kset(P, name, h, e, key, flag, data, pflag, patch, prev, base, max)
      end
    end
    if op ~= 'R' then made[name .. '\0' .. key] = type(a) == 'number' and a >= 0 end
    out[#out + 1] = a
    if type(a) == 'string' then kept[#kept + 1] = -2 else kept[#kept + 1] = a end
  end
  ktouch(P, name, ttl)
end
redis.call('SET', done, cjson.encode(kept), 'PX', 60000)
return out
"""
)
"""ARGV: prefix, ttl ms, the epoch for a topic Redis does not know, the batch's id, the
tombstone window ms, then per run of changes of one topic: its name, ``max_keys``, the epoch
the node knows it by, the run's length n, then n changes of 7 fields each: op (``S`` set, ``M``
merge, ``D`` delete, ``R`` replace), key, prev (a replace: how many sets follow it, outside the
run's n), SET flag, SET payload, PATCH flag, PATCH payload. Answers per change (a replace's
sets not counted): its seq; for a set of the value held, the key's seq; 0 for a delete of a
key not held; -1 past ``max_keys`` (nothing changed); for a merge whose base is no longer the
key's latest change, ``epoch:record`` of the latest (-2 from a batch sent again), and -3 for
every later change of that topic in the batch (not run: sent again after the merge). A merge's
prev -1: made on the value of the key's previous change in this batch (a node's merges of one
key go in one call), taken if that change was made."""

READ = (
    KEYED
    + """
local P, ttl, epoch0 = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local name, known, head = ARGV[4], ARGV[5], tonumber(ARGV[6])
local after, full = tonumber(ARGV[7]), ARGV[8]
local limit, bytes = tonumber(ARGV[9]), tonumber(ARGV[10])
local h, e = kmeta(P, name, epoch0)
local seq = knum(h, 's')
if e == known and seq < head then
  -- behind what the caller heard of it: Redis lost changes it had numbered (a failover to a
  -- replica that had not received them); numbering on would give their seqs to others, so
  -- the topic goes on under a new epoch, its table kept (every reader then reads it whole)
  e = epoch0
  redis.call('HSET', h, 'e', e)
end
local f = knum(h, 'f')
if full ~= '1' and (e ~= known or f > after) then
  full = '1'
  after = 0
end
ktouch(P, name, ttl)
local kl = P .. 'kl:' .. name
local keys = redis.call('ZRANGEBYSCORE', kl, '(' .. after, '+inf', 'LIMIT', 0, limit)
local out = {e, seq, f, tonumber(full), 0}
if #keys == limit then out[5] = 1 end
local kv = P .. 'kv:' .. name
local size = 0
for k, key in ipairs(keys) do
  local rec = redis.call('HGET', kv, key)
  if rec then
    out[#out + 1] = key
    out[#out + 1] = rec
    size = size + #rec
    if size >= bytes and k < #keys then
      out[5] = 1
      break
    end
  end
end
return out
"""
)
"""ARGV: prefix, ttl ms, the epoch for a topic Redis does not know, name, the epoch the caller
knows, the head it holds (0: not checked), the seq to read after, '1' to read the whole table
(else it is read whole anyway when the epoch differs or a delete after ``after`` was
forgotten), at most how many changes and about how many bytes. Answers ``{epoch, head,
forgotten, whole (1/0), more (1/0), key, record, ...}``: each key whose latest change is after
``after`` (all of them, read whole), in seq order, a page at most; ``more``: read on after the
last one."""

RENUMBER = """
local h = ARGV[1] .. 't:' .. ARGV[2]
local e = redis.call('HGET', h, 'e')
if e == ARGV[3] then
  e = ARGV[4]
  redis.call('HSET', h, 'e', e)
end
return e or ''
"""
"""ARGV: prefix, name, the epoch a node found renumbered, a new epoch. A node heard a change
under a seq it holds with another change there: Redis lost what it had numbered and numbered
new changes the same. Unless another node did already, the topic goes on under the new epoch,
its table kept. Answers the topic's epoch now ('' if Redis no longer knows it)."""

"""The Lua scripts of ``RedisQueues``: work-queue topics kept in Redis, run atomically there.

Keys, for the prefix ``P`` (default ``rubris:``), a queue topic ``NAME`` and a node ``NODE``:

- ``P q:NAME`` (a list): the items waiting, in *runs* (below), the next to be delivered first.
- ``P ql:NAME``: how many items the list holds (its runs hold one or many each).
- ``P qh:NAME:NODE`` (a hash): the items NODE took (its *custody*: waiting there for a
  consumer's free prefetch, or delivered and not yet ended), as *pieces*: field ``TAKE.J`` is
  the J-th run (or part of a run) that NODE's take ``TAKE`` moved there, and ``TAKE.J!`` its
  *marks*: which of its items have ended (ACKed, given back, dead-lettered or dropped). A piece
  leaves the custody, marks and all, when its last item ends.
- ``P qn:NODE`` (a set): the queues NODE holds items of.
- ``P qi:NAME`` (a sorted set): item ids enqueued within the dedup window, scored by time.
- ``P nodes`` (a sorted set): every live node, scored by its last heartbeat (Redis's clock);
  ``P beat``: the time of the latest heartbeat of any node.
- ``P qy:NODE:CALL``: for a minute, what one ``CYCLE`` call of NODE answered (its duplicates,
  withdrawals, and how many pieces each take moved): sent again after a lost connection, the
  call is answered from its first run and does nothing twice.
- ``P qv:NAME``: the version of the queue's length, one more at each change told.
- ``P qc:NAME``: the pub/sub channel that tells every node the queue's new length, as
  ``length:version``: a node keeps the newest version it heard, whichever way and in whatever
  order the news came (answers and channel messages race).

An item *record* is ``failures:attempt:key:flag:[id,batch_item]\\npayload`` (``flag`` 1 when
the payload is deflated): the counts first, so that a script can count one more failure. A new
item's key is empty; an item given back gets one no other waiting item has (what a withdrawal
finds it by). A *run* is one or more records in one string, so that a batch of items is one
list element, one hash field and one string in an answer, whatever its length: ``>HI4``
(count, base), 10 bytes of *origin* the scripts never read (the node that made the run marks
it there: ``RedisQueues._took`` may find the items of its own runs in hand), ``count``
``>I4`` ends, then the records back to back; record J is the bytes from end J-1 (the base for
the first) to end J, counted from the base. A run cut in two keeps its origin and its ends:
the second part's base is where the first part ended, so a cut copies no end. *Marks* are
``>HH`` (items, ended) then one bit per item (item J is bit (J-1) % 8 of byte (J-1) // 8):
setting a bit already set changes nothing, so a mark sent twice ends no other item. Times are
Redis's own (``TIME``), so the hosts' clocks never matter.

What the code before runs left in a Redis (nodes stopped, upgraded, started again) is read as
it is: a list element or a custody field that is a record (its first byte a digit) is a run of
one, and a queue without ``P ql:NAME`` is counted from its list's length when a script first
changes it (the heartbeat's length check reads that length meanwhile). Nodes of both kinds
must not share a Redis at once: the older ones do not read runs.
"""

from __future__ import annotations

_NOW = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_COUNT = """
local function counted(P, name)
  -- the queue's count of items, made from its list's length if it has none: a list written
  -- before runs and counts (one record an element), or none at all
  local l = P .. 'ql:' .. name
  if redis.call('EXISTS', l) == 0 then
    redis.call('SET', l, redis.call('LLEN', P .. 'q:' .. name))
  end
end
"""

_TELL = """
local function tell(P, touched, out)
  for name, _ in pairs(touched) do
    local len = redis.call('GET', P .. 'ql:' .. name) or '0'
    len = len .. ':' .. redis.call('INCR', P .. 'qv:' .. name)
    redis.call('PUBLISH', P .. 'qc:' .. name, len)
    out[#out + 1] = name
    out[#out + 1] = len
  end
end
"""

_PUSH = """
local function push(cmd, key, list)
  -- the values of list as those of one command (unpack is bounded by Lua's stack: slices of
  -- 1,000, which keep HSET's pairs whole)
  local from = 1
  while from <= #list do
    local last = math.min(from + 999, #list)
    redis.call(cmd, key, unpack(list, from, last))
    from = last + 1
  end
end
"""

_RUNS = """
-- a run's head: count, base, then its origin (10 bytes: who made it, for that node alone)
local HEAD = 16
local NO_ORIGIN = string.rep('\0', 10)

local function one(r)
  return struct.pack('>HI4', 1, 0) .. NO_ORIGIN .. struct.pack('>I4', #r) .. r
end

local function as_run(v)
  -- a list element or a custody piece as a run: one written before runs is a record (its
  -- first byte a digit, where a run's count, at most a few thousand, puts 0 to 15)
  if string.byte(v, 1) >= 48 then return one(v) end
  return v
end

local function records(run)
  local count, base = struct.unpack('>HI4', run)
  local data, start, out = HEAD + 1 + 4 * count, base, {}
  for j = 1, count do
    local e = struct.unpack('>I4', run, HEAD - 3 + 4 * j)
    out[j] = string.sub(run, data + start - base, data + e - base - 1)
    start = e
  end
  return out
end

local function cut(run, k)
  -- the first k records of run (k below its count) and the rest, each a run of the same
  -- origin
  local count, base = struct.unpack('>HI4', run)
  local data = HEAD + 1 + 4 * count
  local e = struct.unpack('>I4', run, HEAD - 3 + 4 * k)
  local origin = string.sub(run, 7, HEAD)
  local first = struct.pack('>HI4', k, base) .. origin
    .. string.sub(run, HEAD + 1, HEAD + 4 * k) .. string.sub(run, data, data + e - base - 1)
  local rest = struct.pack('>HI4', count - k, e) .. origin
    .. string.sub(run, HEAD + 1 + 4 * k, HEAD + 4 * count) .. string.sub(run, data + e - base)
  return first, rest
end

local function added(P, name, n)
  if n ~= 0 then redis.call('INCRBY', P .. 'ql:' .. name, n) end
end

local NIBBLE = {0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4}

local function mark(held, f, bits)
  -- sets the bits of piece f's marks that bits sets (one byte a string character); answers
  -- how many were not set before (0 for a piece no longer held); the piece leaves the
  -- custody when every item has ended
  local m = redis.call('HGET', held, f .. '!')
  if not m then return 0 end
  local count, ended = struct.unpack('>HH', m)
  local old = {string.byte(m, 5, -1)}
  for k = #old + 1, #bits do old[k] = 0 end
  local new = 0
  for k = 1, #bits do
    local n = string.byte(bits, k)
    if n ~= 0 then
      local o = old[k]
      local add = bit.band(n, 255 - o)
      if add ~= 0 then
        new = new + NIBBLE[bit.band(add, 15) + 1] + NIBBLE[bit.rshift(add, 4) + 1]
        old[k] = bit.bor(o, add)
      end
    end
  end
  if new == 0 then return 0 end
  ended = ended + new
  if ended >= count then
    redis.call('HDEL', held, f, f .. '!')
  else
    local parts, from = {}, 1
    while from <= #old do
      local last = math.min(from + 999, #old)
      parts[#parts + 1] = string.char(unpack(old, from, last))
      from = last + 1
    end
    redis.call('HSET', held, f .. '!', struct.pack('>HH', count, ended) .. table.concat(parts))
  end
  return new
end

local function bit_of(j)
  -- the marks that set item j alone
  return string.rep('\\0', math.floor((j - 1) / 8)) .. string.char(2 ^ ((j - 1) % 8))
end

local function piece_order(a, b)
  local ta, ja = string.match(a, '^(%d+)%.(%d+)$')
  local tb, jb = string.match(b, '^(%d+)%.(%d+)$')
  if not ta or not tb then return a < b end
  if ta ~= tb then return tonumber(ta) < tonumber(tb) end
  return tonumber(ja) < tonumber(jb)
end

local function unended(held, keep, bump)
  -- the records of the pieces in held that keep(field) accepts and that have not ended, in
  -- the order they were taken (one more failure and delivery each when bump); those pieces
  -- leave held
  local all = redis.call('HGETALL', held)
  local runs, marks, fields = {}, {}, {}
  for j = 1, #all, 2 do
    local f = all[j]
    if string.sub(f, -1) == '!' then
      marks[string.sub(f, 1, -2)] = all[j + 1]
    elseif keep(f) then
      runs[f] = as_run(all[j + 1])  -- an item's record, held before runs: a piece of one
      fields[#fields + 1] = f
    end
  end
  table.sort(fields, piece_order)
  local out = {}
  for _, f in ipairs(fields) do
    local m = marks[f] or ''
    for j, r in ipairs(records(runs[f])) do
      local byte = string.byte(m, 4 + math.ceil(j / 8)) or 0
      if bit.band(byte, 2 ^ ((j - 1) % 8)) == 0 then
        if bump then
          local fl, a, rest = string.match(r, '^(%d+):(%d+)(:.*)$')
          r = (tonumber(fl) + 1) .. ':' .. (tonumber(a) + 1) .. rest
        end
        out[#out + 1] = one(r)
      end
    end
    redis.call('HDEL', held, f, f .. '!')
  end
  for f, _ in pairs(marks) do
    if not runs[f] and keep(f) and redis.call('HEXISTS', held, f) == 0 then
      redis.call('HDEL', held, f .. '!')  -- marks whose piece is gone
    end
  end
  return out
end

local function to_head(P, name, runs)
  -- runs (of one record each) to the head of the queue, the first of them first
  if #runs == 0 then return end
  local back = {}
  for j = #runs, 1, -1 do back[#back + 1] = runs[j] end
  push('LPUSH', P .. 'q:' .. name, back)
  added(P, name, #runs)
end
"""

CYCLE = (
    _NOW
    + _COUNT
    + _TELL
    + _PUSH
    + _RUNS
    + """
local P, node, call = ARGV[1], ARGV[2], ARGV[3]
local done = P .. 'qy:' .. node .. ':' .. call
local i = 4
local nacks = tonumber(ARGV[i])
i = i + 1 + 3 * nacks
local nmoves = tonumber(ARGV[i])
local moves = i + 1
i = moves + 7 * nmoves
local nruns = tonumber(ARGV[i])
local runs = i + 1
i = runs
for _ = 1, nruns do i = i + 6 + 2 * tonumber(ARGV[i + 4]) end
local naudits = tonumber(ARGV[i])
local audits = i + 1
i = audits
for _ = 1, naudits do i = i + 2 + tonumber(ARGV[i + 1]) end
local ntakes = tonumber(ARGV[i])
local takes = i + 1

local out, touched = {}, {}
local before = redis.call('GET', done)
local first = {}
local got = {}
if before then
  first = cjson.decode(before)
  for t = 1, ntakes do
    -- sent again: what the first run took and this node still holds
    local j = takes + 4 * (t - 1)
    local held = P .. 'qh:' .. ARGV[j + 1] .. ':' .. node
    got[t] = {}
    for k = 1, (first.t[t] or 0) do
      local run = redis.call('HGET', held, ARGV[j] .. '.' .. k)
      if run then
        got[t][#got[t] + 1] = k
        got[t][#got[t] + 1] = run
      end
    end
  end
else
  -- ACKs and drops: marks, a piece at a time
  for j = 5, 4 + 3 * nacks, 3 do
    mark(P .. 'qh:' .. ARGV[j] .. ':' .. node, ARGV[j + 1], ARGV[j + 2])
  end
  -- give-backs, dead letters, withdrawals: in order (a withdrawal follows its give-back)
  local withdrawn = {}
  for j = moves, moves + 7 * (nmoves - 1), 7 do
    local name, f, at, dest, how = ARGV[j], ARGV[j + 1], ARGV[j + 2], ARGV[j + 3], ARGV[j + 4]
    local key, run = ARGV[j + 5], ARGV[j + 6]
    if how == 'w' then
      counted(P, dest)
      if redis.call('LREM', P .. 'q:' .. dest, 1, run) == 1 then
        added(P, dest, -1)
        withdrawn[#withdrawn + 1] = key
        touched[dest] = true
      end
    elseif mark(P .. 'qh:' .. name .. ':' .. node, f, bit_of(tonumber(at))) == 1 then
      if dest ~= '' then
        counted(P, dest)
        redis.call(how == 'h' and 'LPUSH' or 'RPUSH', P .. 'q:' .. dest, run)
        added(P, dest, 1)
        touched[dest] = true
      end
    end
  end
  first.w = withdrawn
  -- new items: a run per queue's run of them, checked against the dedup window
  local dups, base = {}, 0
  i = runs
  for _ = 1, nruns do
    local name, window, max = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    local n, m = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
    local run = ARGV[i + 5 + 2 * m]
    local ids, skip, skipped = P .. 'qi:' .. name, {}, 0
    if max > 0 then
      for j = i + 5, i + 3 + 2 * m, 2 do
        local at = redis.call('ZSCORE', ids, ARGV[j + 1])
        if at and tonumber(at) > now - window then
          skip[tonumber(ARGV[j])] = true
          skipped = skipped + 1
          dups[#dups + 1] = base + tonumber(ARGV[j])
        else
          redis.call('ZADD', ids, now, ARGV[j + 1])
          redis.call('ZREMRANGEBYSCORE', ids, '-inf', now - window)
          redis.call('ZREMRANGEBYRANK', ids, 0, -max - 1)
          redis.call('PEXPIRE', ids, window)
        end
      end
    end
    local q = P .. 'q:' .. name
    counted(P, name)
    if skipped == 0 then
      redis.call('RPUSH', q, run)
    elseif skipped < n then
      local fresh = {}
      for k, r in ipairs(records(run)) do
        if not skip[k] then fresh[#fresh + 1] = one(r) end
      end
      push('RPUSH', q, fresh)
    end
    if n > skipped then
      added(P, name, n - skipped)
      touched[name] = true
    end
    base = base + n
    i = i + 6 + 2 * m
  end
  first.d = dups
  -- audits: pieces held for this node that it does not know of go back as they are
  local moved = 0
  i = audits
  for _ = 1, naudits do
    local name, k = ARGV[i], tonumber(ARGV[i + 1])
    local known = {}
    for j = i + 2, i + 1 + k do known[ARGV[j]] = true end
    local unknown = function(f) return not known[f] end
    counted(P, name)
    local back = unended(P .. 'qh:' .. name .. ':' .. node, unknown, false)
    to_head(P, name, back)
    if #back > 0 then touched[name] = true end
    moved = moved + #back
    i = i + 2 + k
  end
  first.a = moved
  -- takes: whole runs from the head, the last one cut to what was asked
  local took = {}
  if ntakes > 0 then redis.call('ZADD', P .. 'nodes', now, node) end
  for t = 1, ntakes do
    local j = takes + 4 * (t - 1)
    local tid, name, n = ARGV[j], ARGV[j + 1], tonumber(ARGV[j + 2])
    local most = math.max(n, tonumber(ARGV[j + 3]))
    local q, held = P .. 'q:' .. name, P .. 'qh:' .. name .. ':' .. node
    local items, pieces = 0, {}
    counted(P, name)
    while items < n do
      local run = redis.call('LPOP', q)
      if not run then break end
      run = as_run(run)
      local count = struct.unpack('>H', run)
      if count > most - items then
        -- cut only a run that would pass the most: each string a cut makes is hashed whole
        local rest
        run, rest = cut(run, n - items)
        redis.call('LPUSH', q, rest)
        count = n - items
      end
      local k = #pieces / 2 + 1
      local f = tid .. '.' .. k
      redis.call('HSET', held, f, run, f .. '!',
        struct.pack('>HH', count, 0) .. string.rep('\\0', math.ceil(count / 8)))
      pieces[#pieces + 1] = k
      pieces[#pieces + 1] = run
      items = items + count
    end
    if items > 0 then
      added(P, name, -items)
      redis.call('SADD', P .. 'qn:' .. node, name)
    end
    got[t] = pieces
    took[t] = #pieces / 2
  end
  first.t = took
  redis.call('SET', done, cjson.encode(first), 'PX', 60000)
end

local dups, withdrawn = first.d or {}, first.w or {}
out[1] = #dups
for _, d in ipairs(dups) do out[#out + 1] = d end
out[#out + 1] = #withdrawn
for _, k in ipairs(withdrawn) do out[#out + 1] = k end
out[#out + 1] = first.a or 0
out[#out + 1] = ntakes
for t = 1, ntakes do
  local j = takes + 4 * (t - 1)
  local name = ARGV[j + 1]
  local len = redis.call('GET', P .. 'ql:' .. name) or '0'
  out[#out + 1] = len .. ':' .. redis.call('INCR', P .. 'qv:' .. name)
  out[#out + 1] = #got[t] / 2
  for _, v in ipairs(got[t]) do out[#out + 1] = v end
end
tell(P, touched, out)
return out
"""
)
"""One round trip of a node with Redis: every settle, new item, audit and take it has to send
(any of them none), in that order. ARGV: prefix, node, the call's id, then

- ACKs and drops: how many pieces, then per piece: the queue's name, the piece's field, the
  marks to set (one bit an item, as in the piece's marks, without their head);
- moves, in order: how many, then 7 values each: the queue's name, the piece's field, the
  item's place in it (from 1), the destination queue ('' none: dropped), ``h`` (to its head),
  ``t`` (its tail) or ``w`` (*withdraw*: a given-back item ACKed after all, taken out of the
  destination's list if it still waits there: field and place unused), the item's key, its
  run (of one record). An item no longer held (reclaimed while the node was cut off, or
  ended before) is left alone;
- new items: how many runs, then per run of items of one queue: its name, dedup window ms,
  dedup max, the run's length n, how many of its items carry an id m, m pairs (the item's
  place in the run from 1, its id), the run (to the tail, whole when no id was a duplicate);
- audits: how many queues, then per queue: its name, how many pieces the node knows it holds
  k, their k fields; what else the custody holds goes back to the head of the queue;
- takes: how many, then per take: its id, the queue's name, how many items it wants n and how
  many it may take m (whole runs are taken while fewer than n are, the last one cut only if it
  would pass m: this Redis's Lua hashes every byte of each string it makes, and a cut makes
  three).

Answers how many new items were duplicates d and their places (from 1, counted across runs),
how many withdrawals found their item and its keys, how many items the audits gave back, how
many takes, then per take the queue's ``length:version``, how many pieces p and p pairs: J (the
piece's field is ``TAKE.J``), the piece; then ``name, length:version`` for each queue that
changed otherwise (also published on its channel). A call sent again answers from its first
run: the same duplicates, withdrawals and count, and the pieces its takes moved that the node
still holds."""

BEAT = (
    _NOW
    + _COUNT
    + _TELL
    + _PUSH
    + _RUNS
    + """
local P, node, lapse, leaving = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1'
local pause = tonumber(ARGV[5] or '0')
local nodes = P .. 'nodes'
local gone, bump, lost = {node}, false, 0
if not leaving then
  -- a node not in the table any more was taken for dead: what it held is given back
  lost = redis.call('ZADD', nodes, now, node)
  -- when each node last beat, kept past its being taken for dead (a day): how long a node
  -- that answers nothing has been silent (a crashed host's sessions are gone)
  redis.call('ZADD', P .. 'seen', now, node)
  redis.call('ZREMRANGEBYSCORE', P .. 'seen', '-inf', now - 86400000)
  local last = tonumber(redis.call('GET', P .. 'beat') or '0')
  redis.call('SET', P .. 'beat', now)
  if pause > 0 and last > 0 and now - last > pause then
    -- nobody beat for longer than nodes beat: Redis itself was not answering (stalled,
    -- restarting), and every node's silence is its, not theirs; each gets a whole lapse
    -- from now before it is taken for dead
    for _, d in ipairs(redis.call('ZRANGE', nodes, 0, -1)) do redis.call('ZADD', nodes, now, d) end
    gone = {}
  else
    gone = redis.call('ZRANGEBYSCORE', nodes, '-inf', now - lapse)
  end
  bump = true
else
  redis.call('ZREM', P .. 'seen', node)
end
local out, touched, moved = {}, {}, 0
local every = function(f) return true end
for _, d in ipairs(gone) do
  for _, name in ipairs(redis.call('SMEMBERS', P .. 'qn:' .. d)) do
    local held = P .. 'qh:' .. name .. ':' .. d
    counted(P, name)
    local back = unended(held, every, bump)
    to_head(P, name, back)
    moved = moved + #back
    redis.call('DEL', held)
    if #back > 0 then touched[name] = true end
  end
  redis.call('DEL', P .. 'qn:' .. d)
  redis.call('ZREM', nodes, d)
end
out[1] = moved
out[2] = lost
tell(P, touched, out)
return out
"""
)
"""ARGV: prefix, node, how long a node may miss its heartbeat (ms), '1' when the node leaves,
and the *pause* (ms). A heartbeat: the node's time in ``P nodes``; when no node at all beat
for longer than the pause (``P beat``: the latest heartbeat of any node), Redis was not
answering, so every node's time is set to now and none is taken for dead this time (measured
without it: an item ACKed during a 12 s stall was delivered again as its node's custody was
reclaimed by the first other node to beat). Else every node silent for longer is taken for
dead and the items it held that had not ended go back to the head of their queues, in the
order they were taken, one more failure and one more delivery each (their consumers were
lost, perhaps after starting them: the next consumer sees an attempt above 1, a redelivery).
A node that leaves gives back what it still holds as it is. Answers how many items moved, 1
if this node was not in the table (taken for dead by another, which gave back what it held;
or its first beat), then ``name, length:version`` for each queue that grew."""

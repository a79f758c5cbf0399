"""The Lua scripts of ``RedisQueues``: work-queue topics kept in Redis, run atomically there.

Keys, for the prefix ``P`` (default ``rubris:``), a queue topic ``NAME`` and a node ``NODE``:

- ``P q:NAME`` (a list): the items waiting, the next to be delivered first.
- ``P qh:NAME:NODE`` (a hash): the items NODE took (its *custody*: waiting there for a
  consumer's free prefetch, or delivered and not yet ended), by item key.
- ``P qn:NODE`` (a set): the queues NODE holds items of.
- ``P qi:NAME`` (a sorted set): item ids enqueued within the dedup window, scored by time.
- ``P nodes`` (a sorted set): every live node, scored by its last heartbeat (Redis's clock);
  ``P beat``: the time of the latest heartbeat of any node.
- ``P qb:BATCH``, ``P qt:NODE:TAKE``: the answer to a batch of items, the keys of one take,
  for a minute: sent again after a lost connection, they are answered from the first run.
- ``P qv:NAME``: the version of the queue's length, one more at each change told.
- ``P qc:NAME``: the pub/sub channel that tells every node the queue's new length, as
  ``length:version``: a node keeps the newest version it heard, whichever way and in whatever
  order the news came (answers and channel messages race).

An item *record* is ``failures:attempt:key:flag:[id,batch_item]\\npayload`` (``flag`` 1 when
the payload is deflated): the counts first, so that a script can count one more failure.
Times are Redis's own (``TIME``), so the hosts' clocks never matter.
"""

from __future__ import annotations

_NOW = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_TELL = """
local function tell(P, touched, out)
  for name, _ in pairs(touched) do
    local len = redis.call('LLEN', P .. 'q:' .. name)
    len = len .. ':' .. redis.call('INCR', P .. 'qv:' .. name)
    redis.call('PUBLISH', P .. 'qc:' .. name, len)
    out[#out + 1] = name
    out[#out + 1] = len
  end
end
"""

ENQUEUE = (
    _NOW
    + _TELL
    + """
local P = ARGV[1]
local done = P .. 'qb:' .. ARGV[2]
local answer = redis.call('GET', done)
if answer then return cjson.decode(answer) end
local out, touched = {}, {}
local i = 3
while i <= #ARGV do
  local name, window, max, n = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
  local q, ids = P .. 'q:' .. name, P .. 'qi:' .. name
  for j = i + 4, i + 3 + 2 * tonumber(n), 2 do
    local id, fresh = ARGV[j], 1
    if id ~= '' and max > 0 then
      local at = redis.call('ZSCORE', ids, id)
      if at and tonumber(at) > now - window then
        fresh = 0
      else
        redis.call('ZADD', ids, now, id)
        redis.call('ZREMRANGEBYSCORE', ids, '-inf', now - window)
        redis.call('ZREMRANGEBYRANK', ids, 0, -max - 1)
        redis.call('PEXPIRE', ids, window)
      end
    end
    if fresh == 1 then
      redis.call('RPUSH', q, ARGV[j + 1])
      touched[name] = true
    end
    out[#out + 1] = fresh
  end
  i = i + 4 + 2 * tonumber(n)
end
tell(P, touched, out)
redis.call('SET', done, cjson.encode(out), 'PX', 60000)
return out
"""
)
"""ARGV: prefix, the batch's id, then per run of items of one queue: its name, dedup window ms,
dedup max, the run's length n, then n pairs: id ('' none), record. Answers 1 (enqueued) or 0
(a duplicate) per item, then ``name, length:version`` for each queue that grew (also
published on its channel)."""

TAKE = (
    _NOW
    + """
local P, node, tid, name, n = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local q = P .. 'q:' .. name
local held = P .. 'qh:' .. name .. ':' .. node
local mark = P .. 'qt:' .. node .. ':' .. tid
redis.call('ZADD', P .. 'nodes', now, node)
local out = {0}
local before = redis.call('GET', mark)
if before then
  for _, k in ipairs(cjson.decode(before)) do
    local r = redis.call('HGET', held, k)
    if r then out[#out + 1] = r end
  end
elseif n > 0 then
  local recs = redis.call('LRANGE', q, 0, n - 1)
  if #recs > 0 then
    redis.call('LTRIM', q, #recs, -1)
    local keys = {}
    for j, r in ipairs(recs) do
      local k = string.match(r, '^%d+:%d+:([^:]+):')
      redis.call('HSET', held, k, r)
      keys[j] = k
      out[j + 1] = r
    end
    redis.call('SADD', P .. 'qn:' .. node, name)
    redis.call('SET', mark, cjson.encode(keys), 'PX', 60000)
  end
end
out[1] = redis.call('LLEN', q) .. ':' .. redis.call('INCR', P .. 'qv:' .. name)
return out
"""
)
"""ARGV: prefix, node, the take's id, queue name, how many at most. Moves up to that many
items from the head of the queue into the node's custody; answers the queue's ``length:version``,
then their records (a take sent again answers what its first run took and the node still holds)."""

SETTLE = (
    _TELL
    + """
local P, node = ARGV[1], ARGV[2]
local out, touched, withdrawn = {}, {}, {}
local i = 3
while i <= #ARGV do
  local held = P .. 'qh:' .. ARGV[i] .. ':' .. node
  local dest, how, n = ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
  if dest == '' then
    for j = i + 4, i + 3 + n do redis.call('HDEL', held, ARGV[j]) end
    i = i + 4 + n
  elseif how == 'w' then
    local q = P .. 'q:' .. dest
    for j = i + 4, i + 3 + 2 * n, 2 do
      if redis.call('LREM', q, 1, ARGV[j + 1]) == 1 then
        withdrawn[#withdrawn + 1] = ARGV[j]
        touched[dest] = true
      end
    end
    i = i + 4 + 2 * n
  else
    local q = P .. 'q:' .. dest
    for j = i + 4, i + 3 + 2 * n, 2 do
      if redis.call('HDEL', held, ARGV[j]) == 1 then
        if how == 'h' then
          redis.call('LPUSH', q, ARGV[j + 1])
        else
          redis.call('RPUSH', q, ARGV[j + 1])
        end
        touched[dest] = true
      end
    end
    i = i + 4 + 2 * n
  end
end
out[1] = #withdrawn
for k = 1, #withdrawn do out[k + 1] = withdrawn[k] end
tell(P, touched, out)
return out
"""
)
"""ARGV: prefix, node, then per run of items of one queue to one place: the queue's name, the
destination queue ('' none: ACKed or dropped), 'h' (to its head), 't' (to its tail) or 'w'
(*withdraw*: a given-back item ACKed after all, taken out of the destination's list if it still
waits there), the run's length n, then n keys ('' destination) or n pairs: key, record. An
item the node no longer holds (reclaimed while it was cut off, or settled by a first run) is
left alone. Answers how many items were withdrawn and their keys, then ``name,
length:version`` for each queue that changed."""

BEAT = (
    _NOW
    + _TELL
    + """
local P, node, lapse, leaving = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1'
local pause = tonumber(ARGV[5] or '0')
local nodes = P .. 'nodes'
local gone, bump, lost = {node}, 0, 0
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
  bump = 1
else
  redis.call('ZREM', P .. 'seen', node)
end
local out, touched, moved = {}, {}, 0
for _, d in ipairs(gone) do
  for _, name in ipairs(redis.call('SMEMBERS', P .. 'qn:' .. d)) do
    local held = P .. 'qh:' .. name .. ':' .. d
    local all = redis.call('HGETALL', held)
    local keys, recs = {}, {}
    for j = 1, #all, 2 do
      keys[#keys + 1] = all[j]
      recs[all[j]] = all[j + 1]
    end
    table.sort(keys)
    for j = #keys, 1, -1 do
      local r = recs[keys[j]]
      if bump == 1 then
        local f, a, rest = string.match(r, '^(%d+):(%d+)(:.*)$')
        r = (tonumber(f) + 1) .. ':' .. (tonumber(a) + 1) .. rest
      end
      redis.call('LPUSH', P .. 'q:' .. name, r)
      moved = moved + 1
    end
    redis.call('DEL', held)
    if #keys > 0 then touched[name] = true end
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
dead and the items it held go back to the head of their queues, one more failure and one more
delivery each (their consumers were lost, perhaps after starting them: the next consumer sees
an attempt above 1, a redelivery). A node that leaves gives back what it still holds as it
is. Answers how many items moved, 1 if this node was not in the table (taken for dead by
another, which gave back what it held; or its first beat), then ``name, length:version`` for
each queue that grew."""

AUDIT = (
    _TELL
    + """
local P, node, name = ARGV[1], ARGV[2], ARGV[3]
local held = P .. 'qh:' .. name .. ':' .. node
local known = {}
for i = 4, #ARGV do known[ARGV[i]] = true end
local all = redis.call('HGETALL', held)
local keys, recs = {}, {}
for j = 1, #all, 2 do
  if not known[all[j]] then
    keys[#keys + 1] = all[j]
    recs[all[j]] = all[j + 1]
  end
end
table.sort(keys)
for j = #keys, 1, -1 do
  redis.call('LPUSH', P .. 'q:' .. name, recs[keys[j]])
  redis.call('HDEL', held, keys[j])
end
local out = {#keys}
if #keys > 0 then tell(P, {[name] = true}, out) end
return out
"""
)
"""ARGV: prefix, node, queue name, then the keys the node knows it holds. Whatever else is in
its custody (a take whose answer was lost with the connection, for longer than its mark
lives) goes back to the head of the queue as it is. Answers how many, then ``name,
length:version``."""

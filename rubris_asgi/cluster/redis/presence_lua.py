"""The Lua scripts of presence across nodes (presence.py): each node's sessions per member,
added up in Redis, written into ``{topic}@presence`` and ``{topic}@count`` as any change.

Keys, for the prefix ``P``, a watched topic ``TOPIC`` and a node ``NODE``:

- ``P ph:TOPIC:NODE`` (a hash): NODE's sessions of each member (only those with some). A node
  writes its own counts whole (never +1/-1), so a batch sent twice, or sent again after Redis
  lost them, counts the same.
- ``P pt:TOPIC`` (a hash): every node's sessions of each member, added up (members with some).
- ``P pi:TOPIC`` (a hash): each member's ``info`` (JSON), from the node where it joined first.
- ``P ps:TOPIC``: the sessions of every member, added up.
- ``P pnt:NODE`` (a set): the topics NODE has members of.
- ``P pn`` (a set): the nodes whose counts are in Redis. A node not in it writes nothing until
  it writes everything it holds (*registers*): it was taken for dead, or Redis lost its
  counts, and what it would add to would not be there.
- ``TOPIC@presence``: a keyed topic (tables_lua.py's keys), an entry per member,
  ``{"sessions": n, "info": …}``; ``TOPIC@count``: a snapshot topic (broker_lua.py's keys),
  ``{"members": m, "sessions": s}``.

A node is dead, for presence as for work queues (queues/lua.py's BEAT), when its heartbeat in
``P nodes`` is older than the lapse (or gone: another node found it dead), unless nobody at all
beat for longer than the pause (``P beat``): then Redis itself was away. Whoever sweeps first
takes its counts away.
"""

from __future__ import annotations

from .tables_lua import KEYED, NOW

BUDGET = 500
"""Members one sweep or leave takes away at most: each is a change of a keyed topic, about 15
us of Redis's time (measured: a dozen commands), and a script holds Redis meanwhile (8 ms at
most this way). The rest go in the next call, at once."""

_PRESENCE = (
    f"local BUDGET = {BUDGET}\n"
    + """
-- the snapshot topic name's next value (broker_lua.PUBLISH's mode 1)
local function snap(P, name, epoch0, ttl, payload)
  local h = P .. 't:' .. name
  local e = redis.call('HGET', h, 'e')
  if not e then
    e = epoch0
    redis.call('HSET', h, 'e', e, 's', 0)
  end
  local seq = redis.call('HINCRBY', h, 's', 1)
  local entry = seq .. ':0:' .. payload
  redis.call('HSET', h, 'v', entry)
  redis.call('PUBLISH', P .. 'c:' .. name, e .. ':' .. entry)
  redis.call('PEXPIRE', h, ttl)
end

-- node now has count sessions of member on topic: the member's entry follows the total in
-- the keyed topic name (topic@presence, its meta h and epoch e); answers the change in sessions
local function pcount(P, topic, node, member, count, info, name, h, e, now, max)
  local nh = P .. 'ph:' .. topic .. ':' .. node
  local old = tonumber(redis.call('HGET', nh, member) or '0')
  if count == old then return 0 end
  if count > 0 then redis.call('HSET', nh, member, count) else redis.call('HDEL', nh, member) end
  local d = count - old
  local tot, inf = P .. 'pt:' .. topic, P .. 'pi:' .. topic
  local total = redis.call('HINCRBY', tot, member, d)
  if total <= 0 then
    redis.call('HDEL', tot, member)
    redis.call('HDEL', inf, member)
    kdel(P, name, h, e, member, now)
  else
    local i = redis.call('HGET', inf, member)
    local fresh = total - d <= 0 or not i
    if fresh then
      if info ~= '' then i = info else i = 'null' end
      redis.call('HSET', inf, member, i)
    end
    local sessions = '{"sessions":' .. total
    local value = sessions .. ',"info":' .. i .. '}'
    local patch, prev = '', 0
    if not fresh and 2 * (#sessions + 1) <= #value then  -- the 50 % rule
      -- only the count changed: {"sessions":n} takes the entry as it is to the new one
      patch = sessions .. '}'
      local rec = redis.call('HGET', P .. 'kv:' .. name, member)
      if rec then prev = kread(rec) end
    end
    kset(P, name, h, e, member, '0', value, '0', patch, prev, e, max)
  end
  return d
end

-- after a topic's counts changed by d sessions: its count published, its keys kept
local function pdone(P, topic, node, d, epoch0, ttl, now, window, max)
  local nh = P .. 'ph:' .. topic .. ':' .. node
  if redis.call('EXISTS', nh) == 1 then
    redis.call('SADD', P .. 'pnt:' .. node, topic)
    redis.call('PEXPIRE', nh, ttl)
    redis.call('PEXPIRE', P .. 'pnt:' .. node, ttl)
  else
    redis.call('SREM', P .. 'pnt:' .. node, topic)
  end
  local name = topic .. '@presence'
  local h = P .. 't:' .. name
  if redis.call('EXISTS', h) == 1 then ksweep(P, name, h, now, window, max) end
  ktouch(P, name, ttl)
  if d ~= 0 then
    local s = redis.call('INCRBY', P .. 'ps:' .. topic, d)
    local m = redis.call('HLEN', P .. 'pt:' .. topic)
    snap(P, topic .. '@count', epoch0, ttl, '{"members":' .. m .. ',"sessions":' .. s .. '}')
  end
  for _, k in ipairs({'pt:', 'pi:', 'ps:'}) do redis.call('PEXPIRE', P .. k .. topic, ttl) end
end

-- the counts of node taken away (it died, or leaves), budget members at most (a script holds
-- Redis for no longer); answers the budget left, 0 when there may be more
local function pleave(P, node, epoch0, ttl, now, window, max, budget)
  for _, topic in ipairs(redis.call('SMEMBERS', P .. 'pnt:' .. node)) do
    local nh = P .. 'ph:' .. topic .. ':' .. node
    local name = topic .. '@presence'
    local h, e = kmeta(P, name, epoch0)
    local d = 0
    repeat
      -- what is taken away leaves the hash: scanning from its start again finds the rest
      local all = redis.call('HSCAN', nh, 0, 'COUNT', budget)[2]
      for j = 1, #all, 2 do
        if budget <= 0 then break end  -- a scan answers about COUNT: the rest is found again
        d = d + pcount(P, topic, node, all[j], 0, '', name, h, e, now, max)
        budget = budget - 1
      end
    until #all == 0 or budget <= 0
    pdone(P, topic, node, d, epoch0, ttl, now, window, max)
    if budget <= 0 then return 0 end
  end
  redis.call('DEL', P .. 'pnt:' .. node)
  redis.call('SREM', P .. 'pn', node)
  return budget
end
"""
)

COUNTS = (
    NOW
    + KEYED
    + _PRESENCE
    + """
local P, node, ttl, epoch0 = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local window, max, register = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
if redis.call('SISMEMBER', P .. 'pn', node) == 0 then
  -- registering before its heartbeat is in the nodes' table would have it swept as dead
  if register ~= '1' or not redis.call('ZSCORE', P .. 'nodes', node) then return 0 end
  redis.call('SADD', P .. 'pn', node)
end
local i = 8
while i <= #ARGV do
  local topic, n = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 2
  local name = topic .. '@presence'
  local h, e = kmeta(P, name, epoch0)
  local d = 0
  for _ = 1, n do
    d = d + pcount(P, topic, node, ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], name, h, e, now,
      max)
    i = i + 3
  end
  pdone(P, topic, node, d, epoch0, ttl, now, window, max)
end
return 1
"""
)
"""ARGV: prefix, node, ttl ms, the epoch for a topic Redis does not know, the tombstone window
ms, the presence topics' ``max_keys``, '1' to register (what follows, with the batches after
it, is everything the node holds), then per topic: its name, n, then n triples: member, the
node's sessions of it now (0: none), its ``info`` as JSON ('' none). Answers 1, or 0 (nothing
written) when the node is not registered and does not, or may not yet (its heartbeat is not in
the nodes' table: it would be swept at once)."""

SWEEP = (
    NOW
    + KEYED
    + _PRESENCE
    + """
local P, node, lapse, pause, ttl, epoch0 = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]),
  tonumber(ARGV[5]), ARGV[6]
local window, max = tonumber(ARGV[7]), tonumber(ARGV[8])
local out = {0, 0, 0}
local budget = BUDGET
local last = tonumber(redis.call('GET', P .. 'beat') or '0')
if not (pause > 0 and last > 0 and now - last > pause) then
  for _, d in ipairs(redis.call('SMEMBERS', P .. 'pn')) do
    if d ~= node then
      local at = redis.call('ZSCORE', P .. 'nodes', d)
      if not at or tonumber(at) < now - lapse then
        budget = pleave(P, d, epoch0, ttl, now, window, max, budget)
        if budget <= 0 then
          out[3] = 1  -- more to take away: called again at once
          break
        end
        out[2] = out[2] + 1
      end
    end
  end
end
out[1] = redis.call('SISMEMBER', P .. 'pn', node)
if out[1] == 0 and not redis.call('ZSCORE', P .. 'nodes', node) then out[1] = 2 end
for k = 9, #ARGV do
  local topic = ARGV[k]
  ktouch(P, topic .. '@presence', ttl)
  redis.call('PEXPIRE', P .. 't:' .. topic .. '@count', ttl)
  for _, key in ipairs({'pt:', 'pi:', 'ps:'}) do redis.call('PEXPIRE', P .. key .. topic, ttl) end
  redis.call('PEXPIRE', P .. 'ph:' .. topic .. ':' .. node, ttl)
end
if #ARGV >= 9 then redis.call('PEXPIRE', P .. 'pnt:' .. node, ttl) end
return out
"""
)
"""ARGV: prefix, node, the lapse and the pause (ms, as queues/lua.py's BEAT's), ttl ms, the epoch
for a topic Redis does not know, the tombstone window ms, ``max_keys``, then the topics whose
keys to keep (refreshed). Takes the counts of every dead node away (``BUDGET`` members a call
at most); answers whether this node is registered (1), is not (0: it must register), or is not
and may not yet (2: its heartbeat is not in the nodes' table), how many nodes were swept, and 1
when there is more to take away."""

LEAVE = (
    NOW
    + KEYED
    + _PRESENCE
    + """
local left = pleave(ARGV[1], ARGV[2], ARGV[4], tonumber(ARGV[3]), now, tonumber(ARGV[5]),
  tonumber(ARGV[6]), BUDGET)
if left > 0 then return 1 end
return 0
"""
)
"""ARGV: prefix, node, ttl ms, the epoch for a topic Redis does not know, the tombstone window
ms, ``max_keys``: the node leaves, its counts taken away (``BUDGET`` a call: answers 0 while
some are left)."""

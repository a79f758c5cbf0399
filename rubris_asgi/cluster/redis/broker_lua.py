"""The Lua scripts of ``RedisBroker``: each runs atomically on the Redis server.

Keys, for the prefix ``P`` (default ``rubris:``) and a topic ``NAME``:

- ``P t:NAME`` (a hash): ``e`` the topic's epoch (decimal), ``s`` its last seq, ``v`` a
  snapshot topic's latest entry.
- ``P r:NAME`` (a list): a ring topic's last entries, newest first, at most its ring size.
- ``P c:NAME``: the pub/sub channel its messages go out on, ``epoch:entry``.
- ``P b:BATCH``: the answer to one batch of publishes, for a minute: a batch sent again after
  a lost connection (did it run?) gets that answer instead of being numbered twice.

An *entry* is ``seq:flag:payload``: ``flag`` 1 when the payload is deflated. The payload goes
through as bytes; Lua strings are binary-safe. Epochs are kept as strings: 48 random bits
would print in Lua's float notation.

Every key of a topic expires ``ttl`` ms after its last publish, follow or refresh (nodes that
follow a topic refresh it, so a topic with subscribers somewhere never expires). A topic
that is gone, expired or lost in a restart without persistence, starts again under the
epoch of whoever touches it next.
"""

from __future__ import annotations

PUBLISH = """
local P = ARGV[1]
local ttl = tonumber(ARGV[2])
local done = P .. 'b:' .. ARGV[4]
local answer = redis.call('GET', done)
if answer then return cjson.decode(answer) end
local out = {}
local n = 0
for i = 5, #ARGV, 6 do
  local name, mode, cap = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local cond, flag, payload = ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  local h = P .. 't:' .. name
  local epoch = redis.call('HGET', h, 'e')
  local seq = 0
  if not epoch and cond == '2' then
    cond = 'skip'
  elseif not epoch then
    epoch = ARGV[3]
    redis.call('HSET', h, 'e', epoch, 's', 0)
  end
  if cond == '0' or cond == '2' or (cond == '1' and redis.call('HGET', h, 's') == '0') then
    seq = redis.call('HINCRBY', h, 's', 1)
    local entry = seq .. ':' .. flag .. ':' .. payload
    if mode == '2' then
      local r = P .. 'r:' .. name
      redis.call('LPUSH', r, entry)
      redis.call('LTRIM', r, 0, cap - 1)
      redis.call('PEXPIRE', r, ttl)
    else
      redis.call('HSET', h, 'v', entry)
    end
    redis.call('PUBLISH', P .. 'c:' .. name, epoch .. ':' .. entry)
  end
  if cond ~= 'skip' then redis.call('PEXPIRE', h, ttl) end
  n = n + 1
  out[n] = seq
end
redis.call('SET', done, cjson.encode(out), 'PX', 60000)
return out
"""
"""ARGV: prefix, ttl ms, the epoch for a topic Redis does not know, the batch's id, then per
publish: name, mode (1 snapshot, 2 ring), ring size, condition (0 none, 1 only if the topic has
no message, 2 only if Redis knows the topic: a node follows or followed it), flag, payload.
Answers each publish's seq (0: its condition said no)."""

HISTORY = """
local P = ARGV[1]
local ttl = tonumber(ARGV[2])
local res = {}
for i = 4, #ARGV, 4 do
  local name, mode, known, after = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
  local h = P .. 't:' .. name
  local epoch = redis.call('HGET', h, 'e')
  if not epoch then
    epoch = ARGV[3]
    redis.call('HSET', h, 'e', epoch, 's', 0)
  end
  redis.call('PEXPIRE', h, ttl)
  local seq = tonumber(redis.call('HGET', h, 's'))
  if epoch == known and seq < after then
    -- behind what the caller heard from it: Redis lost the tail it had numbered (a failover
    -- to a replica that had not received it, a restart that lost unsynced writes); numbering
    -- on would give those seqs to other messages, so the topic starts again, under ARGV[3]
    epoch = ARGV[3]
    seq = 0
    redis.call('HSET', h, 'e', epoch, 's', 0)
    redis.call('HDEL', h, 'v')
    redis.call('DEL', P .. 'r:' .. name)
  end
  if epoch ~= known then after = 0 end
  local item = {epoch, seq}
  if seq > after then
    if mode == '2' then
      local r = P .. 'r:' .. name
      redis.call('PEXPIRE', r, ttl)
      local entries = redis.call('LRANGE', r, 0, seq - after - 1)
      for j = #entries, 1, -1 do item[#item + 1] = entries[j] end
    else
      local v = redis.call('HGET', h, 'v')
      if v then item[3] = v end
    end
  end
  res[#res + 1] = item
end
return res
"""
"""ARGV: prefix, ttl ms, the epoch for a topic Redis does not know (it is made so, and every
node then numbers under it), then per topic: name, mode, the epoch the caller knows and the
last seq it holds. Answers per topic ``{epoch, seq, entries...}``: what follows the caller's
seq in its epoch (oldest first, at most the ring), everything held in another epoch; a
snapshot's latest entry. A topic whose seq in the caller's epoch is below the caller's has
lost messages it numbered: it is numbered afresh under the new epoch (the caller restarts it,
and every other node does at its next message)."""

RENUMBER = """
local P = ARGV[1]
local h = P .. 't:' .. ARGV[2]
local epoch = redis.call('HGET', h, 'e')
if epoch == ARGV[3] then
  epoch = ARGV[4]
  redis.call('HSET', h, 'e', epoch, 's', 0)
  redis.call('HDEL', h, 'v')
  redis.call('DEL', P .. 'r:' .. ARGV[2])
end
return epoch
"""
"""ARGV: prefix, name, the epoch a node found renumbered, a new epoch. A node heard a seq it
holds with another message under it: Redis lost what it had numbered and numbered new messages
the same. Unless another node did already (the topic's epoch is no longer that one), the topic
starts again under the new epoch. Answers the topic's epoch now."""

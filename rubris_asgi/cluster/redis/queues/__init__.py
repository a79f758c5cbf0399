"""Work-queue topics whose items wait in Redis, for the consumers of every node: ``RedisQueues``
(home.py) is each queue topic's home on a node; runs.py the items' forms in Redis, lua.py the
scripts that move them there, hand.py the items a node keeps of its own runs. Nothing is
imported here: runs.py and hand.py need no Redis client."""

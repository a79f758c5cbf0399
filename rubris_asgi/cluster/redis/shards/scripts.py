"""``Script``: a Lua script run on a partition's master by its SHA1; ``Command``: a command's
words as the sharded client sends them."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

Command = tuple[Any, ...]
"""A command's words: ``("GET", key)``, ``("EVALSHA", sha, 1, key, arg)``."""


class Script:
    """A Lua script, sent by its SHA1 (``EVALSHA``). The sharded client loads it (``SCRIPT
    LOAD``, in the same round trip) on each node before its first use there and after a
    connection to that node failed (a master restarted, or a replica promoted, has an empty
    script cache); a node that answers ``NOSCRIPT`` all the same gets its body (``EVAL``)."""

    def __init__(self, body: str) -> None:
        self.body = body
        self.sha = hashlib.sha1(body.encode()).hexdigest()

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> Command:
        """``EVALSHA`` of the script with ``keys`` and ``args``. A cluster runs a script on the
        master of its keys' slot, and refuses keys of two slots (``CROSSSLOT``): declare at
        least one key of the partition, and every key the script writes where it can (see
        ``ShardedClient.run_script``)."""
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

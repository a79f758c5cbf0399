"""A value that is not JSON, sent where another node (or Redis) does the rest, raises a
``TypeError`` naming the topic and the fix before anything leaves this node (issue 36, item 3):
``send_to`` a session of another node, ``publish_async`` numbered by Redis. Two nodes in this
loop on a real ``redis-server``, as in tests/test_send_to.py; the single-node cases are
tests/test_error_texts.py's.
"""

from __future__ import annotations

import decimal

import pytest

from rubris_asgi.client import Client

from .rediskit import RedisServer, redis_server  # noqa: F401 (the fixture)
from .test_send_to import collect, nodes, until

pytestmark = pytest.mark.redis

FIX = "a Decimal is not JSON: convert it (float(x), str(x)) or pass orjson-compatible values"


@pytest.fixture
def url(redis_server: RedisServer) -> str:  # noqa: F811 (the fixture)
    redis_server.flush()
    return redis_server.url


async def test_values_for_other_nodes_are_named_and_nothing_leaves(url: str) -> None:
    async with nodes(url) as [(_a, base_a), (b, _b)]:
        async with Client(base_a + "/rubris") as c:
            got = await collect(c, "inbox")
            sid = c.session_id
            assert sid is not None and sid not in b.engine.sessions
            with pytest.raises(TypeError) as info:
                await b.send_to(sid, "inbox", {"at": decimal.Decimal(1)}, key="k")
            assert str(info.value) == f"send to 'inbox': {FIX}"
            assert isinstance(info.value.__cause__, TypeError)
            # nothing reached the session's node: the same key with a good value is queued
            assert await b.send_to(sid, "inbox", {"ok": 1}, key="k") == 1
            await until(lambda: len(got) == 1, "the good message")
            assert got == [(1, {"ok": 1})]

            with pytest.raises(TypeError) as info:
                await b.publish_async("ring.a", {"px": decimal.Decimal("1.5")})
            assert str(info.value) == f"publish to 'ring.a': {FIX}"
            # Redis numbered nothing: the next publish is the first
            assert await b.publish_async("ring.a", {"px": 1.5}) == 1

"""The public surface is exactly what ``__all__`` says."""

from __future__ import annotations

import subprocess
import sys
from importlib.util import find_spec

import rubris_asgi

NEEDS_REDIS = {"RedisBroker", "RedisClusterBroker"}
"""Public names of the ``redis`` extra: they load redis-py when asked for."""


def test_all_is_exactly_what_is_exported() -> None:
    # dir(): the names load on first use (PEP 562), so vars() holds only those used so far
    public = {n for n in dir(rubris_asgi) if not n.startswith("_")}
    # without redis-py (the inner loop may run without it) a name of the extra cannot load:
    # test_redis_broker_is_public_and_loads_redis_only_when_asked_for says what it raises
    absent = NEEDS_REDIS if find_spec("redis") is None else set()
    modules = {n for n in public - absent if type(getattr(rubris_asgi, n)).__name__ == "module"}
    assert set(rubris_asgi.__all__) == public - modules
    for name in set(rubris_asgi.__all__) - absent:
        assert getattr(rubris_asgi, name) is not None


def test_redis_broker_is_public_and_loads_redis_only_when_asked_for() -> None:
    """``from rubris_asgi import RedisBroker`` (what RedisNotDurable's advice needs), yet
    ``import rubris_asgi`` and the server's names import no redis; without redis-py the name
    says what to install."""
    script = """
import sys
import rubris_asgi
from rubris_asgi import Rubris, RubrisMiddleware, serve
assert "redis" not in sys.modules, "import rubris_asgi loaded redis"
if {have_redis}:
    from rubris_asgi import RedisBroker
    from rubris_asgi.cluster.redis.broker import RedisBroker as home
    assert RedisBroker is home and "redis" in sys.modules
sys.modules["redis"] = None  # as if redis-py were not installed
for name in list(sys.modules):
    if name.startswith(("redis.", "rubris_asgi.cluster.redis")):
        del sys.modules[name]
rubris_asgi.__dict__.pop("RedisBroker", None)
try:
    from rubris_asgi import RedisBroker
except ImportError as exc:
    print(exc)
else:
    raise AssertionError("RedisBroker loaded without redis")
"""
    have_redis = find_spec("redis") is not None
    done = subprocess.run(
        [sys.executable, "-c", script.format(have_redis=have_redis)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "RedisBroker needs redis-py: pip install 'rubris-asgi[redis]'"


def test_package_is_typed() -> None:
    from importlib.resources import files

    assert files("rubris_asgi").joinpath("py.typed").is_file()
    assert files("rubris_asgi").joinpath("static/client.js").is_file()

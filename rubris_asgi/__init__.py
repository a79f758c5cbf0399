"""rubris_asgi: a push-messaging engine for ASGI apps.

Fair, coalesced batches over WebSocket and HTTP long-poll, with per-message deflate, pooled
outbound buffers and lossless private queues. See docs/ for the guide.

The public names load on first use (PEP 562): ``import rubris_asgi.client`` (a worker process,
a Spark executor) loads the wire and the client, never Starlette, uvicorn or the server's
modules; ``from rubris_asgi import Rubris`` loads the server. ``RedisBroker`` and
``RedisClusterBroker`` (the ``redis`` extra) load redis-py only when asked for: an app alone
on one node never imports it.
"""

import typing as _typing
from importlib import import_module as _import_module

if _typing.TYPE_CHECKING:  # what the names are, for type checkers and editors
    from .app import Rubris
    from .cluster.redis.broker import RedisBroker
    from .cluster.redis.shards.broker import RedisClusterBroker
    from .config import BatchConfig, Config, FlowConfig, Limits, PoolConfig, Timing, WriterConfig
    from .engine.session import Session
    from .errors import (
        BrokerUnavailable,
        DeliveryUnknown,
        ErrorCode,
        MessageTooLarge,
        ProtocolError,
        QueueFull,
        RegistrationClosed,
        Reject,
        RubrisError,
        SessionClosed,
        StartupError,
        TableFull,
    )
    from .middleware import RubrisMiddleware
    from .ops.stats import Stats
    from .protocol import Codec, Mode
    from .protocol.deflate import Compressor, Decompressor
    from .serving import Server, serve

__version__ = "0.1.0"

# each public name: the module it lives in
_HOME = {
    "Rubris": ".app",
    "RedisBroker": ".cluster.redis.broker",
    "RedisClusterBroker": ".cluster.redis.shards.broker",
    "RubrisMiddleware": ".middleware",
    "Server": ".serving",
    "serve": ".serving",
    "Session": ".engine.session",
    "Stats": ".ops.stats",
    "Codec": ".protocol",
    "Mode": ".protocol",
    "Compressor": ".protocol.deflate",
    "Decompressor": ".protocol.deflate",
    **dict.fromkeys(
        ["BatchConfig", "Config", "FlowConfig", "Limits", "PoolConfig", "Timing", "WriterConfig"],
        ".config",
    ),
    **dict.fromkeys(
        [
            "BrokerUnavailable",
            "DeliveryUnknown",
            "ErrorCode",
            "MessageTooLarge",
            "ProtocolError",
            "QueueFull",
            "RegistrationClosed",
            "Reject",
            "RubrisError",
            "SessionClosed",
            "StartupError",
            "TableFull",
        ],
        ".errors",
    ),
}


def __getattr__(name: str) -> _typing.Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = _import_module(home, __name__)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "redis":
            raise
        # what to install, not just the missing module's name: redis-py is an optional extra
        raise ImportError(
            f"{name} needs redis-py: pip install 'rubris-asgi[redis]'", name=exc.name
        ) from exc
    value = getattr(module, name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])


__all__ = [
    "BatchConfig",
    "BrokerUnavailable",
    "Codec",
    "Compressor",
    "Config",
    "Decompressor",
    "DeliveryUnknown",
    "ErrorCode",
    "FlowConfig",
    "Limits",
    "MessageTooLarge",
    "Mode",
    "PoolConfig",
    "ProtocolError",
    "QueueFull",
    "RedisBroker",
    "RedisClusterBroker",
    "RegistrationClosed",
    "Reject",
    "Rubris",
    "RubrisError",
    "RubrisMiddleware",
    "Server",
    "Session",
    "SessionClosed",
    "StartupError",
    "Stats",
    "TableFull",
    "Timing",
    "WriterConfig",
    "serve",
]

"""rubris_asgi: a push-messaging engine for ASGI apps.

Fair, coalesced batches over WebSocket and HTTP long-poll, with per-message deflate, pooled
outbound buffers and lossless private queues. See docs/ for the guide.
"""

from .app import Rubris
from .buffers import PoolConfig
from .compression import Compressor, Decompressor
from .config import BatchConfig, Config, FlowConfig, Limits, Timing, WriterConfig
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
)
from .middleware import RubrisMiddleware
from .protocol import Codec, Mode
from .serving import Server, serve
from .session import Session
from .stats import Stats

__version__ = "0.1.0"

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
    "RegistrationClosed",
    "Reject",
    "Rubris",
    "RubrisError",
    "RubrisMiddleware",
    "Server",
    "Session",
    "SessionClosed",
    "Stats",
    "Timing",
    "WriterConfig",
    "serve",
]

"""The old path of :mod:`rubris_asgi.cluster.redis.batch_store`, kept for code written against 0.1.

An alias: no code here.
"""

from ..cluster.redis.batch_store import RedisBatchStore

__all__ = ["RedisBatchStore"]

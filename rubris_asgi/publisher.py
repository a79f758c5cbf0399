"""The old path of :mod:`rubris_asgi.client.publisher`, kept for code written against 0.1.

An alias: no code here.
"""

from .client.publisher import Publisher, PublishError, PublisherStats, SyncPublisher

__all__ = ["PublishError", "Publisher", "PublisherStats", "SyncPublisher"]

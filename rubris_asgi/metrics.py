"""The old path of :mod:`rubris_asgi.ops.metrics`, kept for code written against 0.1.

An alias: no code here.
"""

from .ops.metrics import Metrics, RubrisCollector, families

__all__ = ["Metrics", "RubrisCollector", "families"]

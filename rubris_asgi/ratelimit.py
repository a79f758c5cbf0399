"""The old path of :mod:`rubris_asgi.control.ratelimit`, kept for code written against 0.1.

An alias: no code here.
"""

from .control.ratelimit import RateLimiter, RateStats

__all__ = ["RateLimiter", "RateStats"]

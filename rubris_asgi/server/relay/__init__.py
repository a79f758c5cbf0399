"""A WebSocket that resumes a session of another node, carried to it through Redis.

``relays.py`` says how, ``records.py`` what the two nodes tell each other, ``home.py`` and
``entry.py`` each end.
"""

from .relays import HomeUnreachable, Relays

__all__ = ["HomeUnreachable", "Relays"]

"""What the client counts: ``ClientStats``, read by the app as ``client.stats``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ClientStats:
    """Counters of what the client received.

    ``compressed`` counts messages that came COMPRESSED and ``bytes_saved`` what inflating them
    added; ``gaps`` counts GAP messages; ``dropped`` counts values a full subscription queue
    discarded; ``goodbye`` is the last GOODBYE as ``(code, reason)``; ``reconnects`` counts
    WELCOMEs after the first; ``flow`` is the fill of the last FLOW (0 before any).
    """

    frames: int = 0
    messages: int = 0
    bytes_in: int = 0
    compressed: int = 0
    bytes_saved: int = 0
    gaps: int = 0
    dropped: int = 0
    rejected: int = 0
    reconnects: int = 0
    flow: int = 0
    goodbye: tuple[int, str] | None = None

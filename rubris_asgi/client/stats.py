"""What the client counts: ``ClientStats``, read by the app as ``client.stats``, and
``ConsumerStats``, one queue consumer's share of it (``consumer.stats``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ClientStats:
    """Counters of what the client received.

    ``compressed`` counts messages that came COMPRESSED and ``bytes_saved`` what inflating them
    added; ``gaps`` counts GAP messages; ``dropped`` counts values a full subscription queue
    discarded; ``goodbye`` is the last GOODBYE as ``(code, reason)``; ``reconnects`` counts
    WELCOMEs after the first; ``flow`` is the fill of the last FLOW (0 before any);
    ``restarted`` counts subscriptions taken again because their topic's numbering restarted
    (UNSUBSCRIBED 11); ``duplicates`` counts ring messages dropped because the client already
    had them (a replay from a position restated after a resume).

    PUBLISH: ``rejected`` counts the PUBLISHes the server refused, of :meth:`~.Client.publish`
    and :meth:`~.Client.enqueue` alike (one WARNING line sums up ``publish()``'s every 5 s at
    most; ``enqueue()``'s are raised as ``ItemRefused``); ``enqueued`` the items ``enqueue()``
    learned were taken, ``unknown`` those whose outcome a lost connection hid
    (``OutcomeUnknown``); ``outcome_pings`` the PINGs sent to learn outcomes (one per
    event-loop turn that sent enqueues, however many).

    Queue topics (every consumer together; :class:`ConsumerStats` has them one by one):
    ``items`` counts ITEMs received; ``codel_returned`` the items client-side CoDel gave back
    (NACK with requeue) instead of handing them over; ``revoked`` the items a REVOKE took out of
    a consumer's buffer before the application took them; ``overflowed`` the items given back
    at once because a consumer's buffer was full.
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
    restarted: int = 0
    duplicates: int = 0
    flow: int = 0
    enqueued: int = 0
    unknown: int = 0
    outcome_pings: int = 0
    goodbye: tuple[int, str] | None = None
    items: int = 0
    codel_returned: int = 0
    revoked: int = 0
    overflowed: int = 0


@dataclass
class ConsumerStats:
    """Counters of one :class:`~rubris_asgi.client.Consumer`.

    ``received``: ITEMs that arrived for it. ``taken``: items handed to the application (by the
    iterator or to the handler). ``acked`` / ``nacked``: ACKs and NACKs the application's
    ``ack()`` / ``nack()`` (or the handler's outcome) sent. ``codel_returned``, ``revoked``,
    ``overflowed``: as in :class:`ClientStats`. ``stale``: ``ack()`` / ``nack()`` calls on items
    of an earlier connection, not sent (the server took those items back when it was lost).
    ``cleared``: items still in the buffer when a connection was lost (the server took them
    back too). ``undecodable``: items whose payload did not inflate or decode (NACKed).
    """

    received: int = 0
    taken: int = 0
    acked: int = 0
    nacked: int = 0
    codel_returned: int = 0
    revoked: int = 0
    overflowed: int = 0
    stale: int = 0
    cleared: int = 0
    undecodable: int = 0

"""The asyncio client: subscribe, call and publish over WebSocket or HTTP long-poll.

One :class:`Client` holds one session with a rubris server mounted at ``url`` (the mount URL,
e.g. ``http://127.0.0.1:8000/rubris``; the WebSocket endpoint ``{mount}/ws`` and the long-poll
endpoint ``{mount}/lp`` are derived from it). It speaks the wire contract of protocol.md through
:mod:`rubris_asgi.protocol` and inflates COMPRESSED payloads with a hard limit.

Example (against a running server)::

    import asyncio

    from rubris_asgi.client import Client


    async def main() -> None:
        async with Client("http://127.0.0.1:8000/rubris") as client:
            sub = await client.subscribe("prices.AAPL")
            print(await client.call("place_order", {"qty": 1}))
            async for value, info in sub:
                print(info.seq, value)


    asyncio.run(main())

How it runs: :meth:`Client.connect` starts one supervisor task that opens a connection, sends
HELLO and waits for WELCOME; then, per connection, one reader task (frames strictly in order;
on long-poll the reader *is* the poll loop), one writer task (client frames in order; on
long-poll one POST at a time, its 202 awaited), an ACK timer and, on WebSocket, a heartbeat.
When the connection drops the supervisor reconnects with exponential backoff and resumes the
session with the token of the last WELCOME; when the server could not resume it, every live
subscription is subscribed again (ring and snapshot topics with ``epoch``/``since``, so a ring
replays what the client missed) and the calls in flight fail with :class:`ConnectionLost`.
:meth:`Client.close` cancels every task the client started and waits for them.

Subscription callbacks, sync or async, run inside the reader, one after the other in the order
of the wire: a callback must not wait for something only a later frame brings (``await
client.call(...)`` inside a callback waits for ever); start a task for that instead.

Everything is bounded: client messages wait for room in a 10 000-message outbox, a subscription
without a callback keeps at most 10 000 values (the oldest is dropped and counted in
``stats.dropped``; NAK tells the server at 50, 75, 87 and 100 %), and a streamed reply that is
not consumed pushes back on the reader.

Exceptions (all :class:`~rubris_asgi.errors.RubrisError`)::

    ConnectionLost       the connection or session is gone (also a builtin ConnectionError)
    CallError            a call answered with an error: .code, .message
    SubscribeRejected    SUBSCRIBE answered with REJECTED: .code, .reason
    SubscriptionEnded    the subscription is over (unsubscribed, or ended by the server)
    ProtocolError        the server sent something malformed (the client closes)
"""

from __future__ import annotations

from .core import Client, ClientStats, Rejection, State
from .errors import CallError, ConnectionLost, SubscribeRejected, SubscriptionEnded
from .outbox import OUTBOX_SIZE as OUTBOX_SIZE
from .subscription import GAPS_KEPT as GAPS_KEPT
from .subscription import NAK_LEVELS as NAK_LEVELS
from .subscription import QUEUE_SIZE as QUEUE_SIZE
from .subscription import GapInfo, PushInfo, Subscription

__all__ = [
    "CallError",
    "Client",
    "ClientStats",
    "ConnectionLost",
    "GapInfo",
    "PushInfo",
    "Rejection",
    "SubscribeRejected",
    "Subscription",
    "SubscriptionEnded",
    "State",
]

"""The asyncio client: subscribe, consume, call and publish over WebSocket or HTTP long-poll.

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

The API, on :class:`Client`::

    await client.connect() / close()      or   async with Client(url) as client: ...
    await client.wait_closed()   (until closed; raises ConnectionLost when it gave up by itself)
    sub = await client.subscribe(name, callback=None, *, params=None, on_gap=None, last=None)
    await client.unsubscribe(sub)
    consumer = await client.consume(name, handler=None, *, prefetch=None,
                                    codel_target=0.020, codel_interval=0.100)
    await client.call(method, args=None, *, timeout=30)     async for x in client.stream(...)
    await client.publish(name, value)   await client.ping()   await client.send_nak(fill)
    await client.enqueue(name, value)   (a work item: returns when the server took it)
    refused = await client.enqueue_many(name, values)    (many: the ItemRefused, by .index)
    state = await client.watch_batch(batch, *, on_update=None, timeout=None)    (protocol.md 8c)
    sub = await client.subscribe(name, ..., max_rate=None)    (a snapshot: at most r values/s)
    book = await client.subscribe_table(name, on_change=None, *, max_rate=None)  (protocol.md 5b)
    room = await client.presence(name, on_join=None, on_leave=None, on_update=None)
    count = await client.presence_count(name, on_change=None)
    client.state, client.stats, client.session_id, client.resumed, client.rejections
    Client(url, ..., on_refused=callback)   (told each Rejection of publish(): topic, value)

Queue topics (mode 4) are consumed, not subscribed: :meth:`Client.consume` returns a
:class:`Consumer`, an async iterator of :class:`QueueItem` (``item.value``, ``.tag``,
``.attempt``, ``.topic``, ``.received``), each settled once with ``item.ack()`` or
``item.nack(requeue=True)``; or, given a handler, hands the items to it one at a time in a task
of its own, ACKing each when the handler returns and NACKing it (requeue) when it raises.
``await consumer.close()`` unsubscribes; the server takes back what was not acknowledged. ACKs
made in one event-loop turn go out together at its end; a local CoDel gives back items that
waited too long in the consumer's buffer; REVOKE drops items not yet taken; an item of a lost
connection is never acknowledged. :mod:`rubris_asgi.client.consumer` tells the whole of it.
``subscribe()`` on a queue topic, or ``consume()`` on another, raises
:class:`SubscribeRejected` with code 0.

Keyed topics (mode 5, live tables) are subscribed with :meth:`Client.subscribe_table`, which
returns a :class:`TableSubscription`: ``book.table`` is a read-only :class:`Table` (a mapping of
key to value) the reader keeps equal to the server's, ``await book.wait_synced()`` waits for it
to be whole, and each :class:`Change` (``key``, ``op``: set, patch, delete, reset, synced,
``value``, ``seq``) goes to ``on_change`` or to ``async for change in book``. Presence:
:meth:`Client.presence` follows ``{name}@presence`` as a :class:`Presence` (``members``,
``count``, ``on_join``/``on_leave``/``on_update``, one member per user however many tabs), and
:meth:`Client.presence_count` ``{name}@count`` as a :class:`PresenceCount` (``members``,
``sessions``). A resumed session restates each table's epoch and seq as it does its rings, and
a new session subscribes again with them: the server sends what changed since, or RESET and the
whole table; a resume is never a leave. :mod:`rubris_asgi.client.tables` and
:mod:`rubris_asgi.client.presence` tell the rest.

How it runs: :meth:`Client.connect` starts one supervisor task that opens a connection, sends
HELLO and waits for WELCOME; then, per connection, one reader task (frames strictly in order;
on long-poll the reader *is* the poll loop), one writer task (client frames in order; on
long-poll one POST at a time, its 202 awaited), an ACK timer and, on WebSocket, a heartbeat.
When the connection drops the supervisor reconnects with exponential backoff and resumes the
session with the token of the last WELCOME, stating in the HELLO's frame where each ring topic
stands (a SUBSCRIBE with its ``epoch`` and ``last_seq``: protocol.md section 5, "Resume is
exact"), so the server replays what never reached the client, a GAP first for what its ring
lost, and a ring message is never delivered twice. When the server could not resume it, those
SUBSCRIBEs are the new session's ring subscriptions, every other live subscription and consumer
is subscribed again (snapshot topics with ``epoch``/``since``; consumers with the same
``prefetch``) and the calls in flight fail with :class:`ConnectionLost`. ``subscribe(...,
last=n)`` asks a ring topic for its last n messages first (a late joiner), on the first
SUBSCRIBE only. Queue items held when a connection drops are the
server's again, resumed or not: a consumer's buffer is emptied then.
:meth:`Client.close` cancels every task the client started and waits for them.

What it retries, and what it says: a node that is starting or stopping answers "not now"
(WebSocket close 1012 or 1013, HTTP 503 with ``Retry-After``), and so does a dropped
connection: the client tries again, every ``backoff`` seconds with jitter (and not before a
``Retry-After``), logging one WARNING per outage on the ``rubris_asgi.client`` logger (what
happened, and that it is reconnecting; each attempt is a DEBUG line, the return an INFO one). A
refusal for good (an origin or credentials refused, a bare 403 or 404 where no rubris endpoint
is: "is the mount path right?") ends the client: :meth:`Client.connect` raises it at the first
connection; later, :meth:`Client.wait_closed` does, and when nobody waits there the client logs
it as an ERROR ("giving up: ..."), so that it never ends silently.

Subscription callbacks, sync or async, run inside the reader, one after the other in the order
of the wire: a callback must not wait for something only a later frame brings (``await
client.call(...)`` inside a callback waits for ever); start a task for that instead. A
consumer's handler is different: it runs in a task of its own (one per consumer), so the reader
goes on reading (and sees a REVOKE) while it works, and it may await anything.

Everything is bounded: client messages wait for room in a 10 000-message outbox, a subscription
without a callback keeps at most 10 000 values (the oldest is dropped and counted in
``stats.dropped``; NAK tells the server at 50, 75, 87 and 100 %), a consumer's buffer keeps at
most 10 000 items (the server's prefetch keeps it far lower; an item past it is given back at
once and counted in ``stats.overflowed``), and a streamed reply that is not consumed pushes
back on the reader.

Publishing from outside a session: :class:`Publisher` (asyncio) and :class:`SyncPublisher`
(threads) POST to the HTTP API (protocol.md section 8b) through httpx, batched and paced by the
server's fill, and raise :class:`PublishError`; :mod:`rubris_asgi.client.publisher` tells the
rest. They are imported on first use, as httpx is by the first long-poll connection.

Exceptions (all :class:`~rubris_asgi.errors.RubrisError`)::

    ConnectionLost       the connection or session is gone (also a builtin ConnectionError)
    CallError            a call answered with an error: .code, .message, .method
    SubscribeRejected    SUBSCRIBE answered with REJECTED: .code, .reason, .topic (code 0: the
                         topic is of the other kind: a queue for subscribe(), not consume())
    SubscriptionEnded    the subscription or consumer is over (unsubscribed, or ended by the
                         server)
    ItemRefused          enqueue()'s item refused by the server (REJECTED): .code, .reason,
                         .topic, .value; nothing was queued
    OutcomeUnknown       enqueue()'s connection was lost after its PUBLISH was sent, before
                         its outcome came: the item may be queued or not (a ConnectionLost;
                         a plain ConnectionLost from enqueue() means it was never sent)
    ProtocolError        the server sent something malformed (the client closes)
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .batches import watch_batch
from .consumer import Consumer, QueueItem
from .core import Client, ClientStats, Rejection, State
from .errors import (
    CallError,
    ConnectionLost,
    ItemRefused,
    OutcomeUnknown,
    SubscribeRejected,
    SubscriptionEnded,
)
from .outbox import OUTBOX_SIZE as OUTBOX_SIZE
from .outcomes import ENQUEUE_WINDOW as ENQUEUE_WINDOW
from .outcomes import PUBLISHES_KEPT as PUBLISHES_KEPT
from .presence import Presence, PresenceCount
from .stats import ConsumerStats
from .subscription import GAPS_KEPT as GAPS_KEPT
from .subscription import NAK_LEVELS as NAK_LEVELS
from .subscription import QUEUE_SIZE as QUEUE_SIZE
from .subscription import GapInfo, PushInfo, Subscription
from .table import Change, Table
from .tables import TableSubscription

if TYPE_CHECKING:
    from .publisher import Publisher, PublishError, PublisherStats, SyncPublisher

# The HTTP publisher's names load on first use (PEP 562): a process that only subscribes or
# consumes does not import the publisher's module (nor, through it, httpx).
_LAZY = {
    "Publisher": ".publisher",
    "PublishError": ".publisher",
    "PublisherStats": ".publisher",
    "SyncPublisher": ".publisher",
}


def __getattr__(name: str) -> Any:
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(home, __name__), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "CallError",
    "Change",
    "Client",
    "ClientStats",
    "ConnectionLost",
    "Consumer",
    "ConsumerStats",
    "GapInfo",
    "ItemRefused",
    "OutcomeUnknown",
    "Presence",
    "PresenceCount",
    "PublishError",
    "Publisher",
    "PublisherStats",
    "PushInfo",
    "QueueItem",
    "Rejection",
    "SubscribeRejected",
    "Subscription",
    "SubscriptionEnded",
    "State",
    "SyncPublisher",
    "Table",
    "TableSubscription",
    "watch_batch",
]

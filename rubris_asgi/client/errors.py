"""The client's exceptions, and the internal signals that end one connection."""

from __future__ import annotations

from typing import Any

from ..errors import RubrisError
from ..protocol.naming import quoted

__all__ = [
    "CallError",
    "ConnectionLost",
    "ItemRefused",
    "OutcomeUnknown",
    "SubscribeRejected",
    "SubscriptionEnded",
]


class ConnectionLost(RubrisError, ConnectionError):
    """The connection (or the session behind it) is gone; ``__cause__`` says why when known."""


class OutcomeUnknown(ConnectionLost):
    """``Client.enqueue``: the connection was lost after the item's PUBLISH left the client and
    before its outcome came back, so the server may or may not have queued it (never take it
    for refused). ``topic`` and ``value`` name the item; from ``Client.enqueue_many``, ``value``
    is the list of the values whose outcome is unknown (the others were taken or refused).

    A ``ConnectionLost`` (the connection *is* lost, and code that reconnects on one goes on
    working), of its own class because a plain ``ConnectionLost`` from ``enqueue`` means the
    PUBLISH never left the client: nothing was queued, the item may be sent again as it is. After
    ``OutcomeUnknown`` sending it again may queue it twice: give items an identity in their
    payload and make consumers idempotent (delivery is at least once anyway).
    """

    def __init__(self, message: str, topic: str, value: Any) -> None:
        super().__init__(message)
        self.topic = topic
        self.value = value


def _subject(action: str, name: str, reason: str, link: str = "") -> str:
    """What was refused, as an error text begins: ``action`` and the name (``enqueue to
    'jobs'``), or ``action`` alone where the server's ``reason`` shows the name already
    (``unknown topic 'prics.AAPL'``), so that it is printed once whichever server answered (an
    older server's reason names nothing)."""
    shown = quoted(name)
    return action if not name or shown in reason else f"{action} {link}{shown}"


class ItemRefused(RubrisError):
    """``Client.enqueue``: the server refused the item (REJECTED): nothing was queued.

    ``code`` is the protocol's (section 9: 6, too many, when the queue is full; 3 when the
    topic is unknown or takes no client PUBLISH), ``reason`` the server's (for a full queue it
    names the queue and its fill), ``topic`` and ``value`` the item, ``index`` its place in the
    values of ``Client.enqueue_many`` (0 for ``enqueue``). Its text names the topic once:
    ``enqueue to 'jobs' refused: rate limited (code 10)``, ``enqueue refused: queue 'jobs' is
    full (10000 waiting): fill 100 % (code 6)``.
    """

    def __init__(self, code: int, reason: str, topic: str, value: Any, index: int = 0) -> None:
        subject = _subject("enqueue", topic, reason, "to ")
        super().__init__(f"{subject} refused: {reason} (code {code})")
        self.code = code
        self.reason = reason
        self.topic = topic
        self.value = value
        self.index = index


class CallError(RubrisError):
    """A call answered with an error RESULT: ``code`` (protocol.md section 9), the server's
    ``message``, and the ``method`` called ("" when not known).

    Its text names the method: ``call 'place_order' failed: insufficient funds (code 10)``, or
    ``call failed: unknown method 'plce_order' (code 3)`` when the message names it already.
    """

    def __init__(self, code: int, message: str, *, method: str = "") -> None:
        # without a method (made by code of its own), the text it always had
        subject = f"{_subject('call', method, message)} failed: " if method else ""
        super().__init__(f"{subject}{message} (code {code})")
        self.code = code
        self.message = message
        self.method = method


class SubscribeRejected(RubrisError):
    """SUBSCRIBE was answered with REJECTED: ``code``, the server's ``reason``, and the
    ``topic`` asked for ("" when not known).

    ``code`` 0: the client refused the topic itself, because it is of the other kind
    (``subscribe()`` of a queue topic, ``consume()`` of one that is not).

    Its text names the topic once, whatever the server's reason says:
    ``subscribe 'prices.AAPL' refused: not for you (code 10)``,
    ``subscribe refused: unknown topic 'prics.AAPL' (code 3)``.
    """

    def __init__(self, code: int, reason: str, *, topic: str = "") -> None:
        subject = f"{_subject('subscribe', topic, reason)} refused: " if topic else ""
        super().__init__(f"{subject}{reason} (code {code})")
        self.code = code
        self.reason = reason
        self.topic = topic


class SubscriptionEnded(RubrisError):
    """The subscription is over: ``code`` 0 when the client unsubscribed or closed, else the
    server's code (UNSUBSCRIBED or REJECTED on a re-subscribe) and ``reason``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{reason} (code {code})" if code else reason)
        self.code = code
        self.reason = reason


# --------------------------------------------------------------------------- internal signals


class _Lost(Exception):
    """The connection ended in a way a reconnect can repair."""


class _Fatal(Exception):
    """The connection ended in a way a reconnect cannot repair (auth, protocol, superseded)."""


class _Bye(Exception):
    """The server said GOODBYE."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"server said goodbye: {reason} (code {code})")
        self.code = code
        self.reason = reason


def _lost(message: str, cause: BaseException | None = None) -> ConnectionLost:
    exc = ConnectionLost(message)
    exc.__cause__ = cause
    return exc


def _copy(exc: BaseException) -> BaseException:
    """A fresh instance to raise, so that one stored error does not grow every traceback."""
    if isinstance(exc, SubscriptionEnded):
        return SubscriptionEnded(exc.code, exc.reason)
    if isinstance(exc, ConnectionLost):
        return _lost(str(exc), exc.__cause__)
    return exc

"""The exceptions rubris_asgi raises, and the protocol error codes they carry.

Tree::

    RubrisError
    ├── ProtocolError          malformed or refused wire input; carries an ErrorCode
    ├── MessageTooLarge        a publish over the configured maximum (code 5)
    ├── QueueFull              send_nowait() on a full private queue; enqueue() on a full work queue
    ├── TableFull              a set of a new key on a keyed topic at its max_keys (code 6)
    ├── BrokerUnavailable      Redis cannot take a publish, an enqueue or a send_to now
    │   └── BrokerStartupError Redis out of reach, or refusing this node, at start (a StartupError)
    ├── StartupError           rubris cannot start: configuration or environment (a RuntimeError)
    ├── DeliveryUnknown        send_to cannot tell whether its message was queued
    ├── SessionClosed          sending to a session that has ended
    ├── RegistrationClosed     registering a channel or method after start-up
    ├── Reject                 raised by application handlers to refuse (code 10)
    └── BatchError             a batch-tracking request refused; carries its HTTP status
        ├── MalformedItem      an item id not of the form {batch}:{group}:{index} (400)
        ├── ItemOutOfRange     a group the batch does not have, an index past its group (400)
        ├── BadCount           an add of no items, or past the batch's maximum (400)
        ├── UnknownBatch       no such batch, or forgotten (404)
        ├── BatchSealed        adding to a batch that is no longer open (409)
        └── BatchExists        opening a batch with the id of one that exists (409)
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Error codes of protocol.md section 9."""

    PROTOCOL = 1
    UNSUPPORTED_VERSION = 2
    UNKNOWN = 3
    NOT_AUTHORISED = 4
    TOO_LARGE = 5
    TOO_MANY = 6
    SLOW_CONSUMER = 7
    SESSION_EXPIRED = 8
    SHUTTING_DOWN = 9
    REJECTED = 10
    RESTARTED = 11


class RubrisError(Exception):
    """Base class of every error rubris_asgi raises on purpose."""


class ProtocolError(RubrisError):
    """Wire input that cannot be accepted.

    ``code`` is the protocol error code to send back (GOODBYE, REJECTED or an
    HTTP 400/413 body); ``str(err)`` says what was expected and what came.
    """

    def __init__(self, message: str, code: ErrorCode = ErrorCode.PROTOCOL) -> None:
        super().__init__(message)
        self.code = code

    def __repr__(self) -> str:
        return f"ProtocolError({str(self)!r}, code={self.code.name})"


class MessageTooLarge(RubrisError):
    """A message is larger than the writer pool's maximum; it was not sent to anyone."""

    code = ErrorCode.TOO_LARGE


class QueueFull(RubrisError):
    """``send_nowait`` found the session's private queue for that topic at capacity, or
    ``enqueue`` found a work queue at its ``max_length``; nothing was added."""

    code = ErrorCode.TOO_MANY


class TableFull(RubrisError):
    """A set (or a replace) would take a keyed topic past its ``max_keys`` live keys; nothing
    of it was applied."""

    code = ErrorCode.TOO_MANY


class BrokerUnavailable(RubrisError):
    """The broker that numbers shared publishes across nodes (Redis) cannot take one now: it
    is unreachable, or what waits for it reached its bound. Nothing of this publish was
    accepted; what was accepted before is kept and sent when the broker is back."""

    code = ErrorCode.TOO_MANY


class StartupError(RubrisError, RuntimeError):
    """rubris cannot start, for a reason of configuration or environment rather than a bug:
    Redis out of reach or refusing (``BrokerStartupError``), a Redis that would lose what it
    must keep (``RedisNotDurable``), several workers without a broker, a batch store that
    cannot be opened. ``str(err)`` is one line that names what failed and what to do.

    ``rubris_asgi.serve`` prints it as one ERROR line, ``rubris: {err}`` (the traceback goes to
    the ``rubris_asgi`` logger at DEBUG), and exits with code 3; so does ``RubrisMiddleware``
    under any server. A ``RuntimeError`` too: what ``Rubris.start`` raised for several workers
    without a broker before this class existed."""


class BrokerStartupError(BrokerUnavailable, StartupError):
    """The broker cannot start: Redis out of reach (refused, unknown host, no answer within
    ``connect_timeout``), refusing this node (its credentials, a missing permission, a replica
    that takes no writes), or not ready. Its cause is logged at DEBUG, not chained: the one
    line says what to do."""


class DeliveryUnknown(RubrisError):
    """``send_to`` cannot tell whether the message was queued: its request reached, or may
    have reached, the session's node, and the answer did not come back (Redis stalled or lost
    the connection after the request was written, the node stalled, or this node stopped
    while waiting). Unlike the other errors of ``send_to``, which all mean *not queued*, the
    message may be in the session's queue: send it again with the same ``key`` and the
    session's node queues it only if it did not already (the answer is then its seq)."""


class SessionClosed(RubrisError):
    """The session has ended; nothing more can be sent to it."""

    code = ErrorCode.SESSION_EXPIRED


class RegistrationClosed(RubrisError):
    """Channels and methods must be registered before the app starts."""


class Reject(RubrisError):
    """Raised by a subscribe or call handler to refuse with the application's own reason.

    >>> raise Reject("unknown symbol")  # doctest: +SKIP

    The client receives REJECTED (or a RESULT with status 1) with code 10 and this reason.
    ``code`` may be set to another protocol code, e.g. ``ErrorCode.NOT_AUTHORISED``.
    """

    def __init__(self, reason: str, code: ErrorCode = ErrorCode.REJECTED) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class BatchError(RubrisError):
    """A batch-tracking request that changed nothing; ``status`` is its HTTP status."""

    status = 400

    def __init__(self, reason: str, item: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.item = item
        """The item id at fault, when one is."""


class MalformedItem(BatchError):
    """An item id that is not ``{batch}:{group}:{index}`` (decimal group and index)."""


class ItemOutOfRange(BatchError):
    """An item id naming a group its batch does not have, or an index past its group."""


class BadCount(BatchError):
    """An add of fewer than one item, or one that takes the batch past its maximum."""


class UnknownBatch(BatchError):
    """No batch has this id: never opened, or forgotten a while after it ended."""

    status = 404


class BatchSealed(BatchError):
    """Items added to a batch that is sealed, complete or expired."""

    status = 409


class BatchExists(BatchError):
    """A batch was opened with the id of a batch that still exists (complete ones included)."""

    status = 409

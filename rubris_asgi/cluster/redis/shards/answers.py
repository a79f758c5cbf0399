"""What a Redis Cluster node's error reply says about the command it answers: run elsewhere
(``MOVED``, ``ASK``), not now (``TRYAGAIN``, ``CLUSTERDOWN``), or run again with the script's
body (``NOSCRIPT``). Each of these means the command did not run, so sending it again doubles
nothing.

redis-py 8 parses these errors into ``MovedError``, ``AskError``, ``TryAgainError`` and
``ClusterDownError`` and strips the code from the text (``"3999 127.0.0.1:6381"``); redis-py 5
gives a plain ``ResponseError`` with the whole text (``"MOVED 3999 127.0.0.1:6381"``) on a
non-cluster connection. Both are read here, and what is raised to callers is the same in both:
``TryAgainError`` and ``SlotsRefused``, both of ``nodes.REFUSING``.
"""

from __future__ import annotations

from redis.exceptions import (
    AskError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    NoScriptError,
    ResponseError,
    TryAgainError,
)

from .address import Address
from .slotmap import Redirect, redirect_of

MOVED = "MOVED"
ASK = "ASK"
TRYAGAIN = "TRYAGAIN"
CLUSTERDOWN = "CLUSTERDOWN"
NOSCRIPT = "NOSCRIPT"


class SlotsRefused(MasterDownError):
    """``CLUSTERDOWN``: the cluster serves no command on this slot now (its master failed and
    no replica took over, the cluster lost its majority, or the slot has no master). Nothing
    ran. A ``MasterDownError``, so one of ``nodes.REFUSING`` in every redis-py: retried after a
    pause by ``Reach.until_answered``, and reported as Redis refusing, as a replica cut off
    from its master is."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


def kind_of(reply: object) -> str | None:
    """Which of the errors above ``reply`` is, or None (a value, or another error: one the
    command raised while it ran, which is the caller's)."""
    if not isinstance(reply, ResponseError):
        return None
    if isinstance(reply, NoScriptError):
        return NOSCRIPT
    if isinstance(reply, MovedError):  # before AskError, its base in redis-py 8
        return MOVED
    if isinstance(reply, AskError):
        return ASK
    if isinstance(reply, TryAgainError):
        return TRYAGAIN
    if isinstance(reply, ClusterDownError) and not isinstance(reply, MasterDownError):
        return CLUSTERDOWN
    if isinstance(reply, SlotsRefused):
        return CLUSTERDOWN
    code = str(reply).split(" ", 1)[0]
    if code in (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, NOSCRIPT):
        return code
    return None


def redirect(reply: ResponseError, kind: str, answered: Address) -> Redirect | None:
    """Where a ``MOVED``/``ASK`` reply sends its command; a node that gave no host means the
    host of the node that ``answered``."""
    slot = getattr(reply, "slot_id", None)
    host = getattr(reply, "host", None)
    port = getattr(reply, "port", None)
    if isinstance(slot, int) and isinstance(host, str) and isinstance(port, int):
        found: Redirect | None = Redirect(kind, slot, (host, port))
    else:
        found = redirect_of(kind, str(reply))
    if found is not None and not found.address[0]:
        found = Redirect(found.kind, found.slot, (answered[0], found.address[1]))
    return found


def refusal(reply: ResponseError, kind: str) -> ResponseError:
    """What a ``TRYAGAIN`` or ``CLUSTERDOWN`` still standing after the retries raises: one of
    ``nodes.REFUSING`` whatever redis-py parsed it into."""
    text = str(reply)
    if not text.startswith(kind):  # redis-py 8 strips the code: put back for whoever reads
        text = f"{kind} {text}"
    if kind == TRYAGAIN:
        return reply if isinstance(reply, TryAgainError) else TryAgainError(text)
    if kind == CLUSTERDOWN:
        return reply if isinstance(reply, SlotsRefused) else SlotsRefused(text)
    return reply

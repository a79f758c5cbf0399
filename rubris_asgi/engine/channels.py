"""Decorator registration of channels and RPC methods, with topic-name patterns.

A channel pattern names a family of topics: ``prices.{symbol}`` matches ``prices.AAPL`` and hands
``symbol="AAPL"`` to the handler. A parameter matches one or more characters other than ``.``;
``{name:path}`` matches the rest of the name, dots included. The registry freezes when the app
starts: registering later raises ``RegistrationClosed`` (as aiohttp's route tables do), so the
set of topics a client can reach is fixed and cannot be grown from the wire.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import RegistrationClosed
from ..protocol import Codec, Mode
from .keyed.presence import COUNT, PRESENCE, PresenceSpec
from .queues.settings import QueueSettings

F = TypeVar("F", bound=Callable[..., Any])

PublishRule = bool | Callable[..., Any]
"""A channel's ``client_publish``: False (no client PUBLISH), True (a session may PUBLISH to a
topic where the channel's subscribe handler accepts it), or a hook ``(session, **params)`` —
``payload=`` too if it names it — that decides each PUBLISH and may ``raise Reject``."""

_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::(path))?\}")


def compile_pattern(pattern: str) -> tuple[re.Pattern[str], tuple[str, ...]]:
    """A regex for ``pattern`` and the names of its parameters."""
    if not pattern:
        raise ValueError("a channel pattern cannot be empty")
    out: list[str] = []
    names: list[str] = []
    pos = 0
    for m in _PARAM.finditer(pattern):
        out.append(re.escape(pattern[pos : m.start()]))
        name = m.group(1)
        if name in names:
            raise ValueError(f"parameter {name!r} appears twice in {pattern!r}")
        names.append(name)
        out.append(f"(?P<{name}>.+)" if m.group(2) else f"(?P<{name}>[^.]+)")
        pos = m.end()
    out.append(re.escape(pattern[pos:]))
    literal = _PARAM.sub("", pattern)
    if "{" in literal or "}" in literal:
        raise ValueError(f"malformed parameter in channel pattern {pattern!r}")
    return re.compile("".join(out) + r"\Z"), tuple(names)


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _publishing(pattern: str, rule: PublishRule) -> dict[str, Any]:
    """The ``Channel`` fields of a ``client_publish`` setting."""
    if isinstance(rule, bool):
        return {"client_publish": rule}
    if not callable(rule):
        raise TypeError(
            f"channel {pattern!r}: client_publish must be a bool or a callable, got {rule!r}"
        )
    return {
        "client_publish": True,
        "publish_hook": rule,
        "hook_wants_payload": _accepts(rule, "payload"),
    }


@dataclass
class Channel:
    """A registered family of topics and its settings."""

    pattern: str
    mode: Mode
    handler: Callable[..., Any] | None
    regex: re.Pattern[str]
    params: tuple[str, ...]
    ring: int | None = None
    queue: int | None = None
    batch: int = 1
    codec: Codec = Codec.JSON
    compress_at: int | None = None
    client_publish: bool = False
    wants_params: bool = False
    queue_settings: QueueSettings | None = None
    publish_hook: Callable[..., Any] | None = None
    """The application's decision on each client PUBLISH (``client_publish=hook``); None:
    the subscribe handler decides (``client_publish=True``)."""
    hook_wants_payload: bool = False
    keep: float | None = 3600.0
    """Seconds a topic the application published to is kept without subscribers after its
    last publish (None: for ever)."""
    max_topics: int = 100_000
    """Topics of this channel alive at once."""
    max_keys: int | None = None
    """A keyed channel's live keys per topic (None: ``Limits.max_keys``)."""
    presence: PresenceSpec | None = None
    """Who subscribes to its topics is shown on ``{topic}@presence`` and ``{topic}@count``."""
    companions: dict[str, Channel] = field(default_factory=dict)
    """With ``presence``: the channels of ``@presence`` (keyed, when members are shown) and
    ``@count`` (a snapshot), authorised by this channel's handler."""
    companion: str = ""
    """A companion channel's suffix (``@presence``, ``@count``); its handler is the watched
    channel's, asked only whether the session may subscribe (its value is not used)."""
    hidden: bool = False
    """The ``@presence`` of a channel with ``presence="count"``: refused (code 4)."""

    def match(self, name: str) -> dict[str, str] | None:
        m = self.regex.match(name)
        return m.groupdict() if m else None

    @property
    def shared(self) -> bool:
        return self.mode in (Mode.SNAPSHOT, Mode.RING, Mode.KEYED)


@dataclass
class Method:
    """A registered RPC method; ``stream`` methods are async generators (STREAM replies)."""

    name: str
    handler: Callable[..., Any]
    stream: bool


_UNSET: Any = object()


@dataclass
class Registry:
    """Channels and methods, frozen at start-up."""

    compress_at: int | None = 512
    keep: float | None = 3600.0
    """Default ``keep`` of shared channels (``Timing.topic_keep``)."""
    max_topics: int = 100_000
    """Default ``max_topics`` of channels (``Limits.max_topics_per_channel``)."""
    channels: list[Channel] = field(default_factory=list)
    methods: dict[str, Method] = field(default_factory=dict)
    frozen: bool = False
    _exact: dict[str, Channel] = field(default_factory=dict)

    def _check_open(self, what: str) -> None:
        if self.frozen:
            raise RegistrationClosed(
                f"cannot register {what} after the app has started; register at import time"
            )

    def _bound(self, pattern: str, max_topics: int | None) -> int:
        if max_topics is None:
            return self.max_topics
        if isinstance(max_topics, bool) or max_topics < 1:
            raise ValueError(f"channel {pattern!r}: max_topics must be >= 1, got {max_topics}")
        return max_topics

    def _add(self, ch: Channel) -> None:
        if any(c.pattern == ch.pattern for c in self.channels):
            raise ValueError(f"channel {ch.pattern!r} is registered twice")
        self._watched(ch)
        self.channels.append(ch)
        if not ch.params:
            self._exact[ch.pattern] = ch

    def shared(
        self,
        pattern: str,
        *,
        snapshot: bool = False,
        ring: int | None = None,
        keyed: bool = False,
        codec: Codec = Codec.JSON,
        compress_at: int | None = _UNSET,
        client_publish: PublishRule = False,
        keep: float | None = _UNSET,
        max_topics: int | None = None,
        max_keys: int | None = None,
        batch: int = 64,
        presence: bool | str = False,
        presence_info: Callable[[Any], Any] | None = None,
    ) -> Callable[[F], F]:
        """Register a shared channel: ``snapshot=True`` (latest value), ``ring=N`` (last N)
        or ``keyed=True`` (a live table of entries under keys, protocol.md section 5b).

        ``presence=True``: who subscribes to each topic is the keyed topic
        ``{topic}@presence`` (one entry per user, ``{"sessions": n, "info": …}``, ``info``
        what ``presence_info(session)`` returns) and the snapshot ``{topic}@count``
        (``{"members": m, "sessions": n}``), both authorised as ``{topic}`` by the handler;
        ``presence="count"`` offers only the count.

        ``keep``: seconds a topic the application published to outlives its last publish
        without subscribers (default the registry's; None: for ever); ``max_topics``: its
        topics alive at once (default the registry's). Keyed: ``max_keys`` live keys per
        topic (default ``Limits.max_keys``), ``batch`` ENTRY messages per frame at most for
        one subscriber; its topics take no client PUBLISH (their changes are the
        application's: set, patch, delete, replace, or the HTTP API)."""
        self._check_open(f"channel {pattern!r}")
        if snapshot + (ring is not None) + keyed != 1:
            raise ValueError(
                f"channel {pattern!r}: give exactly one of snapshot=True, ring=N or keyed=True"
            )
        if ring is not None and ring < 1:
            raise ValueError(f"channel {pattern!r}: ring must be >= 1, got {ring}")
        if keyed and client_publish is not False:
            raise ValueError(
                f"channel {pattern!r}: a keyed channel takes no client PUBLISH (a change names "
                "a key and an operation: the application makes them, or the HTTP API)"
            )
        if max_keys is not None and (isinstance(max_keys, bool) or max_keys < 1):
            raise ValueError(f"channel {pattern!r}: max_keys must be >= 1, got {max_keys}")
        if isinstance(batch, bool) or batch < 1:
            raise ValueError(f"channel {pattern!r}: batch must be >= 1, got {batch}")
        if presence not in (False, True, "count"):
            raise ValueError(
                f"channel {pattern!r}: presence is True, 'count' or False, got {presence!r}"
            )
        if presence_info is not None and not presence:
            raise ValueError(f"channel {pattern!r}: presence_info needs presence=True")
        spec = PresenceSpec(presence is True, presence_info) if presence else None
        if keep is not _UNSET and keep is not None and not keep > 0:
            raise ValueError(f"channel {pattern!r}: keep must be > 0 or None, got {keep}")
        publishing = _publishing(pattern, client_publish)
        regex, params = compile_pattern(pattern)

        def deco(fn: F) -> F:
            self._check_open(f"channel {pattern!r}")
            self._add(
                Channel(
                    pattern,
                    Mode.SNAPSHOT if snapshot else Mode.KEYED if keyed else Mode.RING,
                    fn,
                    regex,
                    params,
                    ring=ring,
                    batch=batch,
                    max_keys=max_keys,
                    codec=codec,
                    compress_at=self.compress_at if compress_at is _UNSET else compress_at,
                    wants_params=_accepts(fn, "params"),
                    keep=self.keep if keep is _UNSET else keep,
                    max_topics=self._bound(pattern, max_topics),
                    presence=spec,
                    **publishing,
                )
            )
            return fn

        return deco

    def _watched(self, ch: Channel) -> None:
        """The companion channels of a channel with ``presence``: what ``match`` answers for
        ``{topic}@presence`` and ``{topic}@count``."""
        spec = ch.presence
        if spec is None:
            return
        for suffix in (PRESENCE, COUNT):
            keyed = suffix == PRESENCE
            ch.companions[suffix] = Channel(
                ch.pattern + suffix,
                Mode.KEYED if keyed else Mode.SNAPSHOT,
                ch.handler,
                ch.regex,
                ch.params,
                batch=64 if keyed else 1,
                compress_at=ch.compress_at,
                wants_params=ch.wants_params,
                keep=ch.keep,
                max_topics=ch.max_topics,
                companion=suffix,
                hidden=keyed and not spec.members,
            )

    def private(
        self,
        pattern: str,
        *,
        queue: int | None = None,
        batch: int = 1,
        codec: Codec = Codec.JSON,
        compress_at: int | None = _UNSET,
    ) -> Callable[[F], F]:
        """Register a private channel: one lossless, back-pressured queue per session."""
        self._check_open(f"channel {pattern!r}")
        if batch < 1:
            raise ValueError(f"channel {pattern!r}: batch must be >= 1, got {batch}")
        if queue is not None and queue < 1:
            raise ValueError(f"channel {pattern!r}: queue must be >= 1, got {queue}")
        regex, params = compile_pattern(pattern)

        def deco(fn: F) -> F:
            self._check_open(f"channel {pattern!r}")
            self._add(
                Channel(
                    pattern,
                    Mode.PRIVATE,
                    fn,
                    regex,
                    params,
                    queue=queue,
                    batch=batch,
                    codec=codec,
                    compress_at=self.compress_at if compress_at is _UNSET else compress_at,
                    wants_params=_accepts(fn, "params"),
                )
            )
            return fn

        return deco

    def queue(
        self,
        pattern: str,
        settings: QueueSettings,
        *,
        codec: Codec = Codec.JSON,
        compress_at: int | None = _UNSET,
        client_publish: PublishRule = False,
        max_topics: int | None = None,
    ) -> Callable[[F], F]:
        """Register a work-queue channel: each item to one consumer (protocol.md 5)."""
        self._check_open(f"channel {pattern!r}")
        publishing = _publishing(pattern, client_publish)
        regex, params = compile_pattern(pattern)

        def deco(fn: F) -> F:
            self._check_open(f"channel {pattern!r}")
            self._add(
                Channel(
                    pattern,
                    Mode.QUEUE,
                    fn,
                    regex,
                    params,
                    codec=codec,
                    compress_at=self.compress_at if compress_at is _UNSET else compress_at,
                    wants_params=_accepts(fn, "params"),
                    queue_settings=settings,
                    max_topics=self._bound(pattern, max_topics),
                    **publishing,
                )
            )
            return fn

        return deco

    def rpc(self, name: str | None = None) -> Callable[[F], F]:
        """Register an RPC method; an async generator function gives a streamed reply."""

        def deco(fn: F) -> F:
            method = name or fn.__name__
            self._check_open(f"method {method!r}")
            if method in self.methods:
                raise ValueError(f"method {method!r} is registered twice")
            stream = inspect.isasyncgenfunction(fn)
            self.methods[method] = Method(method, fn, stream)
            return fn

        return deco

    def match(self, name: str) -> tuple[Channel, dict[str, str]] | None:
        """The channel ``name`` belongs to and its parameters (exact names first); a name
        ending ``@presence`` or ``@count`` of a channel with ``presence``, its companion."""
        if name.endswith(PRESENCE) or name.endswith(COUNT):
            # reserved: a presence topic of a channel with presence, else no topic at all (a
            # parameter taking "x@presence" would serve a client asking for presence where
            # there is none a topic of the wrong kind)
            suffix = PRESENCE if name.endswith(PRESENCE) else COUNT
            found = self._match(name[: -len(suffix)])
            if found is not None and found[0].presence is not None:
                return found[0].companions[suffix], found[1]
            return None
        return self._match(name)

    def _match(self, name: str) -> tuple[Channel, dict[str, str]] | None:
        ch = self._exact.get(name)
        if ch is not None:
            return ch, {}
        for ch in self.channels:
            if ch.params:
                got = ch.match(name)
                if got is not None:
                    return ch, got
        return None

    def freeze(self) -> None:
        """Close registration; a queue's ``dead_letter`` must name a queue topic by then."""
        for ch in self.channels:
            dl = ch.queue_settings.dead_letter if ch.queue_settings else None
            if dl is None:
                continue
            found = self.match(dl)
            if found is None or found[0].mode != Mode.QUEUE:
                raise ValueError(
                    f"queue channel {ch.pattern!r}: dead_letter {dl!r} matches no queue channel"
                )
            if found[0] is ch:
                raise ValueError(
                    f"queue channel {ch.pattern!r}: dead_letter {dl!r} is one of its own topics"
                )
        self.frozen = True

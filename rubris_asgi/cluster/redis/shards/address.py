"""What a ``redis+cluster://`` URL names: the seed nodes a sharded client first asks for the
slot map, the credentials every node of the cluster shares, and a few options. Sans-IO.

``redis+cluster://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...][/][?OPTION=VALUE&...]``:
the port is 6379 where none is given, an IPv6 host is written in brackets (``[::1]:7000``).
One seed is enough (it names the others); more let a client start while one is down. There is
no database number: a cluster has only database 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

SCHEME = "redis+cluster"
DEFAULT_PORT = 6379

OPTIONS: dict[str, type] = {
    "socket_timeout": float,
    "socket_connect_timeout": float,
    "max_connections": int,
    "pool_timeout": float,
}
"""The options a URL may carry, with their types; any other is refused, so that a mistyped
one is not silently ignored."""

Address = tuple[str, int]
"""A node's (host, port)."""


@dataclass(frozen=True)
class ClusterTarget:
    """What a ``redis+cluster://`` URL names."""

    seeds: tuple[Address, ...]
    username: str | None = None
    password: str | None = None
    options: dict[str, float | int] = field(default_factory=dict)


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (its scheme is ``redis+cluster``)."""
    return urlsplit(url).scheme == SCHEME


def cluster_url(url: str) -> ClusterTarget:
    """The seeds, credentials and options of a ``redis+cluster://`` URL. Raises
    ``ValueError`` for another scheme, no seed, a port that is no number, a database number,
    or an option unknown or of the wrong type."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME:
        raise ValueError(f"{_hidden(url)!r} is not a {SCHEME}:// URL")
    netloc = parts.netloc
    username = password = None
    if "@" in netloc:
        auth, _, netloc = netloc.rpartition("@")
        user, colon, secret = auth.partition(":")
        if colon:
            username, password = unquote(user) or None, unquote(secret) or None
        else:  # redis://SECRET@host, as redis-py reads it: a password alone
            password = unquote(user) or None
    seeds = tuple(_address(hostport, url) for hostport in netloc.split(",") if hostport)
    if not seeds:
        raise ValueError(
            f"{_hidden(url)!r} names no node: {SCHEME}://host:port[,host:port...] (one is enough)"
        )
    if parts.path.strip("/"):
        raise ValueError(f"{_hidden(url)!r}: a cluster has no database number (only 0)")
    options: dict[str, float | int] = {}
    for name, values in parse_qs(parts.query, keep_blank_values=True).items():
        kind = OPTIONS.get(name)
        if kind is None:
            raise ValueError(
                f"{_hidden(url)!r}: unknown option {name!r} (known: {', '.join(OPTIONS)})"
            )
        try:
            value = kind(values[-1])
        except ValueError:
            raise ValueError(
                f"{_hidden(url)!r}: option {name} must be {kind.__name__}, not {values[-1]!r}"
            ) from None
        if value <= 0:
            raise ValueError(f"{_hidden(url)!r}: option {name} must be positive")
        options[name] = value
    return ClusterTarget(seeds, username, password, options)


def _address(hostport: str, url: str) -> Address:
    if hostport.startswith("["):  # [v6]:port
        host, _, rest = hostport[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
    else:
        host, port = hostport, ""
    if not host:
        raise ValueError(f"{_hidden(url)!r}: a seed without a host ({hostport!r})")
    if not port:
        return host, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{_hidden(url)!r}: {port!r} is not a port")
    return host, int(port)


def _hidden(url: str) -> str:
    """``url`` without its password, for errors."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()

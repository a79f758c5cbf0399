"""How error texts name what the caller asked for, on both sides of the wire.

A refusal that names the topic or method the client sent (``unknown topic 'prics.AAPL'``) says
where the typo is; it tells the client only its own input back, never what exists, so names
still cannot be enumerated by probing (protocol.md section 10). :func:`quoted` bounds such a
name, so a reason stays short whatever the client sent. The clients use the same function to
see whether a server's reason already names the subject (a server before this one did not).

:func:`value_refused` turns the encoder's ``TypeError`` (orjson's says only "Type is not JSON
serializable: decimal.Decimal") into one that says what was being sent, where, and what to do.
Callers build it on the exception path alone: encoding a value that is JSON costs nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from .messages import Codec

__all__ = ["NAME_SHOWN", "ValueRefused", "quoted", "raise_refused", "value_refused"]

NAME_SHOWN = 100
"""Characters of a name an error text shows at most; a longer one is cut, with an ellipsis."""

_NOT_SERIALIZABLE = "Type is not JSON serializable: "
"""How orjson's ``TypeError`` for a value of a type it does not know begins."""

_CONVERT = {
    "Decimal": "float(x), str(x)",
    "set": "list(x)",
    "frozenset": "list(x)",
    "bytes": "x.decode(), base64",
    "bytearray": "bytes(x).decode(), base64",
    "memoryview": "bytes(x).decode(), base64",
    "complex": "[x.real, x.imag]",
}
"""The usual conversion of the types people pass by mistake."""

_CONVERT_ANY = "to a dict, list, str, int, float, bool or None"


class ValueRefused(TypeError):
    """A value the encoder refused, its text naming where it was sent and what to do.

    A ``TypeError`` as the encoder's was (``except TypeError`` goes on working); its own class
    so that a caller that wraps another one's errors does not name the subject twice. The
    encoder's own error is its ``__cause__``."""


def quoted(name: str) -> str:
    """``name`` as an error text shows it: quoted as ``repr`` quotes it, and cut after
    ``NAME_SHOWN`` characters (``'aaa…'…``: the quote closes, the ellipsis says there was more).

    >>> quoted("prics.AAPL")
    "'prics.AAPL'"
    >>> quoted("x" * 150) == repr("x" * 100) + "…"
    True
    """
    if len(name) <= NAME_SHOWN:
        return repr(name)
    return repr(name[:NAME_SHOWN]) + "…"


def value_refused(what: str, exc: TypeError, codec: int = Codec.JSON) -> ValueRefused:
    """The error to raise, ``from exc``, instead of the encoder's ``exc``.

    ``what`` says what was being sent (``"publish to 'prices.AAPL'"``), ``codec`` where: on a
    JSON or text topic ``exc`` is orjson's; a bytes topic's says what it takes already.

    >>> import decimal, orjson
    >>> try:
    ...     orjson.dumps({"price": decimal.Decimal("1.5")})
    ... except TypeError as exc:
    ...     print(value_refused("publish to 'p'", exc))  # doctest: +NORMALIZE_WHITESPACE
    publish to 'p': a Decimal is not JSON: convert it (float(x), str(x))
    or pass orjson-compatible values
    """
    text = str(exc)
    if codec == Codec.BYTES:
        return ValueRefused(f"{what}: {text}")
    if text.startswith(_NOT_SERIALIZABLE):
        kind = text[len(_NOT_SERIALIZABLE) :].rpartition(".")[2]  # "decimal.Decimal": Decimal
        hint = _CONVERT.get(kind, _CONVERT_ANY)
        article = "an" if kind and kind[0].lower() in "aeiou" else "a"
        return ValueRefused(
            f"{what}: {article} {kind} is not JSON: convert it ({hint}) or pass"
            " orjson-compatible values"
        )
    # an int past 64 bits, a dict key that is not a str, a str with lone surrogates ...
    return ValueRefused(f"{what}: the value is not JSON ({text}): pass orjson-compatible values")


def raise_refused(
    what: str, exc: TypeError, encode: Callable[[], object], codec: int = Codec.JSON
) -> NoReturn:
    """Raise, from the ``except`` of a call that encodes a value among other things (the
    server's publish: encode, compress, store), what its ``TypeError`` ``exc`` stands for:
    :func:`value_refused`'s error, from ``exc``, when ``encode()`` (the value encoded once
    more, on this failure path alone) refuses the value too; ``exc`` as it was when it came
    from elsewhere (the value is not to blame), or was named already."""
    if not isinstance(exc, ValueRefused):
        try:
            encode()
        except TypeError:
            raise value_refused(what, exc, codec) from exc
    raise exc

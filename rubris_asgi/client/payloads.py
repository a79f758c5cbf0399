"""Values to and from payloads: JSON arguments, pushed values by codec, error RESULT bodies."""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import ErrorCode, ProtocolError
from ..protocol import Codec
from ..protocol.naming import quoted, value_refused
from .errors import CallError


def _dumps(args: Any, method: str = "") -> bytes:
    """A CALL's payload: ``args`` as JSON, empty for None.

    Raises ``TypeError`` naming ``method`` (when given), the type at fault and the fix when
    orjson cannot encode ``args``."""
    if args is None:
        return b""
    try:
        return orjson.dumps(args)
    except TypeError as exc:  # only the failure pays for the words
        what = f"call of {quoted(method)}" if method else "call"
        raise value_refused(what, exc) from exc


def _decode(codec: int, payload: bytes, what: str) -> Any:
    if codec == Codec.JSON:
        if not payload:
            return None
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise ProtocolError(f"{what}: payload is not JSON: {exc}", ErrorCode.PROTOCOL) from None
    if codec == Codec.TEXT:
        try:
            return payload.decode()
        except UnicodeDecodeError as exc:
            raise ProtocolError(
                f"{what}: payload is not UTF-8: {exc}", ErrorCode.PROTOCOL
            ) from None
    return payload  # BYTES, and codecs this client does not know


def _call_error(payload: bytes, method: str = "") -> CallError:
    """The ``CallError`` of an error RESULT's payload, for a call of ``method`` ("" when not
    known)."""
    try:
        body = orjson.loads(payload) if payload else None
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        code = body.get("code", 0)
        code = code if isinstance(code, int) else 0
        return CallError(code, str(body.get("message", "")), method=method)
    return CallError(0, payload.decode("utf-8", "replace"), method=method)

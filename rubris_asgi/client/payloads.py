"""Values to and from payloads: JSON arguments, pushed values by codec, error RESULT bodies."""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import ErrorCode, ProtocolError
from ..protocol import Codec
from .errors import CallError


def _dumps(args: Any) -> bytes:
    return b"" if args is None else orjson.dumps(args)


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


def _call_error(payload: bytes) -> CallError:
    try:
        body = orjson.loads(payload) if payload else None
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        code = body.get("code", 0)
        return CallError(code if isinstance(code, int) else 0, str(body.get("message", "")))
    return CallError(0, payload.decode("utf-8", "replace"))

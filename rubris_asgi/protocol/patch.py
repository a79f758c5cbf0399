"""RFC 7386 JSON merge patches: applied by clients, made by the server (protocol.md section 5b).

A keyed topic sends a changed entry as a PATCH where that is at most half the bytes of the new
value. A merge patch is a JSON object: each member replaces the target's member of that name,
except ``null``, which removes it, and an object, which is merged into the target's member
(made an object first if it was not). Arrays and scalars are replaced whole.

Not every change is a merge patch: a value that *keeps* a ``null`` member inside an object
cannot be reached (the patch's ``null`` would remove it), nor can a value that is not an
object. ``diff`` answers None for those, and the server sends the whole value (SET).
"""

from __future__ import annotations

from typing import Any

import orjson


def apply(target: Any, patch: Any) -> Any:
    """``patch`` applied to ``target`` by RFC 7386; ``target`` is not changed (new objects
    are made where the patch changes something)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            out.pop(name, None)
        elif isinstance(value, dict):
            out[name] = apply(out.get(name), value)
        else:
            out[name] = value
    return out


def diff(old: Any, new: Any) -> dict[str, Any] | None:
    """A merge patch taking ``old`` to ``new``, or None where none can (either is not an
    object, or ``new`` keeps a ``null`` inside an object). Members equal in both are left out,
    so a value that did not change gives ``{}``."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None
    patch: dict[str, Any] = {}
    for name in old:
        if name not in new:
            patch[name] = None
    for name, value in new.items():
        if name in old:
            before = old[name]
            if isinstance(before, dict) and isinstance(value, dict):
                inner = diff(before, value)
                if inner is None:
                    return None
                if inner:
                    patch[name] = inner
                continue
            if _same(before, value):
                continue
        if value is None or _keeps_null(value):
            return None
        patch[name] = value
    return patch


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON, for values that are not both objects: ``1``, ``1.0`` and ``true`` differ
    on the wire, so types must match (and arrays are compared as their JSON)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple, dict)):
        return bool(orjson.dumps(a) == orjson.dumps(b))
    return bool(a == b)


def _keeps_null(value: Any) -> bool:
    """Whether an object in ``value`` (merged, not replaced) has a ``null`` member."""
    if not isinstance(value, dict):
        return False
    return any(v is None or _keeps_null(v) for v in value.values())


__all__ = ["apply", "diff"]

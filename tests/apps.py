"""A small application used by the transport and end-to-end tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Mount

from rubris_asgi import Config, Limits, Reject, Rubris, Session, Timing


def make_rubris(**overrides: Any) -> Rubris:
    limits = overrides.pop("limits", Limits())
    timing = overrides.pop("timing", Timing(poll_timeout=1.0, session_timeout=5.0))
    rubris = Rubris(Config(limits=limits, timing=timing), compress_at=256, **overrides)

    @rubris.shared("snap.{name}", snapshot=True)
    async def snap(session: Session, name: str) -> Any:
        if name == "forbidden":
            raise Reject("not for you")
        return {"initial": name}

    @rubris.shared("ring.{name}", ring=8)
    async def ring(session: Session, name: str) -> None:
        return None

    @rubris.shared("big", snapshot=True, compress_at=None)
    async def big(session: Session) -> None:
        return None

    @rubris.private("inbox", queue=16, batch=4)
    async def inbox(session: Session) -> None:
        return None

    @rubris.rpc("echo")
    async def echo(session: Session, args: Any) -> Any:
        return args

    @rubris.rpc("fail")
    async def fail(session: Session, args: Any) -> Any:
        raise Reject("no such thing")

    @rubris.rpc("whoami")
    async def whoami(session: Session, args: Any) -> Any:
        user = session.user
        return {"session": session.id, "user": getattr(user, "display_name", user)}

    @rubris.rpc("count")
    async def count(session: Session, args: Any) -> AsyncIterator[int]:
        for i in range(int(args)):
            yield i

    @rubris.rpc("fill_inbox")
    async def fill_inbox(session: Session, args: Any) -> int:
        n = 0
        for i in range(int(args)):
            await rubris.send(session, "inbox", {"i": i})
            n += 1
        return n

    return rubris


def starlette_app(rubris: Rubris, path: str = "/rubris") -> Starlette:
    return Starlette(routes=[Mount(path, rubris)], lifespan=rubris.lifespan)

"""Decorator registration, topic-name patterns and the registry freezing at start-up."""

from __future__ import annotations

from typing import Any

import pytest

from rubris_asgi import Mode, RegistrationClosed, Rubris, Session
from rubris_asgi.engine.channels import Registry, compile_pattern


def test_pattern_parameters_match_one_segment() -> None:
    regex, names = compile_pattern("prices.{symbol}")
    assert names == ("symbol",)
    m = regex.match("prices.AAPL")
    assert m is not None and m.groupdict() == {"symbol": "AAPL"}
    assert regex.match("prices.A.B") is None
    assert regex.match("prices.") is None
    assert regex.match("xprices.AAPL") is None


def test_path_parameters_take_the_rest() -> None:
    regex, _ = compile_pattern("files.{path:path}")
    m = regex.match("files.a.b.c")
    assert m is not None and m.groupdict() == {"path": "a.b.c"}


@pytest.mark.parametrize("bad", ["", "a.{x}.{x}", "a.{", "a.}b", "a.{1x}"])
def test_malformed_patterns_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        compile_pattern(bad)


def test_exact_names_win_over_patterns() -> None:
    reg = Registry()

    @reg.shared("news.{kind}", ring=8)
    async def news(session: Session, kind: str) -> None: ...

    @reg.shared("news.top", snapshot=True)
    async def top(session: Session) -> None: ...

    found = reg.match("news.top")
    assert found is not None and found[0].mode == Mode.SNAPSHOT
    found = reg.match("news.sport")
    assert found is not None and found[0].mode == Mode.RING and found[1] == {"kind": "sport"}
    assert reg.match("other") is None


def test_shared_needs_exactly_one_of_snapshot_or_ring() -> None:
    reg = Registry()
    with pytest.raises(ValueError, match="exactly one"):
        reg.shared("a", snapshot=True, ring=4)
    with pytest.raises(ValueError, match="exactly one"):
        reg.shared("a")


def test_duplicates_are_refused() -> None:
    reg = Registry()

    @reg.private("inbox")
    async def inbox(session: Session) -> None: ...

    with pytest.raises(ValueError, match="twice"):

        @reg.private("inbox")
        async def again(session: Session) -> None: ...

    @reg.rpc("m")
    async def m(session: Session, args: Any) -> None: ...

    with pytest.raises(ValueError, match="twice"):

        @reg.rpc("m")
        async def m2(session: Session, args: Any) -> None: ...


def test_handlers_that_take_params_get_them() -> None:
    reg = Registry()

    @reg.shared("q.{a}", snapshot=True)
    async def with_params(session: Session, a: str, params: Any) -> None: ...

    @reg.shared("r.{a}", snapshot=True)
    async def without(session: Session, a: str) -> None: ...

    assert reg.match("q.1")[0].wants_params  # type: ignore[index]
    assert not reg.match("r.1")[0].wants_params  # type: ignore[index]


def test_stream_methods_are_async_generators() -> None:
    reg = Registry()

    @reg.rpc()
    async def plain(session: Session, args: Any) -> int:
        return 1

    @reg.rpc()
    async def streamed(session: Session, args: Any) -> Any:
        yield 1

    assert not reg.methods["plain"].stream
    assert reg.methods["streamed"].stream


async def test_registering_after_start_raises_a_clear_error() -> None:
    rubris = Rubris()
    async with rubris:
        with pytest.raises(RegistrationClosed, match="after the app has started"):

            @rubris.shared("late", snapshot=True)
            async def late(session: Session) -> None: ...

        with pytest.raises(RegistrationClosed):

            @rubris.rpc("late")
            async def late_rpc(session: Session, args: Any) -> None: ...

    assert not rubris.started


async def test_publish_needs_a_shared_channel() -> None:
    rubris = Rubris()

    @rubris.private("inbox")
    async def inbox(session: Session) -> None: ...

    @rubris.shared("t.{x}", ring=4)
    async def t(session: Session, x: str) -> None: ...

    from rubris_asgi import ProtocolError

    with pytest.raises(ProtocolError, match="no shared channel"):
        rubris.publish("inbox", 1)
    with pytest.raises(ProtocolError, match="no shared channel"):
        rubris.publish("nothing", 1)
    assert rubris.publish("t.a", 1) == 1
    assert rubris.publish("t.a", 2) == 2

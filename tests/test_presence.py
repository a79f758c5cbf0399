"""Presence (protocol.md section 5b) on one node: members by user, counts, resume is no leave."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from rubris_asgi.engine.channels import Registry
from rubris_asgi.engine.engine import Engine
from rubris_asgi.engine.keyed.presence import member_of
from rubris_asgi.engine.keyed.topic import KeyedTopic
from rubris_asgi.engine.session import Session

from .enginekit import FakeClock, RecordingSink


def setup(**kw: Any) -> tuple[Engine, Registry]:
    reg = Registry()

    @reg.shared("room.{id}", ring=8, **kw)
    def room(session: Any, id: str) -> None:  # noqa: A002
        return None

    return Engine(clock=FakeClock()), reg


def join(e: Engine, reg: Registry, owner: Any, name: str = "room.1") -> Session:
    s = e.open_session(owner=owner)
    e.attach(s, RecordingSink(e, s))
    ch, _ = reg.match(name)  # type: ignore[misc]
    e.subscribe(s, e.topic_of(name, ch), 1, 0, 0)
    return s


def members(e: Engine, name: str = "room.1") -> dict[str, Any]:
    t = e.topics.get(name + "@presence")
    assert isinstance(t, KeyedTopic)
    return {k: orjson.loads(v) for k, v in t.items()}


def _value(t: Any) -> Any:
    from rubris_asgi.protocol import decode_frame

    (m,) = decode_frame(t.msg)
    return orjson.loads(m.payload)


def test_one_member_per_user_however_many_sessions() -> None:
    e, reg = setup(presence=True, presence_info=lambda s: {"name": str(s.owner).upper()})
    a1 = join(e, reg, "alice")
    a2 = join(e, reg, "alice")
    join(e, reg, "bob")
    assert members(e) == {
        "alice": {"sessions": 2, "info": {"name": "ALICE"}},
        "bob": {"sessions": 1, "info": {"name": "BOB"}},
    }
    assert _value(e.topics["room.1@count"]) == {"members": 2, "sessions": 3}
    e.end_session(a1)
    assert members(e)["alice"]["sessions"] == 1
    e.end_session(a2)
    assert list(members(e)) == ["bob"]
    assert _value(e.topics["room.1@count"]) == {"members": 1, "sessions": 1}


def test_a_lost_connection_is_not_a_leave_but_the_session_end_is() -> None:
    e, reg = setup(presence=True)
    s = join(e, reg, "carol")
    seq = e.topics["room.1@presence"].seq
    e.detach(s)
    e.attach(s, RecordingSink(e, s))  # resumed
    ch, _ = reg.match("room.1")  # type: ignore[misc]
    e.subscribe(s, e.topic_of("room.1", ch), 2, 0, 0)  # a resuming client restates it
    assert e.topics["room.1@presence"].seq == seq  # no change at all
    e.detach(s)
    e.end_session(s)  # the session timeout
    assert members(e) == {}


def test_anonymous_sessions_are_members_of_their_own_never_named_by_id() -> None:
    e, reg = setup(presence=True)
    s1 = join(e, reg, None)
    s2 = join(e, reg, None)
    got = members(e)
    assert len(got) == 2
    assert all(s.id not in key for s in (s1, s2) for key in got)
    assert member_of(None, s1.id) in got
    assert member_of(("User", 42), "x") == "42"


def test_unsubscribe_leaves_and_other_topics_are_separate() -> None:
    e, reg = setup(presence=True)
    s = join(e, reg, "dave")
    join(e, reg, "erin", "room.2")
    e.unsubscribe(s, e.topics["room.1"].number)
    assert members(e) == {}
    assert list(members(e, "room.2")) == ["erin"]


def test_count_only_channels_hide_their_members() -> None:
    e, reg = setup(presence="count")
    join(e, reg, "frank")
    ch, _ = reg.match("room.1@presence")  # type: ignore[misc]
    assert ch.hidden
    ch, _ = reg.match("room.1@count")  # type: ignore[misc]
    assert not ch.hidden and ch.companion == "@count"
    assert _value(e.topics["room.1@count"]) == {"members": 1, "sessions": 1}


def test_presence_topics_are_kept_while_members_are_there() -> None:
    e, reg = setup(presence=True)
    join(e, reg, "gina")
    clock: FakeClock = e.clock  # type: ignore[assignment]
    clock.advance(10_000)
    e.retire(clock(), lambda name: False)
    assert "room.1@presence" in e.topics and members(e) == {"gina": {"sessions": 1, "info": None}}


def test_registration_checks() -> None:
    reg = Registry()
    with pytest.raises(ValueError, match="presence"):
        reg.shared("a", snapshot=True, presence="yes")
    with pytest.raises(ValueError, match="presence_info needs"):
        reg.shared("b", snapshot=True, presence_info=lambda s: None)
    with pytest.raises(ValueError, match="no client PUBLISH"):
        reg.shared("c", keyed=True, client_publish=True)


def test_presence_names_are_reserved_where_there_is_no_presence() -> None:
    reg = Registry()

    @reg.shared("px.{sym}", snapshot=True)
    def px(session: Any, sym: str) -> None: ...

    assert reg.match("px.k@presence") is None and reg.match("px.k@count") is None
    assert reg.match("px.k") is not None

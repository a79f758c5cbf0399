"""``GET {mount}/api/topics/{name}``: what a shared topic holds now, by seq (an extension of
protocol.md section 8b, described in its section 10).

A reader outside the process (the Spark source, ``spark/source.py``) keeps the epoch and the
last seq it has and asks for what follows::

    GET {mount}/api/topics/trades.AAPL?epoch=E&after=S&limit=1000
    200 {"topic": "trades.AAPL", "mode": "ring", "codec": "json", "epoch": E, "head": H,
         "oldest": O, "messages": [{"seq": S+1, "data": ...}, ...], "fill": 0}

``messages`` are the held messages after ``after``, oldest first, at most ``limit`` (fewer
when their payloads pass the API's body limit: a page is never larger than what the API would
take in). JSON payloads are copied into the answer as they are stored, never parsed; text
payloads arrive as strings, bytes payloads as ``data_b64``. An ``epoch`` other than the topic's
means the numbering restarted (server restart, topic recreated) since the reader's ``after``:
it counts as 0, so the reader gets everything held.

What this endpoint does not say is what the reader lost: it cannot know what the reader has.
A ring holds ``oldest .. head``; a reader at ``after`` whose next message ``after + 1`` is below
``oldest`` was overrun and lost ``after + 1 .. oldest - 1`` (of the epoch it asked with, if
the epoch is unchanged; with a changed epoch, whatever followed ``after`` in the old one). It
compares ``oldest`` itself, as a subscriber is told by GAP. A snapshot holds one value (its
``oldest`` is its head): skipped values are conflated, which is not loss. ``after`` at or past
the head answers no messages, which is the cheap way to read ``epoch``, ``head`` and ``oldest``.

A keyed topic (a live table) answers its entries instead of messages: the whole table, or the
changes after ``after``, with ``base`` and ``next`` to page on (keyed.py, ``keyed_answer``).
With several servers it is answered from this server's copy, which follows what Redis holds
(``Broker.follow``), as the rings and snapshots below are.

With several workers sharing their topics through Redis, any worker answers: it follows the
topic (reads its epoch, seq and ring from Redis, then hears every publish) while it is read,
so the answer is the same whichever worker takes the request.

Access is checked as for publishing: a browser page's origin (403), the bearer token (401),
then the ``authorize_api`` hook asked with the topic (403; the hook tells a read by
``request.method == "GET"``; a GET has no body, so the hook is not asked ``"$api"``). Only topics
of shared channels can be read (404 for the rest, private and queue topics included); reading a
topic that does not exist yet creates it empty, as a subscriber would. The ``@presence`` of a
channel with ``presence="count"`` is refused (403), as its subscribers are.
"""

from __future__ import annotations

import base64
import re

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...engine.keyed.topic import KeyedTopic
from ...engine.topics import RING, SharedTopic
from ...errors import BrokerUnavailable, ProtocolError
from ...protocol import COMPRESSED, Codec
from ...protocol.deflate import inflate
from ...protocol.naming import quoted
from ...protocol.wire import read_uv
from .guard import Refusal, answer_headers
from .keyed import keyed_answer
from .publish import HttpApi

MAX_LIMIT = 10_000
"""Messages in one answer at most."""
DEFAULT_LIMIT = 1_000
INFLATE_LIMIT = 1 << 31
"""Bytes an inflated payload may reach. The stored bytes are the server's own, deflated from a
payload it accepted, so this is no defence against a bomb, only a bound above anything real."""

_CODECS = {int(Codec.JSON): b"json", int(Codec.BYTES): b"bytes", int(Codec.TEXT): b"text"}
_DIGITS = re.compile(r"[0-9]{1,20}")
_UV_MAX = (1 << 64) - 1


class TopicApi:
    """The read route beside ``HttpApi``'s: same credentials, same error shape."""

    def __init__(self, api: HttpApi) -> None:
        self.api = api

    def routes(self) -> list[BaseRoute]:
        if not self.api.enabled:
            return []  # the API is off: the path does not exist (404), like publish's
        return [Route("/api/topics/{name:path}", self.read, methods=["GET"])]

    async def read(self, request: Request) -> Response:
        """GET {mount}/api/topics/{name}?after=&epoch=&limit=."""
        api = self.api
        try:
            await api.admit(request, body=False)
            name = request.path_params["name"]
            size, most = len(name.encode()), api.config.limits.max_topic_name
            if size > most:
                raise Refusal(
                    400, f"topic name {quoted(name)} too long ({size} bytes, at most {most})"
                )
            params = request.query_params
            after = _int(params.get("after"), "after", 0, _UV_MAX)
            epoch = _int(params.get("epoch"), "epoch", 0, _UV_MAX)
            limit = _int(params.get("limit"), "limit", 1, MAX_LIMIT)
            base = _int(params.get("base"), "base", 0, _UV_MAX)  # keyed topics' (keyed.py)
            # authorised before the name is looked up: a reader that may not read a topic
            # does not learn whether a channel offers it
            await api.check_authorised(request, [(None, name)], "read")
            found = api.registry.match(name)
            if found is None or not found[0].shared:
                raise Refusal(404, f"no shared channel offers the topic {quoted(name)}")
            if found[0].hidden:  # presence="count": its members are refused to subscribers too
                raise Refusal(403, f"the members of {quoted(name)} are not shown")
            topic = api.engine.topic_of(name, found[0])
            if api.broker.distributed:
                await api.broker.follow(topic)  # what Redis holds, kept while read
        except Refusal as r:
            return api.refusal(r)
        except (ProtocolError, BrokerUnavailable) as exc:  # too many topics; Redis away
            return api.refusal(Refusal(503, str(exc)))
        fill = api.engine.intake.fill
        budget = api.config.limits.api_body
        if isinstance(topic, KeyedTopic):
            body = keyed_answer(
                topic, after or 0, epoch, base or 0, limit or DEFAULT_LIMIT, budget, fill
            )
        else:
            if after is None or (epoch is not None and epoch != topic.epoch):
                after = 0  # none, or the numbering restarted: the seq means nothing in this epoch
            body = answer(topic, after, limit or DEFAULT_LIMIT, budget, fill)
        headers = {**answer_headers(200, fill), "Cache-Control": "no-store"}
        return Response(body, 200, headers, media_type="application/json")


def held(topic: SharedTopic, after: int, limit: int) -> tuple[int, list[bytes]]:
    """The topic's ``oldest`` and its stored PUSH messages with seq > ``after``, oldest first,
    at most ``limit``."""
    head = topic.seq
    if topic.mode == RING:
        oldest = topic.oldest
        first = max(after + 1, oldest)
        last = min(head, first + limit - 1)
        ring, cap = topic.ring, topic.cap
        return oldest, [ring[seq % cap] for seq in range(first, last + 1)]
    # a snapshot holds its latest message only; with none yet its head is 0 and it holds from 1
    return (head or 1), ([topic.msg] if after < head else [])


def answer(topic: SharedTopic, after: int, limit: int, budget: int, fill: int) -> bytes:
    """The JSON body, assembled from bytes: JSON payloads go in as they are stored."""
    oldest, messages = held(topic, after, limit)
    codec = topic.codec
    entries: list[bytes] = []
    size = 0
    for msg in messages:
        seq, payload = _push(msg)
        size += len(payload)
        if entries and size > budget:
            break  # the reader pages on from the last seq it got
        if codec == Codec.JSON:
            # an empty payload (``publish(name, b"")``) is no JSON value: it reads as null
            data = b'"data":' + (payload or b"null")
        elif codec == Codec.TEXT:
            data = b'"data":' + orjson.dumps(payload.decode(errors="replace"))
        else:
            data = b'"data_b64":"' + base64.b64encode(payload) + b'"'
        entries.append(b'{"seq":%d,%s}' % (seq, data))
    head = b'{"topic":%s,"mode":"%s","codec":"%s","epoch":%d,"head":%d,"oldest":%d,"messages":[' % (
        orjson.dumps(topic.name),
        b"ring" if topic.mode == RING else b"snapshot",
        _CODECS.get(codec, b"json"),
        topic.epoch,
        topic.seq,
        oldest,
    )
    return b"".join((head, b",".join(entries), b'],"fill":%d}' % fill))


def _push(msg: bytes) -> tuple[int, bytes]:
    """(seq, payload) of one stored PUSH message (``kind len topic seq payload``), the payload
    inflated when the kind carries the COMPRESSED bit."""
    end = len(msg)
    _length, pos = read_uv(msg, 1, end, "PUSH: length")
    _number, pos = read_uv(msg, pos, end, "PUSH: topic")
    seq, pos = read_uv(msg, pos, end, "PUSH: seq")
    payload = msg[pos:]
    if msg[0] & COMPRESSED:
        payload = inflate(payload, INFLATE_LIMIT)
    return seq, payload


def _int(text: str | None, name: str, least: int, most: int) -> int | None:
    """The query parameter's value (None when absent), or 400 naming it."""
    if text is None:
        return None
    if not _DIGITS.fullmatch(text) or not least <= int(text) <= most:
        raise Refusal(400, f"?{name}= must be an integer from {least} to {most}, got {text[:40]!r}")
    return int(text)

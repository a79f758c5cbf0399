"""The HTTP API for publishers and work producers outside the process (protocol.md section 8b).

``POST {mount}/api/publish`` takes one entry ``{"topic": name, "data": value}`` or a list of
them as JSON, or one entry a line as NDJSON, and hands them to the intake. ``POST
{mount}/api/enqueue`` takes the same shape, each entry with an optional ``"id"`` (the producer's
idempotency key), and adds work items to queue topics. A request is all or nothing: every entry
is checked (shape, topic, codec, size, authorisation) before any is taken, and the intake (or
every queue named) takes the whole request or answers 429. Every answer, errors included,
carries ``Rubris-Fill``, which publishers pace themselves by (ratelimit.py): the intake's fill,
and for ``enqueue`` the fullest queue's fill when that is higher.

The API is off unless the application configures who may use it: a bearer token
(``Rubris(api_token=...)``: 401 without it), an authorisation hook
(``Rubris(authorize_api=f)``, ``f(request, name) -> bool``, may be async: 403 when it says no
or raises ``Reject``), or both (the token first). The hook is asked twice over: with ``"$api"``
before the body is read (may this caller send a body at all? guard.API), then once per topic
the body names. A browser page of another origin is refused (403) before either. Those
checks, the body's limits (size: 413, time: 408) and the shape of every refusal are the API's
guard (guard.py), which ``HttpApi`` is and the other routes of the API use through it.

An entry for a keyed topic (a live table, protocol.md section 5b) carries a ``"key"`` and an
``"op"`` instead of a message: it is checked with the others, against the table as the
request's earlier entries leave it (``max_keys``: 409), and applied by ``apply_changes`` after
the intake took the request's messages, never through the intake (keyed.py says why).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...batches import ItemRef, parse_item
from ...batches.ids import BATCH_ID
from ...batches.service import Batches
from ...cluster import Broker, LocalBroker
from ...config import Config
from ...engine.channels import Channel, Registry
from ...engine.engine import Engine
from ...engine.keyed.topic import KeyedTopic
from ...engine.queues import QueueTopic
from ...engine.topics import trimmed
from ...errors import BatchError, BrokerUnavailable, MessageTooLarge, ProtocolError, TableFull
from ...protocol import Codec, Mode
from ...protocol.naming import quoted
from .guard import _JSON, Guard, OriginAllowed, Refusal, json_body, same_origin
from .guard import AuthorizeApi as AuthorizeApi  # the hook's type, as app/rubris.py names it
from .keyed import KEYED_FIELDS, Change, plan_changes, stage_change

_Item = tuple[QueueTopic, bytes, "str | None", "str | None"]
"""An item ready for ``Engine.offer_items``: queue, payload, id, batch item."""

RETRY_AFTER = 1
"""Seconds a 429 asks a publisher to wait: about how long the cycle needs to make room."""
BROKER_RETRY_AFTER = 1
"""Seconds a 503 asks a publisher to wait while the broker is unreachable (it reconnects by
itself, retrying within a second)."""

_NDJSON = "application/x-ndjson"
_PUBLISH_KEYS = frozenset({"topic", "data", "data_b64"}) | KEYED_FIELDS
_ENQUEUE_KEYS = frozenset({"topic", "data", "data_b64", "id", "batch_item"})
MAX_ID = 256
"""Bytes in an item id at most."""


class HttpApi(Guard):
    """The routes under ``{mount}/api`` and the checks in front of the intake."""

    def __init__(
        self,
        engine: Engine,
        registry: Registry,
        config: Config,
        *,
        token: str | None = None,
        authorize: AuthorizeApi | None = None,
        broker: Broker | None = None,
        batches: Batches | None = None,
        origin_allowed: OriginAllowed = same_origin,
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.config = config
        self._token = token.encode() if token is not None else None
        self._authorize = authorize
        self._origin_allowed = origin_allowed
        """Which browser pages may use the API: the transports' rule (``Rubris(allowed_origins=
        ...)`` besides the page's own origin), given by the app."""
        self.batches = batches
        """Batch tracking, for ``batch_item`` (None: off)."""
        self._batch_lock = asyncio.Lock()
        self.accepting = True
        """False from the start of a graceful shutdown (``stop_accepting``): requests get 503."""
        self.broker: Broker = broker or LocalBroker()
        """Where shared publishes are numbered: 503 while it cannot take them, before the
        intake promises to."""

    def start_accepting(self) -> None:
        """Take requests (the app started)."""
        self.accepting = True

    def stop_accepting(self) -> None:
        """Answer every request 503 from now on (a graceful shutdown began)."""
        self.accepting = False

    def routes(self) -> list[BaseRoute]:
        if not self.enabled:
            return []  # off: the paths do not exist (404)
        return [
            Route("/api/publish", self.publish, methods=["POST"]),
            Route("/api/enqueue", self.enqueue, methods=["POST"]),
        ]

    # the endpoint

    async def publish(self, request: Request) -> Response:
        """POST {mount}/api/publish: messages into the intake, keyed changes applied (all of
        them or none)."""
        try:
            await self.admit(request, body=True)
            if not self.engine.intake.room(1, 0):
                return self._full()  # before the body is read and parsed: a flood costs little
            body = await self.read_body(request)
            entries = self._parse(request.headers.get("content-type", ""), body)
            channels: dict[str, Channel | None] = {}  # per request: a name is matched once
            staged = []
            changes: list[Change] = []
            for index, entry in entries:
                name, ch = self._locate(index, entry, channels, False)
                if ch.mode == Mode.KEYED:
                    changes.append(
                        stage_change(index, entry, name, ch.codec, self.engine, _payload)
                    )
                else:
                    staged.append(self._staged(index, entry, name, ch, False))
            # the hook is asked in entry order, whatever the kind of each entry
            names: list[tuple[int, str]] = [(e[0], e[1]) for e in staged]
            names += [(c.index, c.name) for c in changes]
            await self.check_authorised(request, sorted(names))
            engine = self.engine
            items = [(engine.topic_of(name, ch), payload) for _i, name, ch, payload, *_ in staged]
            for c in changes:
                found = channels[c.name]
                assert found is not None  # staged: its channel was found
                t = engine.topic_of(c.name, found)
                assert isinstance(t, KeyedTopic)  # a keyed channel makes keyed topics
                c.topic = t
                if self.broker.distributed:
                    # the table as every node changes it, so the plan below sees it
                    await self.broker.follow(t)
            plan_changes(changes, engine)
        except Refusal as r:
            return self.refusal(r)
        except (ProtocolError, BrokerUnavailable) as exc:  # too many topics; Redis away
            return self.refusal(Refusal(503, str(exc)))
        down = self.broker.unavailable()
        if down is not None:
            return self._broker_away(down)
        if items and not engine.offer(items):
            return self._full(len(items))
        # after the intake took its part: alone, nothing can refuse the changes now (planned
        # above); with several nodes, Redis decides each where every node's changes meet
        try:
            await self.apply_changes(changes)
        except Refusal as r:
            return self.refusal(r)
        return self._answer({"accepted": len(entries), "duplicates": 0})

    async def apply_changes(self, changes: list[Change]) -> None:
        """Apply a request's keyed changes, checked and planned, in request order: the one
        place where the API changes a live table. Each is O(1) in the engine (the value
        encoded once, its ENTRY messages built once; subscribers get it by the next cycle).

        With a distributed broker each is decided and numbered by it, in order, awaited: a
        set of a new key refused there (other nodes took the last keys since the plan) is a
        409 naming that entry, the entries before it applied (``Refusal``); Redis away: 503
        likewise."""
        engine = self.engine
        if self.broker.distributed:
            for c in changes:
                t = c.topic
                assert t is not None  # found by publish
                if c.op == "set":
                    change = engine.set_change(t, c.key, c.payload)
                elif c.op == "patch":
                    change = engine.patch_change(t, c.key, c.data)
                elif c.op == "delete":
                    change = engine.delete_change(t, c.key)
                else:
                    change = engine.replace_change(t, c.table)
                try:
                    await self.broker.numbered_change(t, change)
                except TableFull as exc:
                    why = f"{exc} (decided where every server's changes meet; the entries "
                    raise Refusal(409, why + "before this one were applied)", c.index) from None
                except BrokerUnavailable as exc:
                    why = f"{exc} (the entries before this one were applied)"
                    raise Refusal(503, why, c.index) from None
            return
        for c in changes:
            t = c.topic
            assert t is not None  # found by publish
            if c.op == "set":
                engine.set_entry(t, c.key, c.payload)
            elif c.op == "patch":
                engine.patch_entry(t, c.key, c.data)
            elif c.op == "delete":
                engine.delete_entry(t, c.key)
            else:
                engine.replace_table(t, c.table)

    async def enqueue(self, request: Request) -> Response:
        """POST {mount}/api/enqueue (``?batch={id}``: the items become one group of that
        batch, see ``_enqueue_in_batch``)."""
        queues: list[QueueTopic] = []
        try:
            await self.admit(request, body=True)
            batch = self._batch_param(request)
            body = await self.read_body(request)
            entries = self._parse(request.headers.get("content-type", ""), body)
            channels: dict[str, Channel | None] = {}
            staged = [self._stage(index, entry, channels, True) for index, entry in entries]
            refs = [(e[0], e[5]) for e in staged if e[5] is not None]
            if batch is not None and refs:
                why = "batch_item: the request's ?batch= numbers the items"
                raise Refusal(400, why, refs[0][0])
            batches: list[tuple[int | None, str]] = [(i, f"batch.{r.batch}") for i, r in refs]
            if batch is not None:
                batches.append((None, f"batch.{batch}"))
            await self.check_authorised(request, [(e[0], e[1]) for e in staged] + batches)
            if refs:
                await self._check_batch_items(refs)
            engine = self.engine
            items = [
                (engine.queue_of(name, ch, self.registry, app=True), payload, item_id, _str(ref))
                for _i, name, ch, payload, item_id, ref in staged
            ]
            queues = list({q.number: q for q, _p, _id, _b in items}.values())
            down = self.broker.unavailable()  # shared queues wait in Redis
            if down is not None:
                return self._broker_away(down)
            if batch is not None:
                return await self._enqueue_in_batch(batch, items, queues)
        except Refusal as r:
            return self.refusal(r, queues)
        except ProtocolError as exc:  # too many topics on this server
            return self.refusal(Refusal(503, str(exc)), queues)
        duplicates = engine.offer_items(items)
        if duplicates is None:
            return self._queues_full(queues)
        return self._answer({"accepted": len(items), "duplicates": len(duplicates)}, queues=queues)

    async def _enqueue_in_batch(
        self, batch: str, items: list[_Item], queues: list[QueueTopic]
    ) -> Response:
        """Add one group to ``batch`` for the items that are not duplicates, and enqueue them
        as its items ``{batch}:{group}:0 …`` in request order, as one step.

        This is what makes a retried producer (a Spark task's second attempt) exact: the items
        its first attempt enqueued are recognised by their ids and tracked by the group made
        then, so the new group counts only items really enqueued now, and the batch completes
        when every item in the queue has ended. The lock keeps two such requests from
        interleaving between the plan and the offer; anything else that enqueues the same ids
        or fills the queue in that moment (the add is one store round trip) is caught after the
        offer: the group's items that were not enqueued end at once (failed when the queue
        turned full and the request answers 429; done when another producer enqueued that id).
        """
        assert self.batches is not None
        engine = self.engine
        async with self._batch_lock:
            plan = engine.plan_items(items)
            if plan is None:
                return self._queues_full(queues)
            count = sum(plan)
            refs: list[str] = []
            group = None
            if count:
                try:
                    added = await self.batches.add(batch, count)
                except BatchError as exc:
                    return self.refusal(Refusal(exc.status, f"batch: {exc.reason}"), queues)
                group = added.group
                refs = added.ids()
            numbered = iter(refs)
            items = [
                (q, payload, item_id, next(numbered) if fresh else None)
                for (q, payload, item_id, _b), fresh in zip(items, plan, strict=True)
            ]
            duplicates = engine.offer_items(items)
            if duplicates is None:
                await self.batches.fail(refs)
                return self._queues_full(queues)
            late = [r for i in duplicates if (r := items[i][3]) is not None]
            if late:
                await self.batches.ack(late)
        return self._answer(
            {
                "accepted": len(items),
                "duplicates": len(duplicates),
                "batch": batch,
                "group": group,
                "count": count - len(late),
            },
            queues=queues,
        )

    def _batch_param(self, request: Request) -> str | None:
        batch = request.query_params.get("batch")
        if batch is None:
            return None
        if self.batches is None:
            raise Refusal(400, "?batch=: batch tracking is off on this server")
        if not BATCH_ID.match(batch):
            raise Refusal(400, f"?batch=: {batch[:80]!r} is not a batch id")
        return batch

    def _queues_full(self, queues: list[QueueTopic]) -> Response:
        full = [q.name for q in queues if not q.room()] or [q.name for q in queues]
        return self._answer(
            {"error": f"queue {full[0]!r} cannot take the request's items now"},
            429,
            {"Retry-After": str(RETRY_AFTER)},
            queues,
        )

    def _broker_away(self, why: str) -> Response:
        return self._answer(
            {"error": f"{why}: nothing of this request was taken"},
            503,
            {"Retry-After": str(BROKER_RETRY_AFTER)},
        )

    def _full(self, n: int | None = None) -> Response:
        what = f"{n} messages" if n is not None else "more messages"
        return self._answer(
            {"error": f"the intake cannot take {what} now"}, 429, {"Retry-After": str(RETRY_AFTER)}
        )

    # checks, in the order a request meets them (the token and the hook: the Guard's)

    @staticmethod
    def _parse(content_type: str, body: bytes) -> list[tuple[int, Any]]:
        """The entries with their indexes: list positions, or NDJSON line numbers."""
        kind = content_type.partition(";")[0].strip().lower()
        if kind == _NDJSON:
            entries: list[tuple[int, Any]] = []
            for i, line in enumerate(body.split(b"\n")):
                if line.strip():
                    try:
                        entries.append((i, orjson.loads(line)))
                    except orjson.JSONDecodeError as exc:
                        raise Refusal(400, f"line {i} is not JSON: {exc}", i) from None
            if not entries:
                raise Refusal(400, "the body holds no entries")
            return entries
        if kind != _JSON:
            raise Refusal(415, f"the body must be {_JSON} or {_NDJSON}, not {kind or 'untyped'}")
        value = json_body(body)
        if isinstance(value, dict):
            return [(0, value)]
        if isinstance(value, list) and value:
            return list(enumerate(value))
        raise Refusal(400, "the body must be an entry or a non-empty list of entries")

    def _stage(
        self, index: int, entry: Any, channels: dict[str, Channel | None], queue: bool
    ) -> tuple[int, str, Channel, bytes, str | None, ItemRef | None]:
        """One entry checked and encoded: (index, topic, channel, payload, item id, batch
        item)."""
        name, ch = self._locate(index, entry, channels, queue)
        return self._staged(index, entry, name, ch, queue)

    def _locate(
        self, index: int, entry: Any, channels: dict[str, Channel | None], queue: bool
    ) -> tuple[str, Channel]:
        """An entry's shape and fields checked, and the channel of its topic found."""
        if not isinstance(entry, dict):
            raise Refusal(400, f"an entry must be an object, got {_json_type(entry)}", index)
        extra = entry.keys() - (_ENQUEUE_KEYS if queue else _PUBLISH_KEYS)
        if extra:
            raise Refusal(400, f"unknown field {quoted(sorted(extra)[0])}", index)
        name = entry.get("topic")
        if not isinstance(name, str) or not name:
            raise Refusal(400, "topic must be a non-empty string", index)
        size, most = len(name.encode()), self.config.limits.max_topic_name
        if size > most:
            why = f"topic name {quoted(name)} too long ({size} bytes, at most {most})"
            raise Refusal(400, why, index)
        if name in channels:
            ch = channels[name]
        else:
            found = self.registry.match(name)
            wanted = found is not None and (
                found[0].mode == Mode.QUEUE if queue else found[0].shared
            )
            ch = channels[name] = found[0] if found is not None and wanted else None
        if ch is None:
            kind = "queue" if queue else "shared"
            raise Refusal(404, f"no {kind} channel offers the topic {quoted(name)}", index)
        if ch.companion:
            # {topic}@presence and @count are the server's account of who subscribes: a
            # publisher's entry there would be a forged member or count
            why = f"{quoted(name)} is written by the server (presence): it cannot be published to"
            raise Refusal(403, why, index)
        return name, ch

    def _staged(
        self, index: int, entry: dict[str, Any], name: str, ch: Channel, queue: bool
    ) -> tuple[int, str, Channel, bytes, str | None, ItemRef | None]:
        """An entry of a topic other than keyed, located, checked and encoded."""
        if not queue and not KEYED_FIELDS.isdisjoint(entry):
            mode = Mode(ch.mode).name.lower()
            why = f'"key" and "op" are for keyed topics; {quoted(name)} is a {mode} topic'
            raise Refusal(400, why, index)
        item_id = entry.get("id")
        if item_id is not None and (
            not isinstance(item_id, str) or not item_id or len(item_id.encode()) > MAX_ID
        ):
            raise Refusal(400, f"id must be a non-empty string of at most {MAX_ID} bytes", index)
        batch_item = entry.get("batch_item")
        ref = None
        if batch_item is not None:
            if self.batches is None:
                raise Refusal(400, "batch_item: batch tracking is off on this server", index)
            try:
                ref = parse_item(batch_item)
            except BatchError as exc:
                raise Refusal(400, f"batch_item: {exc.reason}", index) from None
        payload = _payload(ch.codec, entry, index)
        try:
            if queue:
                self.engine.check_item(len(payload))
            else:
                self.engine.check_payload(len(payload))
        except MessageTooLarge as exc:
            raise Refusal(400, str(exc), index) from None
        return index, name, ch, payload, item_id, ref

    async def _check_batch_items(self, refs: list[tuple[int, ItemRef]]) -> None:
        """Every batch item names an item of a known batch (404 / 400 naming the entry)."""
        assert self.batches is not None
        try:
            await self.batches.check([r for _i, r in refs])
        except BatchError as exc:
            index = next((i for i, r in refs if str(r) == exc.item), None)
            raise Refusal(exc.status, f"batch_item: {exc.reason}", index) from None


def _payload(codec: int, entry: dict[str, Any], index: int) -> bytes:
    """The bytes a topic of ``codec`` stores for ``entry`` (protocol.md section 8b)."""
    if codec == Codec.BYTES:
        if "data" in entry or not isinstance(entry.get("data_b64"), str):
            raise Refusal(400, "a bytes topic takes data_b64, a base64 string", index)
        try:
            return base64.b64decode(entry["data_b64"], validate=True)
        except (binascii.Error, ValueError):
            raise Refusal(400, "data_b64 is not valid base64", index) from None
    if "data_b64" in entry:
        raise Refusal(400, "data_b64 is only for bytes topics; use data", index)
    if "data" not in entry:
        raise Refusal(400, "the entry has no data", index)
    data = entry["data"]
    if codec == Codec.TEXT:
        if not isinstance(data, str):
            raise Refusal(400, f"a text topic takes a string, got {_json_type(data)}", index)
        return data.encode()
    return trimmed(orjson.dumps(data))  # it waits in the intake: at its own size


def _str(ref: ItemRef | None) -> str | None:
    return None if ref is None else str(ref)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)

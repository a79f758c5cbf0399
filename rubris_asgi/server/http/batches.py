"""The HTTP API of batch tracking (protocol.md 8c), beside ``/api/publish`` and ``/api/enqueue``.

::

    POST {mount}/api/batches                 -> 201 {"batch": id, "state": "open"}
                                             ({"batch": id}: that id, 409 if it exists)
    POST {mount}/api/batches/{id}/items      {"count": n} -> {"group": g, "count": n}
    POST {mount}/api/batches/{id}/seal       -> the batch's status
    POST {mount}/api/batches/ack             {"items": [ids]} -> {"batches": {id: status}}
    POST {mount}/api/batches/fail            {"items": [ids]} -> the same, items failed
    GET  {mount}/api/batches/{id}            -> the batch's status

A status is ``{"state", "total", "done", "failed", "completed"}``. Authentication is the rest of
the API's (a browser page's origin, the bearer token, then the ``authorize_api`` hook, asked
with ``batch.{id}`` for each batch a request touches, for an open with the id it is about to
get). Where the batch is in the path, the hook is asked before the body is read; where it is in
the body (an open with a body, ack, fail) the hook is first asked ``"$api"``. Errors change nothing:
400 malformed (naming the item's ``index``), 404 unknown batch, 409 adding to a sealed batch.
Every answer carries ``Rubris-Fill`` like the rest of the API.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...batches.ids import BATCH_ID, ItemRef, new_batch_id, parse_item
from ...batches.service import Batches
from ...errors import BatchError, BatchExists
from ..hardening import may_have_body
from .guard import _JSON, Refusal, answer_headers, json_body
from .publish import HttpApi


class BatchApi:
    """The routes under ``{mount}/api/batches``."""

    def __init__(self, api: HttpApi, batches: Batches) -> None:
        self.api = api
        self.batches = batches

    def routes(self) -> list[BaseRoute]:
        if not self.api.enabled:
            return []
        return [
            Route("/api/batches", self.open, methods=["POST"]),
            Route("/api/batches/ack", self.ack, methods=["POST"]),
            Route("/api/batches/fail", self.fail, methods=["POST"]),
            Route("/api/batches/{batch}", self.status, methods=["GET"]),
            Route("/api/batches/{batch}/items", self.add, methods=["POST"]),
            Route("/api/batches/{batch}/seal", self.seal, methods=["POST"]),
        ]

    # the endpoints

    async def open(self, request: Request) -> Response:
        try:
            # the id, if the producer chose one, is in the body: asked "$api" when one may come
            await self._admit(request, body=may_have_body(request))
            body = await self._object(request, required=False)
            extra = body.keys() - {"batch"}
            if extra:
                raise Refusal(400, f"unknown field {sorted(extra)[0]!r}")
            batch = body.get("batch", None)
            if batch is None:
                batch = new_batch_id()
            elif not isinstance(batch, str) or not BATCH_ID.match(batch):
                raise Refusal(400, "batch must be 1 to 64 letters, digits, - or _")
            await self.api.check_authorised(request, [(None, f"batch.{batch}")], "use")
            opened = await self.batches.open(batch)
        except BatchExists as exc:
            # a producer that chose the id opens it from each of its tasks and retries (the
            # Spark sink): "it exists" is what it asked, an answer, not an error to count
            same = Refusal(exc.status, exc.reason)  # the body every refusal has
            return self._answer({"error": same.error, "index": same.index}, same.status)
        except (Refusal, BatchError) as exc:
            return self._refused(exc)
        return self._answer({"batch": opened, "state": "open"}, 201)

    async def add(self, request: Request) -> Response:
        try:
            batch = await self._batch(request)
            body = await self._object(request)
            extra = body.keys() - {"count"}
            if extra:
                raise Refusal(400, f"unknown field {sorted(extra)[0]!r}")
            count = body.get("count")
            if not isinstance(count, int) or isinstance(count, bool):
                raise Refusal(400, "count must be an integer")
            group = await self.batches.add(batch, count)
        except (Refusal, BatchError) as exc:
            return self._refused(exc)
        return self._answer({"group": group.group, "count": group.count})

    async def seal(self, request: Request) -> Response:
        try:
            batch = await self._batch(request)
            st = await self.batches.seal(batch)
        except (Refusal, BatchError) as exc:
            return self._refused(exc)
        return self._answer(st.to_json())

    async def status(self, request: Request) -> Response:
        try:
            batch = await self._batch(request)
            st = await self.batches.status(batch)
        except (Refusal, BatchError) as exc:
            return self._refused(exc)
        return self._answer(st.to_json())

    async def ack(self, request: Request) -> Response:
        return await self._end(request, failed=False)

    async def fail(self, request: Request) -> Response:
        return await self._end(request, failed=True)

    async def _end(self, request: Request, failed: bool) -> Response:
        refs: list[ItemRef] = []
        try:
            await self._admit(request, body=True)
            body = await self._object(request)
            extra = body.keys() - {"items"}
            if extra:
                raise Refusal(400, f"unknown field {sorted(extra)[0]!r}")
            items = body.get("items")
            if not isinstance(items, list):
                raise Refusal(400, "items must be a list of item ids")
            for i, text in enumerate(items):
                try:
                    refs.append(parse_item(text))
                except BatchError as exc:
                    raise Refusal(400, exc.reason, i) from None
            batches = {r.batch: i for i, r in reversed(list(enumerate(refs)))}
            await self.api.check_authorised(
                request, [(i, f"batch.{b}") for b, i in batches.items()], "use"
            )
            out = await (self.batches.fail(refs) if failed else self.batches.ack(refs))
        except BatchError as exc:
            index = next((i for i, r in enumerate(refs) if str(r) == exc.item), None)
            return self._refused(Refusal(exc.status, exc.reason, index))
        except Refusal as exc:
            return self._refused(exc)
        return self._answer({"batches": {b: st.to_json() for b, st in out.items()}})

    # checks

    async def _admit(self, request: Request, *, body: bool) -> None:
        await self.api.admit(request, body=body)

    async def _batch(self, request: Request) -> str:
        """The batch of the path, authorised before anything of the body is read."""
        await self._admit(request, body=False)
        batch: str = request.path_params["batch"]
        if not BATCH_ID.match(batch):
            raise Refusal(404, f"unknown batch {batch[:80]!r}")
        await self.api.check_authorised(request, [(None, f"batch.{batch}")], "use")
        return batch

    async def _object(self, request: Request, *, required: bool = True) -> dict[str, Any]:
        body = await self.api.read_body(request)
        if not body.strip() and not required:
            return {}
        kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind != _JSON:
            raise Refusal(415, f"the body must be {_JSON}, not {kind or 'untyped'}")
        value = json_body(body)
        if not isinstance(value, dict):
            raise Refusal(400, "the body must be a JSON object")
        return value

    # answers

    def _answer(self, body: dict[str, Any], status: int = 200) -> Response:
        headers = answer_headers(status, self.api.engine.intake.fill)
        return Response(orjson.dumps(body), status, headers, media_type=_JSON)

    def _refused(self, exc: Refusal | BatchError) -> Response:
        if isinstance(exc, BatchError):
            exc = Refusal(exc.status, exc.reason)
        self.api.engine.telemetry.api_refusals[exc.status] += 1
        return self._answer({"error": exc.error, "index": exc.index}, exc.status)

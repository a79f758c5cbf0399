"""Pages of a topic: ``GET {mount}/api/topics/{name}?epoch=&after=&limit=`` (topic_api.py,
protocol.md section 10): what a shared topic holds now, by seq, read over HTTP."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from .source_options import RubrisSourceError, SourceOptions

PAGE = 10_000
"""Messages asked for in one request (the server's maximum; it also bounds an answer's bytes)."""
HEAD_ONLY = (1 << 63) - 1
"""An ``after`` past any head: the answer carries the numbers and no messages."""


def page_limit(after: int, end: int) -> int:
    """The messages to ask for after ``after`` to reach ``end``: a page at most, one at least."""
    return max(1, min(PAGE, end - after))


@dataclass(frozen=True)
class Page:
    """One answer of ``GET {mount}/api/topics/{name}``."""

    topic: str
    mode: str
    codec: str
    epoch: int
    head: int
    oldest: int
    messages: list[dict[str, Any]]

    @property
    def snapshot(self) -> bool:
        return self.mode == "snapshot"

    def first_unread(self) -> int:
        """The seq before the oldest message held: where ``earliest`` starts (0 while the
        topic is empty: its ``oldest`` is 1)."""
        return self.oldest - 1


class TopicClient:
    """Reads topics over the HTTP API; every failure becomes a ``RubrisSourceError`` naming
    the topic and the server's reason or the URL."""

    def __init__(self, opts: SourceOptions) -> None:
        self.url = opts.url
        headers = {"Authorization": f"Bearer {opts.token}"} if opts.token else {}
        # retries: connection attempts only (a refused or reset connect), never a request
        self._http = httpx.Client(
            base_url=opts.url + "/",
            headers=headers,
            timeout=opts.timeout,
            transport=httpx.HTTPTransport(retries=2),
        )

    def page(self, topic: str, after: int, epoch: int | None = None, limit: int = PAGE) -> Page:
        params: dict[str, int] = {"after": after, "limit": limit}
        if epoch is not None:
            params["epoch"] = epoch
        path = "api/topics/" + quote(topic, safe="/")
        try:
            r = self._http.get(path, params=params)
        except httpx.HTTPError as exc:
            raise RubrisSourceError(
                f"cannot reach rubris at {self.url} to read topic {topic!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if r.status_code != 200:
            try:
                reason = orjson.loads(r.content)["error"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                reason = r.text[:200] or r.reason_phrase
            hint = {
                401: " (check the option token)",
                404: " (is it a snapshot or ring topic, and is the HTTP API on?)",
            }.get(r.status_code, "")
            raise RubrisSourceError(
                f"rubris at {self.url} refused to read topic {topic!r}: "
                f"{r.status_code} {reason}{hint}"
            )
        try:
            body = orjson.loads(r.content)
            if isinstance(body, dict) and body.get("mode") == "keyed":
                raise RubrisSourceError(
                    f"topic {topic!r} is a keyed topic (a live table): the rubris source reads "
                    "snapshot and ring topics; read a table with GET api/topics/{name} "
                    "(docs/protocol.md section 10) or subscribe to it"
                )
            return Page(
                topic,
                body["mode"],
                body["codec"],
                body["epoch"],
                body["head"],
                body["oldest"],
                body["messages"],
            )
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise RubrisSourceError(
                f"{self.url} answered a read of topic {topic!r} with something else than "
                "rubris's answer: is the option url the rubris mount URL?"
            ) from None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TopicClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Long-poll requests that succeed stay out of uvicorn's access log (issue 27: one long-poll tab
wrote ~1,500 lines in 15-20 s); refusals, errors and the app's own routes stay in it, and a
summary line a minute says what was left out."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from rubris_asgi.client import Client
from rubris_asgi.server.quiet_log import QuietPolls

from .apps import make_rubris
from .server import run_server
from .wirekit import until


def access(path: str, status: int = 200, method: str = "GET") -> logging.LogRecord:
    """A record as uvicorn's access logger makes it."""
    return logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        0,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", method, path, "1.1", status),
        None,
    )


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def summary() -> Iterator[Captured]:
    handler = Captured()
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_only_the_learned_long_poll_routes_that_succeeded_are_left_out(summary: Captured) -> None:
    now = [0.0]
    quiet = QuietPolls(clock=lambda: now[0], every=60.0)
    quiet.learn("/rubris/lp")
    quiet.learn("/rubris/lp/abc")  # the same prefix
    assert quiet.prefixes == {"/rubris/lp"}
    assert not quiet.filter(access("/rubris/lp/abc?ack=3"))
    assert not quiet.filter(access("/rubris/lp", method="POST"))
    assert not quiet.filter(access("/rubris/lp/abc", 204, "POST"))
    # kept: refusals and errors, other routes, another app's /lp, anything not uvicorn's
    assert quiet.filter(access("/rubris/lp/abc?ack=3", 404))
    assert quiet.filter(access("/rubris/lp", 503, "POST"))
    assert quiet.filter(access("/rubris/ws"))
    assert quiet.filter(access("/other/lp/abc"))
    assert quiet.filter(access("/rubris/lp/abc/more"))
    assert quiet.filter(logging.LogRecord("x", logging.INFO, "", 0, "plain", None, None))
    assert quiet.hidden_total == 3
    # one line at the first, then one a minute with the count
    assert [r.getMessage() for r in summary.records] == [
        "long-poll requests that succeed are left out of the access log (a summary each "
        "minute; Rubris(quiet_polls=False) logs every one)"
    ]
    now[0] = 59.0
    assert not quiet.filter(access("/rubris/lp/abc"))
    assert len(summary.records) == 1
    now[0] = 61.0
    assert not quiet.filter(access("/rubris/lp/abc"))
    assert summary.records[-1].getMessage() == (
        "long-poll: 5 requests answered in the last 61 s (not in the access log; errors are)"
    )
    assert quiet.hidden == 0 and quiet.hidden_total == 5


@pytest.mark.parametrize("quiet", [True, False])
async def test_a_long_poll_client_under_uvicorn_leaves_the_access_log_readable(
    quiet: bool,
) -> None:
    rubris = make_rubris(quiet_polls=quiet)

    async def own(request: object) -> PlainTextResponse:
        return PlainTextResponse("mine")

    app = Starlette(
        routes=[Route("/app/lp", own), Mount("/rubris", rubris)], lifespan=rubris.lifespan
    )
    seen = Captured()
    logger = logging.getLogger("uvicorn.access")
    try:
        async with run_server(app, log_level="info") as base:
            logger.addHandler(seen)  # after uvicorn's dictConfig, which replaces handlers
            async with Client(base + "/rubris", transport="longpoll") as c:
                got: list[object] = []
                await c.subscribe("ring.x", lambda v, *_: got.append(v))
                for i in range(5):
                    rubris.publish("ring.x", i)
                    await until(lambda n=i: len(got) > n)
            async with httpx.AsyncClient(base_url=base) as http:
                assert (await http.get("/app/lp")).text == "mine"
                assert (await http.get("/rubris/lp/nosuchsession")).status_code >= 400
    finally:
        logger.removeHandler(seen)
    lines = [r.getMessage() for r in seen.records]
    polls = [line for line in lines if "/rubris/lp" in line and "nosuchsession" not in line]
    if quiet:
        assert polls == []
    else:
        assert len(polls) >= 6  # the HELLO, a poll per message at least
    assert any('"GET /app/lp HTTP/1.1" 200' in line for line in lines), lines
    assert any("/rubris/lp/nosuchsession" in line for line in lines), lines

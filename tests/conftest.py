"""Fixtures shared by test modules."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.server import serve
from websockets.typing import Subprotocol

from .test_client_unit import FakeServer


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    """A fake rubris server on 127.0.0.1 that the client unit tests script frame by frame."""
    fake = FakeServer()
    async with serve(
        fake.handler,
        "127.0.0.1",
        0,
        subprotocols=[Subprotocol("rubris.v1")],
        compression=None,
    ) as srv:
        fake.port = srv.sockets[0].getsockname()[1]
        yield fake
